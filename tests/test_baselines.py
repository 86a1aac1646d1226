"""Baselines, few-shot device split and interval coverage on data whose right answers are known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfzoo.evaluate import metrics_table, with_intervals
from perfzoo.fitting import fit_split
from perfzoo.regressors.baselines import baseline_predictions
from perfzoo.dataset.splits import make_split, split_notes
from perfzoo.stats import conformal_halfwidth

#: device -> (peak GFLOP/s, bandwidth GB/s)
DEVICES = {"slow": (50e3, 500.0), "mid": (100e3, 1000.0), "fast": (400e3, 1200.0)}


def panel(time_of) -> pd.DataFrame:
    """Eight workloads on three devices; latency from ``time_of(flops, peak, bandwidth)``."""
    rows = []
    for i in range(8):
        flops = 1e9 * 2 ** i
        for device, (peak, bw) in DEVICES.items():
            rows.append({"row_id": f"{device}-{i}", "model_id": f"m{i}", "mode": "infer", "device": device,
                         "family": f"f{i % 2}", "batch": 8, "label": f"m{i}", "flops": flops,
                         "weight_bytes": 1e6 * (i + 1), "activation_bytes": 4e6 * (i + 1),
                         "hw_peak_gflops": peak, "hw_mem_bw_gbs": bw,
                         "latency_ms": time_of(flops, peak, bw)})
    return pd.DataFrame(rows)


def lodo_mape(data: pd.DataFrame) -> pd.Series:
    split = make_split("leave_one_device_out", data, {})
    preds = baseline_predictions(data, split, "latency_ms")
    noise = pd.DataFrame({"target": ["latency_ms"], "noise_mape": [0.01]})
    table = metrics_table(preds, noise)
    return table.set_index("regressor")["mape"]


def test_peak_baseline_is_exact_when_time_is_flops_over_peak() -> None:
    scores = lodo_mape(panel(lambda f, p, b: f / (p * 1e9) * 1e3))
    assert scores["baseline:device_peak"] == pytest.approx(0.0, abs=1e-12)
    assert scores["baseline:device_bandwidth"] > 0.1


def test_bandwidth_baseline_is_exact_when_time_is_bytes_over_bandwidth() -> None:
    scores = lodo_mape(panel(lambda f, p, b: f / 100 / (b * 1e9) * 1e3))
    assert scores["baseline:device_bandwidth"] == pytest.approx(0.0, abs=1e-12)
    assert scores["baseline:device_peak"] > 0.1


def test_flops_baseline_is_exact_when_time_is_proportional_to_flops_on_one_device() -> None:
    data = panel(lambda f, p, b: 3e-9 * f)
    split = make_split("random", data, {"random_fractions": [0.6, 0.0, 0.4]})
    preds = baseline_predictions(data, split, "latency_ms")
    nearest = preds[preds["regressor"] == "baseline:flops_nearest"]
    assert len(nearest) > 0
    np.testing.assert_allclose(nearest["y_pred"], nearest["y_true"], rtol=1e-12)


def test_a_model_that_loses_to_a_baseline_is_shown_as_not_beating_it() -> None:
    data = panel(lambda f, p, b: f / (p * 1e9) * 1e3)
    split = make_split("leave_one_device_out", data, {})
    preds = baseline_predictions(data, split, "latency_ms")
    model = preds[preds["regressor"] == "baseline:device_peak"].assign(regressor="model")
    model["y_pred"] = model["y_true"] * 1.2
    table = metrics_table(pd.concat([preds, model]), pd.DataFrame({"target": ["latency_ms"], "noise_mape": [0.0]}))
    row = table.set_index("regressor").loc["model"]
    assert row["best_baseline"] == "baseline:device_peak"
    assert not row["beats_baseline"]
    assert pd.isna(table.set_index("regressor").loc["baseline:device_peak", "beats_baseline"])


def test_device_factor_baseline_recovers_a_constant_factor_from_few_shot_rows() -> None:
    # "fast" is exactly 2.5x faster than "mid" on every workload; peak says 4x
    data = panel(lambda f, p, b: f * 1e-9 / {50e3: 0.5, 100e3: 1.0, 400e3: 2.5}[p])
    split = make_split("few_shot_device", data, {"few_shot_k": 3})
    preds = baseline_predictions(data, split, "latency_ms")
    fast = preds[(preds["regressor"] == "baseline:device_factor") & preds["fold"].str.startswith("fast")]
    np.testing.assert_allclose(fast["y_pred"], fast["y_true"], rtol=1e-9)


def test_few_shot_split_moves_k_rows_of_the_held_out_device_to_training() -> None:
    data = panel(lambda f, p, b: 1.0)
    split = make_split("few_shot_device", data, {"few_shot_k": 3, "few_shot_draws": 2})
    assert sorted(split["fold"].unique()) == sorted(f"{d}/k3/d{i}" for d in DEVICES for i in range(2))
    devices = data.set_index("row_id")["device"]
    for fold, rows in split.groupby("fold"):
        held = fold.split("/")[0]
        own = rows[rows["row_id"].map(devices) == held]
        assert (own["set"] == "train").sum() == 3 and (own["set"] == "test").sum() == 5
        assert (rows[rows["row_id"].map(devices) != held]["set"] == "train").all()
    draws = split.groupby("fold").apply(lambda r: frozenset(r.loc[r["set"] == "train", "row_id"]))
    assert draws["mid/k3/d0"] != draws["mid/k3/d1"]


def test_few_shot_split_with_k_above_a_device_size_says_why() -> None:
    data = panel(lambda f, p, b: 1.0)
    assert make_split("few_shot_device", data, {"few_shot_k": 8}).empty
    assert "leaves no test rows" in split_notes("few_shot_device", data, {"few_shot_k": 8})[0]


def test_device_group_holds_out_both_software_versions_of_a_gpu() -> None:
    data = panel(lambda f, p, b: 1.0)
    data["gpu"] = data["device"].replace({"fast": "mid"})
    split = make_split("leave_one_device_out", data, {"device_group": "gpu"})
    assert sorted(split["fold"].unique()) == ["mid", "slow"]
    test_devices = set(data.set_index("row_id").loc[split[(split["fold"] == "mid") & (split["set"] == "test")]["row_id"], "device"])
    assert test_devices == {"mid", "fast"}


def test_conformal_intervals_of_the_evaluate_stage_cover_ninety_percent_of_fitted_test_rows() -> None:
    rng = np.random.default_rng(3)
    n = 3000
    x = rng.uniform(1, 10, n)
    data = pd.DataFrame({"row_id": [f"r{i}" for i in range(n)], "model_id": [f"m{i}" for i in range(n)],
                         "device": "d", "mode": "infer", "batch": 1, "family": "f", "label": "l", "flops": x,
                         "latency_ms": 2 * x * np.exp(rng.normal(0, 0.2, n))})
    split = make_split("random", data, {"random_fractions": [0.5, 0.25, 0.25]})
    preds, _, _ = fit_split(data, split, "latency_ms", "linear", {"log_target": True})
    assert preds[["y_lo", "y_hi"]].isna().all().all()  # the fit stage writes only a regressor's own intervals
    preds = with_intervals(preds)
    table = metrics_table(preds, pd.DataFrame({"target": ["latency_ms"], "noise_mape": [0.0]}))
    test = preds[preds["set"] == "test"]
    inside = ((test["y_true"] >= test["y_lo"]) & (test["y_true"] <= test["y_hi"])).mean()
    assert 0.87 <= inside <= 0.93  # 750 test rows: binomial sd 1.1 %
    half = np.log(test["y_hi"] / test["y_pred"]).iloc[0]
    assert half == pytest.approx(1.645 * 0.2, rel=0.1)
    assert table.iloc[0]["coverage90"] == pytest.approx(inside)  # reported without baselines in the table too


def test_conformal_halfwidth_rank() -> None:
    assert conformal_halfwidth(np.arange(1.0, 20.0), 0.9) == 18.0  # ceil(20 * 0.9) = 18th smallest


def test_device_transfer_runs_in_the_fit_stage_with_intervals_and_is_compared_with_baselines() -> None:
    # time follows peak for large workloads and bandwidth for small ones: no single-ratio baseline is exact
    data = panel(lambda f, p, b: (f / (p * 1e9) + 4e8 / (b * 1e9)) * 1e3)
    split = make_split("leave_one_device_out", data, {})
    preds, models, notes = fit_split(data, split, "latency_ms", "device_transfer", {"few_shot_max_rows": 0})
    assert not notes["skipped_folds"] and set(models) == set(DEVICES)
    assert preds[["y_lo", "y_hi"]].notna().all().all()
    scored = pd.concat([preds, baseline_predictions(data, split, "latency_ms")], ignore_index=True)
    table = metrics_table(scored, pd.DataFrame({"target": ["latency_ms"], "noise_mape": [0.0]}))
    row = table.set_index("regressor").loc["device_transfer"]
    assert row["n_interval"] == len(data)
    assert row["beats_baseline"] == (row["mape"] < row["best_baseline_mape"])
    assert 0 <= row["coverage90"] <= 1
