"""Device-transfer regressor: exact recovery on constructed data, conformal coverage, few-shot, persistence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfzoo.io import InputError
from perfzoo.prediction import Predictor
from perfzoo.regressors import load_regressor, make_regressor, regressor_from_document, save_regressor
from perfzoo.regressors.transfer import DeviceTransferRegressor
from perfzoo.stats import conformal_halfwidth

FIXTURES = Path(__file__).parent / "fixtures" / "timm"
#: (peak FP16 tensor GFLOP/s, bandwidth GB/s) of four made-up devices with distinct balance points
DEVICES = {"A": (70e3, 900.0), "B": (160e3, 1000.0), "C": (210e3, 1800.0), "D": (400e3, 1700.0)}


def roofline_panel(n_workloads: int = 60, noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """log t = u(w) - s(w) log P - (1 - s(w)) log B with s linear in log intensity: the model's own form."""
    rng = np.random.default_rng(seed)
    flops = np.exp(rng.uniform(np.log(1e8), np.log(1e11), n_workloads))
    act = np.exp(rng.uniform(np.log(1e6), np.log(1e9), n_workloads))
    weight = np.exp(rng.uniform(np.log(1e6), np.log(1e9), n_workloads))
    s = 0.5 + 0.1 * (np.log(flops / act) - np.log(flops / act).mean())
    rows = []
    for name, (peak, bw) in DEVICES.items():
        log_t = np.log(flops) - s * np.log(peak) - (1 - s) * np.log(bw) - 5 + rng.normal(0, noise, n_workloads)
        rows.append(pd.DataFrame({"model_id": [f"w{i}" for i in range(n_workloads)], "device": name,
                                  "flops": flops, "activation_bytes": act, "weight_bytes": weight,
                                  "hw_peak_gflops": peak, "hw_mem_bw_gbs": bw, "batch": 256.0,
                                  "latency_ms": np.exp(log_t)}))
    return pd.concat(rows, ignore_index=True)


def held_out(data: pd.DataFrame, device: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    return data[data["device"] != device], data[data["device"] == device]


def test_unseen_device_is_recovered_exactly_when_the_data_follow_the_model() -> None:
    train, test = held_out(roofline_panel(), "D")
    reg = DeviceTransferRegressor(alpha=1e-8).fit(train, train["latency_ms"])
    rel = np.abs(reg.predict(test) / test["latency_ms"].to_numpy() - 1)
    assert rel.max() < 1e-4


def with_operator_share(data: pd.DataFrame, seed: int = 1) -> pd.DataFrame:
    """The panel's times with the compute share ``s(w)`` following a feature that is zero for half the
    workloads (like an operator kind a model lacks): ``s = 0.3 + 0.02 log1p(x)``."""
    rng = np.random.default_rng(seed)
    ids = data["model_id"].unique()
    x = np.where(np.arange(len(ids)) % 2 == 0, 0.0, np.exp(rng.uniform(np.log(1e6), np.log(1e9), len(ids))))
    x_of = pd.Series(x, index=ids)
    s = 0.3 + 0.02 * np.log1p(data["model_id"].map(x_of).to_numpy())
    log_peak, log_bw = np.log(data["hw_peak_gflops"]), np.log(data["hw_mem_bw_gbs"])
    log_t = np.log(data["flops"]) - s * log_peak - (1 - s) * log_bw - 5
    return data.assign(op_attention_flops=data["model_id"].map(x_of), latency_ms=np.exp(log_t))


def test_a_feature_that_may_be_zero_enters_the_hardware_interactions() -> None:
    train, test = held_out(with_operator_share(roofline_panel()), "D")
    errors = {}
    for extra in [(), ("op_attention_flops",)]:
        reg = DeviceTransferRegressor(alpha=1e-8, interaction_features=extra).fit(train, train["latency_ms"])
        errors[extra] = np.abs(reg.predict(test) / test["latency_ms"].to_numpy() - 1).max()
    assert errors[("op_attention_flops",)] < 1e-4 < 0.05 < errors[()]


def test_a_missing_interaction_feature_value_is_an_error_naming_the_column() -> None:
    data = with_operator_share(roofline_panel(n_workloads=10))
    data.loc[3, "op_attention_flops"] = np.nan
    with pytest.raises(InputError, match="'op_attention_flops'"):
        DeviceTransferRegressor(interaction_features=["op_attention_flops"]).fit(data, data["latency_ms"])


def test_one_constant_factor_cannot_do_what_the_interactions_do() -> None:
    """Sanity check of the constructed data: the device ratio really depends on the workload."""
    data = roofline_panel()
    c, d = data[data["device"] == "C"]["latency_ms"].to_numpy(), data[data["device"] == "D"]["latency_ms"].to_numpy()
    factor = np.exp(np.mean(np.log(d / c)))
    assert np.mean(np.abs(c * factor / d - 1)) > 0.02


def test_conformal_halfwidth_is_the_finite_sample_quantile() -> None:
    residuals = np.arange(1.0, 10.0)  # n = 9
    assert conformal_halfwidth(residuals, 0.9) == 9.0  # ceil(10 * 0.9) = 9th smallest
    assert conformal_halfwidth(residuals, 0.5) == 5.0  # ceil(10 * 0.5) = 5th
    assert conformal_halfwidth(residuals[:3], 0.9) == np.inf  # too few residuals for 90 %


def test_intervals_cover_about_ninety_percent_of_an_unseen_device() -> None:
    sigma = 0.1
    train, test = held_out(roofline_panel(n_workloads=400, noise=sigma, seed=1), "B")
    reg = DeviceTransferRegressor(alpha=1e-6).fit(train, train["latency_ms"])
    lo, hi = reg.predict_interval(test)
    y = test["latency_ms"].to_numpy()
    coverage = np.mean((y >= lo) & (y <= hi))
    # residuals of a new device: its own noise plus the noise in the workload effects (3 devices)
    expected = 1.645 * sigma * np.sqrt(1 + 1 / 3)
    assert abs(reg.interval_halfwidth_ - expected) / expected < 0.15
    assert 0.85 <= coverage <= 0.95


def test_an_unseen_device_beyond_the_profiled_hardware_has_its_interval_widened_by_the_factor_outside() -> None:
    data = roofline_panel(n_workloads=100, noise=0.05, seed=2)
    train, test = held_out(data, "D")  # D: peak 400e3, beyond the others' 70e3-210e3; bandwidth inside
    reg = DeviceTransferRegressor().fit(train, train["latency_ms"])
    lo, hi = reg.predict_interval(test)
    pred = reg.predict(test)
    beyond = DEVICES["D"][0] / max(peak for name, (peak, _) in DEVICES.items() if name != "D")
    np.testing.assert_allclose(hi / pred, np.exp(reg.interval_halfwidth_) * beyond)
    np.testing.assert_allclose(pred / lo, np.exp(reg.interval_halfwidth_) * beyond)
    inside_train, inside = held_out(data, "B")  # B lies inside A, C, D's range: the calibrated width alone
    inner = DeviceTransferRegressor().fit(inside_train, inside_train["latency_ms"])
    lo, hi = inner.predict_interval(inside)
    np.testing.assert_allclose(hi / inner.predict(inside), np.exp(inner.interval_halfwidth_))
    shots = pd.concat([train, test.iloc[:5]])  # with its own rows the device is calibrated, not widened
    few = DeviceTransferRegressor().fit(shots, shots["latency_ms"])
    lo, hi = few.predict_interval(test.iloc[5:])
    assert np.allclose(hi / few.predict(test.iloc[5:]), np.exp(few.interval_halfwidth_))


def test_each_device_is_calibrated_for_its_own_number_of_shots_whatever_else_is_partly_profiled() -> None:
    data = roofline_panel(n_workloads=120, noise=0.1, seed=3)
    full = data[data["device"].isin(["A", "B"])]
    c_rows, d_rows = data[data["device"] == "C"], data[data["device"] == "D"]

    def fitted(*parts: pd.DataFrame) -> DeviceTransferRegressor:
        train = pd.concat([full, *parts])
        return DeviceTransferRegressor().fit(train, train["latency_ms"])

    mixed = fitted(c_rows.iloc[:5], d_rows.iloc[:20])  # two partly profiled devices: k = 5 and k = 20
    assert [(c["shots"], c["devices"]) for c in mixed.calibrations_] == [(0, []), (5, ["C"]), (20, ["D"])]
    for alone, rows in ((fitted(c_rows.iloc[:5]), c_rows.iloc[5:]), (fitted(d_rows.iloc[:20]), d_rows.iloc[20:])):
        np.testing.assert_allclose(mixed.predict_interval(rows), alone.predict_interval(rows))
    unseen = fitted(c_rows.iloc[:20])  # D not in training: the k = 0 calibration, as without any shots
    np.testing.assert_allclose(unseen.predict_interval(d_rows), fitted().predict_interval(d_rows))
    assert unseen.calibrations_[0]["halfwidth"] == fitted().interval_halfwidth_


def test_few_shot_rows_calibrate_a_device_offset_that_hardware_cannot_explain() -> None:
    data = roofline_panel(n_workloads=200)
    slow = data["device"] == "D"
    data.loc[slow, "latency_ms"] *= 1.3  # e.g. a power-capped card: 30 % slower than its specs say
    train, test = held_out(data, "D")
    k0 = DeviceTransferRegressor(alpha=1e-6).fit(train, train["latency_ms"])
    shots = test.iloc[:20]
    train20 = pd.concat([train, shots])
    k20 = DeviceTransferRegressor(alpha=1e-6).fit(train20, train20["latency_ms"])
    rest = test.iloc[20:]
    err = {name: np.mean(np.abs(r.predict(rest) / rest["latency_ms"].to_numpy() - 1)) for name, r in
           (("k0", k0), ("k20", k20))}
    assert err["k0"] == pytest.approx(1 - 1 / 1.3, rel=1e-3)
    assert err["k20"] < 0.01


def test_save_and_load_round_trip_without_pickle(tmp_path: Path) -> None:
    train, test = held_out(with_operator_share(roofline_panel()), "A")
    reg = make_regressor("device_transfer", alpha=0.5, interaction_features=["op_attention_flops"])
    reg.fit(train, train["latency_ms"])
    path = tmp_path / "transfer.json"
    save_regressor(reg, path)
    assert json.loads(path.read_text())["kind"] == "device_transfer"
    loaded = load_regressor(path)
    np.testing.assert_array_equal(loaded.predict(test), reg.predict(test))
    np.testing.assert_array_equal(loaded.predict_interval(test)[1], reg.predict_interval(test)[1])


def without_interaction_state(reg: DeviceTransferRegressor) -> dict:
    """The saved document of ``reg`` as written before the interaction features' standardisation was kept."""
    doc = reg.to_document()
    for name in ("x_mean_", "x_scale_"):
        del doc["state"][name]
    return doc


def test_a_document_without_the_interaction_state_loads_only_when_it_uses_no_interaction_feature() -> None:
    train, test = held_out(with_operator_share(roofline_panel()), "A")
    plain = DeviceTransferRegressor(alpha=0.5).fit(train, train["latency_ms"])
    loaded = regressor_from_document(without_interaction_state(plain), "old.json")
    np.testing.assert_array_equal(loaded.predict(test), plain.predict(test))
    for name in ("x_mean_", "x_scale_"):  # what the fit gives, so a save of the loaded one is the same file
        assert getattr(loaded, name).dtype == getattr(plain, name).dtype
        assert getattr(loaded, name).shape == getattr(plain, name).shape == (0,)
    assert loaded.to_document()["state"] == plain.to_document()["state"]
    with_ops = DeviceTransferRegressor(alpha=0.5, interaction_features=["op_attention_flops"])
    with_ops.fit(train, train["latency_ms"])
    with pytest.raises(InputError, match=r"^old\.json: 'device_transfer' regressor without fitted x_mean_, "
                                         r"x_scale_ \(written by another perfzoo version\?\)"):
        regressor_from_document(without_interaction_state(with_ops), "old.json")


def test_a_non_positive_feature_is_an_error_naming_the_column() -> None:
    data = roofline_panel(n_workloads=10)
    data.loc[3, "flops"] = 0.0
    with pytest.raises(InputError, match="'flops'"):
        DeviceTransferRegressor().fit(data, data["latency_ms"])


def timm_rows() -> pd.DataFrame:
    """The fixture subset of timm's AMP inference benchmark, one row per (file, model, image size)."""
    specs = {"rtx3090": (71e3, 936.0), "rtx4090": (165.2e3, 1008.0), "4090": (165.2e3, 1008.0),
             "5090": (209.5e3, 1792.0), "pro6000maxq": (438.9e3, 1792.0)}
    frames = []
    for path in sorted(FIXTURES.glob("transfer_benchmark-infer-amp-*.csv")):
        parts = path.stem.split("-")
        df = pd.read_csv(path)
        peak, bw = specs[parts[-1]]
        frames.append(pd.DataFrame({
            "model_id": df["model"] + "@" + df["infer_img_size"].astype(str), "gpu": parts[-1].replace("rtx", ""),
            "device": f"{parts[-1]}-{parts[4]}", "batch": df["infer_batch_size"].astype(float),
            "flops": 2e9 * df["infer_gmacs"], "activation_bytes": 2e6 * df["infer_macts"],
            "weight_bytes": 2e6 * df["param_count"], "hw_peak_gflops": peak, "hw_mem_bw_gbs": bw,
            "latency_ms": df["infer_step_time"] / df["infer_batch_size"]}))
    return pd.concat(frames, ignore_index=True).drop_duplicates(["device", "model_id"])


def test_real_timm_subset_few_shot_beats_zero_shot_on_a_held_out_gpu() -> None:
    data = timm_rows()
    assert data["device"].nunique() == 5 and len(data) > 500
    held = data["gpu"] == "3090"
    train, test = data[~held], data[held]
    zero = DeviceTransferRegressor().fit(train, train["latency_ms"])
    shots = test.sample(20, random_state=0)
    rest = test.drop(shots.index)
    train20 = pd.concat([train, shots])
    few = DeviceTransferRegressor().fit(train20, train20["latency_ms"])
    y = rest["latency_ms"].to_numpy()
    mape0 = np.mean(np.abs(zero.predict(rest) / y - 1))
    mape20 = np.mean(np.abs(few.predict(rest) / y - 1))
    assert np.isfinite(zero.interval_halfwidth_) and np.isfinite(few.interval_halfwidth_)
    assert mape20 < mape0
    assert mape20 < 0.15


def test_predict_prints_the_conformal_interval_of_a_device_transfer_predictor() -> None:
    train, test = held_out(roofline_panel(noise=0.05), "A")
    reg = DeviceTransferRegressor(alpha=0.5).fit(train, train["latency_ms"])
    predictor = Predictor("latency_ms", "device_transfer", "leave_one_device_out", Path("unused"),
                          {"0": reg}, {}, None, None)
    point, lo, hi, method = predictor.predict(test)
    expected_lo, expected_hi = reg.predict_interval(test)
    np.testing.assert_allclose(lo, expected_lo)
    np.testing.assert_allclose(hi, expected_hi)
    assert "conformal" in method


def mixed_device_panel(n_workloads: int = 120) -> pd.DataFrame:
    """Roofline devices A-D plus E, whose time is 1.2 x the geometric mean of A's and C's times x
    (FLOPs / mean FLOPs)^0.05: a device its spec sheet does not describe, but the other devices do."""
    data = roofline_panel(n_workloads=n_workloads)
    a = data[data["device"] == "A"].reset_index(drop=True)
    c = data[data["device"] == "C"].reset_index(drop=True)
    e = a.assign(device="E", hw_peak_gflops=500e3, hw_mem_bw_gbs=800.0)
    log_flops = np.log(a["flops"])
    e["latency_ms"] = 1.2 * np.sqrt(a["latency_ms"] * c["latency_ms"]) * np.exp(0.05 * (log_flops - log_flops.mean()))
    return pd.concat([data, e], ignore_index=True)


def few_shot_split(data: pd.DataFrame, device: str, k: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    train, test = held_out(data, device)
    shots = test.sample(k, random_state=0)
    return pd.concat([train, shots]), test.drop(shots.index)


def test_reference_regression_recovers_a_device_the_other_devices_span_from_twenty_shots() -> None:
    train, test = few_shot_split(mixed_device_panel(), "E", 20)
    y = test["latency_ms"].to_numpy()
    err = {}
    for name, weight in (("roofline", 0.0), ("reference", 1.0)):
        reg = DeviceTransferRegressor(alpha=1e-6, reference_weight=weight).fit(train, train["latency_ms"])
        err[name] = np.mean(np.abs(reg.predict(test) / y - 1))
    assert err["reference"] < 0.005
    assert err["roofline"] > 5 * err["reference"]


def test_a_workload_missing_on_one_reference_device_is_predicted_from_the_others() -> None:
    train, test = few_shot_split(mixed_device_panel(), "E", 20)
    missing = test["model_id"].iloc[0]
    train = train[~((train["device"] == "B") & (train["model_id"] == missing))]
    reg = DeviceTransferRegressor(alpha=1e-6, reference_weight=1.0).fit(train, train["latency_ms"])
    assert any(len(m["refs"]) == 3 for m in reg.reference_models_)  # the model without device B
    row = test.iloc[:1]
    assert abs(reg.predict(row)[0] / row["latency_ms"].iloc[0] - 1) < 0.01


def test_few_shot_reference_models_survive_save_and_load(tmp_path: Path) -> None:
    train, test = few_shot_split(mixed_device_panel(), "E", 20)
    reg = DeviceTransferRegressor(alpha=1e-6).fit(train, train["latency_ms"])
    assert reg.reference_models_
    path = tmp_path / "transfer.json"
    save_regressor(reg, path)
    np.testing.assert_array_equal(load_regressor(path).predict(test), reg.predict(test))


def test_a_device_the_other_devices_explain_badly_gets_wider_intervals_from_its_shots() -> None:
    data = mixed_device_panel(n_workloads=200)
    noisy = data.copy()
    e = noisy["device"] == "E"
    noisy.loc[e, "latency_ms"] *= np.exp(np.random.default_rng(3).normal(0, 0.2, int(e.sum())))
    widths = {}
    for name, panel in (("clean", data), ("noisy", noisy)):
        train, test = few_shot_split(panel, "E", 20)
        reg = DeviceTransferRegressor(alpha=1e-6).fit(train, train["latency_ms"])
        lo, hi = reg.predict_interval(test)
        widths[name] = float(np.median(np.log(hi / lo)))
    assert widths["noisy"] > 3 * widths["clean"]


def test_the_blend_weight_follows_what_predicts_the_training_devices_best() -> None:
    """Exact roofline devices: the roofline model alone (w = 0). Devices that share a workload factor
    the features miss (time x exp(v_d g(w))): reference regression alone (w = 1), for the new device too."""
    exact = roofline_panel(n_workloads=150)
    shared = exact.copy()
    rng = np.random.default_rng(5)
    factor = dict(zip([f"w{i}" for i in range(150)], rng.normal(0, 0.3, 150)))
    loading = {"A": -1.0, "B": 0.3, "C": 1.0, "D": -0.5}
    shared["latency_ms"] *= np.exp(shared["device"].map(loading) * shared["model_id"].map(factor))
    chosen = {}
    for name, panel in (("exact", exact), ("shared", shared)):
        train, test = few_shot_split(panel, "D", 20)
        reg = DeviceTransferRegressor(alpha=1e-6).fit(train, train["latency_ms"])
        chosen[name] = reg.reference_weight_
        if name == "shared":
            assert np.mean(np.abs(reg.predict(test) / test["latency_ms"].to_numpy() - 1)) < 0.01
    assert chosen == {"exact": 0.0, "shared": 1.0}
    fixed = DeviceTransferRegressor(reference_weight=0.3).fit(train, train["latency_ms"])
    assert fixed.reference_weight_ == 0.3
