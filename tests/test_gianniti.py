"""Gianniti per-layer models: coefficient fit, the gianniti_layer regressor, and per-layer CPU timing."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfzoo.features.meta import LAYER_COLUMNS, featurise
from perfzoo.io import InputError
from perfzoo.profiling.layers import LAYER_TIMING_COLUMNS, measure_layers_on_cpu, select_layer_configs
from perfzoo.profiling.runner import profile_layer_configs
from perfzoo.regressors import REGISTRY, load_regressor, save_regressor
from perfzoo.regressors.gianniti import (
    GiannitiLayerRegressor,
    coefficient_table,
    fit_layer_coefficients,
    load_layer_timings,
    with_occurrence,
)

# category -> (β0_fw, β1_fw, β0_bw, β1_bw), the order of magnitude of Gianniti et al.'s coefficients
TRUE_BETAS = {
    "conv_fc": (0.18, 3.4e-7, 0.31, 3.6e-7),
    "norm": (0.016, 7.1e-6, 0.10, 6.9e-6),
    "pool_s1": (0.022, 1.3e-5, 0.15, 1.9e-5),
    "pool_s2": (0.014, 1.4e-5, 0.006, 5.7e-5),
    "relu_drop": (0.009, 1.2e-5, 0.012, 1.3e-5),
    "loss": (0.05, 2e-6, 0.03, 1e-6),
    "other": (0.004, 0.0, 0.002, 0.0),
}
TYPES = {
    "conv_fc": "Conv2d",
    "norm": "BatchNorm2d",
    "pool_s1": "MaxPool2d",
    "pool_s2": "MaxPool2d",
    "relu_drop": "ReLU",
    "loss": "Loss",
    "other": "Flatten",
}


def synthetic_tables(n_models: int = 6, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(features layer table, measured layer timings) where every time follows TRUE_BETAS exactly."""
    rng = np.random.default_rng(seed)
    features, timings = [], []
    for m in range(n_models):
        model_id = f"m{m}"
        sequence = [
            "conv_fc",
            "norm",
            "relu_drop",
            "pool_s2",
            "conv_fc",
            "relu_drop",
            "pool_s1",
            "other",
            "conv_fc",
        ]
        sequence = sequence + list(rng.choice(sequence, size=4))
        for mode in ("inference", "training"):
            for batch in (1, 8):
                calls = sequence + (["loss"] if mode == "training" else [])
                for idx, cat in enumerate(calls):
                    # names reuse "act" for every ReLU, so occurrences matter
                    name = "act" if cat == "relu_drop" else ("loss" if cat == "loss" else f"layer{idx}")
                    c_fw = 0 if cat == "other" else int(rng.integers(1_000, 5_000_000)) * batch
                    c_bw = 0 if cat == "other" else int(c_fw * rng.uniform(1.0, 2.5))
                    features.append(
                        {
                            "model_id": model_id,
                            "mode": mode,
                            "batch": batch,
                            "layer_idx": idx,
                            "name": name,
                            "type": TYPES[cat],
                            "category": "other" if cat == "loss" else cat,
                            "c_fw": c_fw,
                            "c_bw": c_bw,
                            "out_bytes": 4,
                            "flops": 0.0,
                        }
                    )
                    b0f, b1f, b0b, b1b = TRUE_BETAS[cat]
                    timings.append(
                        {
                            "model_id": model_id,
                            "mode": mode,
                            "batch": batch,
                            "name": name,
                            "type": TYPES[cat],
                            "fw_ms": b0f + b1f * c_fw,
                            "bw_ms": b0b + b1b * c_bw if mode == "training" else math.nan,
                            "status": "ok",
                            "message": "",
                        }
                    )
    feats = pd.DataFrame(features, columns=LAYER_COLUMNS)
    times = pd.DataFrame(timings)
    times["occurrence"] = times.groupby(["model_id", "mode", "batch", "name"]).cumcount()
    return feats, times


def exact_sum(feats: pd.DataFrame, model_id: str, mode: str, batch: int) -> float:
    rows = with_occurrence(feats)
    rows = rows[(rows["model_id"] == model_id) & (rows["mode"] == mode) & (rows["batch"] == batch)]
    total = 0.0
    for cat, c_fw, c_bw in zip(rows["category"], rows["c_fw"], rows["c_bw"], strict=True):
        b0f, b1f, b0b, b1b = TRUE_BETAS[cat]
        total += b0f + b1f * c_fw + ((b0b + b1b * c_bw) if mode == "training" else 0.0)
    return total


# --------------------------------------------------------------------------- coefficient fit


def test_fit_recovers_known_coefficients() -> None:
    feats, times = synthetic_tables()
    table = fit_layer_coefficients(times.sample(frac=1.0, random_state=1), feats)  # order must not matter
    assert list(table.columns[:6]) == [
        "category",
        "beta0_fw_ms",
        "beta1_fw_ms_per_op",
        "beta0_bw_ms",
        "beta1_bw_ms_per_op",
        "n_layers",
    ]
    assert table["category"].tolist()[:5] == ["conv_fc", "norm", "pool_s1", "pool_s2", "relu_drop"]
    assert table["category"].tolist()[-1] == "pooled"
    fitted = table.set_index("category")
    for cat, betas in TRUE_BETAS.items():
        got = fitted.loc[cat, ["beta0_fw_ms", "beta1_fw_ms_per_op", "beta0_bw_ms", "beta1_bw_ms_per_op"]]
        np.testing.assert_allclose(got.to_numpy(dtype=float), betas, rtol=1e-6, atol=1e-9)
    assert fitted.loc["loss", "n_layers"] == 6 * 2  # training configs only
    assert fitted.loc["conv_fc", "n_layers_bw"] < fitted.loc["conv_fc", "n_layers"]


def test_fit_with_noise_and_negative_slopes_clipped() -> None:
    feats, times = synthetic_tables(n_models=12, seed=3)
    rng = np.random.default_rng(0)
    times["fw_ms"] *= rng.normal(1.0, 0.01, len(times))
    # a category whose time falls with complexity: its slope is clipped to 0, intercept = mean time
    key_cols = ["model_id", "mode", "batch", "name", "occurrence"]
    pool = with_occurrence(feats).merge(times, on=key_cols)
    pool = pool[pool["category"] == "pool_s1"]
    pool_keys = pool[key_cols].itertuples(index=False, name=None)
    fall = dict(zip(pool_keys, 1.0 - pool["c_fw"] / pool["c_fw"].max(), strict=True))
    keys = list(times[key_cols].itertuples(index=False, name=None))
    times["fw_ms"] = [fall.get(k, t) for k, t in zip(keys, times["fw_ms"], strict=True)]
    table = fit_layer_coefficients(times, feats).set_index("category")
    assert table.loc["conv_fc", "beta1_fw_ms_per_op"] == pytest.approx(TRUE_BETAS["conv_fc"][1], rel=0.05)
    assert table.loc["pool_s1", "beta1_fw_ms_per_op"] == 0.0
    assert table.loc["pool_s1", "beta0_fw_ms"] == pytest.approx(np.mean(list(fall.values())))
    assert (table[["beta0_fw_ms", "beta1_fw_ms_per_op"]].to_numpy() >= 0).all()


def test_fit_rejects_tables_that_do_not_line_up() -> None:
    feats, times = synthetic_tables(n_models=2)
    with pytest.raises(InputError, match="no measured layer call matches"):
        fit_layer_coefficients(times.assign(model_id="unknown"), feats)
    failed = times.assign(status="error")
    with pytest.raises(InputError):
        fit_layer_coefficients(failed, feats)


def test_coefficient_table_per_device(tmp_path: Path) -> None:
    feats, times = synthetic_tables(n_models=3)
    times.to_parquet(tmp_path / "cpu.parquet")
    times.assign(fw_ms=times["fw_ms"] * 2).to_parquet(tmp_path / "cpu2.parquet")
    table = coefficient_table(str(tmp_path / "*.parquet"), feats)
    assert sorted(set(table["device"])) == ["cpu", "cpu2"]
    assert table["category"].iloc[0] == "Conv/FC"
    assert {"Pool S=1", "Pool S>1", "ReLU/Drop", "Norm", "Loss"} <= set(table["category"])
    conv = table[table["category"] == "Conv/FC"].set_index("device")
    assert conv.loc["cpu2", "beta1_fw_ms_per_op"] == pytest.approx(2 * conv.loc["cpu", "beta1_fw_ms_per_op"])


# --------------------------------------------------------------------------- regressor


def regressor_data(tmp_path: Path) -> tuple[dict[str, str], pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    feats, times = synthetic_tables(n_models=6)
    layers_path, timing_path = tmp_path / "layers.parquet", tmp_path / "layers_cpu" / "cpu.parquet"
    timing_path.parent.mkdir()
    feats.to_parquet(layers_path)
    times.to_parquet(timing_path)  # no device column: the file name says cpu
    rows = []
    for model_id in sorted(feats["model_id"].unique()):
        for mode in ("inference", "training"):
            for batch in (1, 8):
                total = exact_sum(feats, model_id, mode, batch)
                for device, scale in (("cpu", 1.0), ("gpu", 0.05 if mode == "inference" else 0.08)):
                    rows.append(
                        {
                            "model_id": model_id,
                            "mode": mode,
                            "batch": batch,
                            "device": device,
                            "flops": 1.0,
                            "latency_ms": scale * total,
                        }
                    )
    data = pd.DataFrame(rows)
    train, test = data[data["model_id"] < "m4"], data[data["model_id"] >= "m4"]
    return (
        {"layers_path": str(layers_path), "timings_path": str(tmp_path / "layers_cpu" / "*.parquet")},
        train,
        test,
        feats,
    )


def test_regressor_recovers_totals_and_round_trips(tmp_path: Path) -> None:
    params, train, test, _ = regressor_data(tmp_path)
    assert REGISTRY["gianniti_layer"] is GiannitiLayerRegressor
    X = train.drop(columns="latency_ms")
    reg = GiannitiLayerRegressor(**params).fit(X, train["latency_ms"])
    assert reg.timing_match_ == "device" and reg.reference_device_ == "cpu"
    assert reg.n_timed_configs_ == 4 * 2 * 2  # only the training models' timings are used
    assert reg.scales_["cpu"] == pytest.approx(1.0)
    assert reg.scales_["gpu\x1finference"] == pytest.approx(0.05)
    assert reg.scales_["gpu\x1ftraining"] == pytest.approx(0.08)
    pred = reg.predict(test.drop(columns="latency_ms"))
    np.testing.assert_allclose(pred, test["latency_ms"].to_numpy(), rtol=1e-6)
    coef = reg.coefficients().set_index("category")
    assert coef.loc["conv_fc", "beta1_fw_ms_per_op"] == pytest.approx(TRUE_BETAS["conv_fc"][1], rel=1e-6)

    path = tmp_path / "model.json"
    save_regressor(reg, path)
    loaded = load_regressor(path)
    assert isinstance(loaded, GiannitiLayerRegressor)
    np.testing.assert_array_equal(loaded.predict(test.drop(columns="latency_ms")), pred)
    doc = json.loads(json.dumps(reg.to_document()))
    again = GiannitiLayerRegressor.from_document(doc)
    assert again.coefficients_ == reg.coefficients_ and again.scales_ == reg.scales_
    np.testing.assert_array_equal(again.predict(test.drop(columns="latency_ms")), pred)


def test_regressor_timing_match_and_errors(tmp_path: Path) -> None:
    params, train, test, feats = regressor_data(tmp_path)
    gpu_only = train[train["device"] == "gpu"]
    reg = GiannitiLayerRegressor(**params).fit(gpu_only.drop(columns="latency_ms"), gpu_only["latency_ms"])
    assert reg.timing_match_ == "model"  # the timed cpu is held out: timings matched by model
    with pytest.raises(InputError, match="no layer timing"):
        GiannitiLayerRegressor(**params, timing_match="device").fit(
            gpu_only.drop(columns="latency_ms"), gpu_only["latency_ms"]
        )
    unseen = test.drop(columns="latency_ms").assign(device="tpu")  # unseen device: global scale
    assert np.isfinite(reg.predict(unseen)).all()
    with pytest.raises(InputError, match="no layer table for model nope"):
        reg.predict(test.drop(columns="latency_ms").assign(model_id="nope"))
    # a new model's layer table given directly instead of layers_path
    new = feats[feats["model_id"] == "m5"].assign(model_id="new")
    X_new = test[test["model_id"] == "m5"].drop(columns="latency_ms").assign(model_id="new")
    np.testing.assert_allclose(
        reg.predict(X_new, layer_features=new), reg.predict(X_new.assign(model_id="m5"))
    )
    with pytest.raises(InputError, match="missing gianniti_layer column"):
        reg.fit(train.drop(columns=["latency_ms", "device"]), train["latency_ms"])
    assert len(load_layer_timings(params["timings_path"])) > 0
    with pytest.raises(InputError, match="no layer timing file"):
        load_layer_timings(str(tmp_path / "none" / "*.parquet"))


# --------------------------------------------------------------------------- measurement

TINY_CNN = """
from torch import nn


class Tiny(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(8 * 8 * 8, classes)

    def forward(self, x):
        x = self.pool(self.act(self.bn(self.conv(x))))
        y = self.conv2(x)
        y += x                      # in-place on a layer output, as in torchvision's ResNet
        return self.fc(self.flat(self.act(y)))


def make():
    return Tiny()
"""


def tiny_spec(tmp_path: Path, mode: str) -> dict:
    path = tmp_path / "tiny_cnn.py"
    path.write_text(TINY_CNN)
    return {
        "builder": "python",
        "name": f"{path}:make",
        "builder_kwargs": "{}",
        "input_shape": "[3, 16, 16]",
        "dtype": "float32",
        "batch": 2,
        "mode": mode,
        "model_id": "tiny",
        "config_id": f"tiny-{mode}",
        "family": "tiny",
    }


SETTINGS = {
    "threads": 1,
    "num_classes": 5,
    "warmup_iters": 1,
    "layer_iters": 3,
    "optimizer": "sgd",
    "timeout_s": 60,
    "max_rss_mb": 4000,
}


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_measure_layers_matches_featurised_layer_table(tmp_path: Path, mode: str) -> None:
    from perfzoo.models.builders import build_model

    spec = tiny_spec(tmp_path, mode)
    result = measure_layers_on_cpu(spec, SETTINGS)
    layers = pd.DataFrame(result.extra["layers"])
    build = partial(build_model, "python", spec["name"], {}, 5, (3, 16, 16))
    _, table = featurise(build, (3, 16, 16), 2, mode)
    table = with_occurrence(table)
    assert list(zip(layers["name"], layers["occurrence"], strict=True)) == list(
        zip(table["name"], table["occurrence"], strict=True)
    )
    assert list(layers["type"]) == list(table["type"])
    assert layers.loc[layers["name"] == "act", "occurrence"].tolist() == [0, 1]
    assert (layers["fw_ms"] > 0).all()
    assert len(result.times_ms) == 3 and all(t > 0 for t in result.times_ms)
    assert len(result.extra["unhooked_step_ms"]) == 3
    assert result.extra["inplace_disabled"] == 1
    if mode == "training":
        assert layers["type"].iloc[-1] == "Loss"
        assert (layers["bw_ms"] >= 0).all()
        assert (layers.loc[layers["type"].isin(["Conv2d", "Linear", "BatchNorm2d"]), "bw_ms"] > 0).all()
    else:
        assert layers["bw_ms"].isna().all()
    # the measured times join the featurised table and a coefficient table comes out
    times = layers.assign(model_id="", mode=mode, batch=2, status="ok")
    coefficients = fit_layer_coefficients(times, table)
    assert "conv_fc" in set(coefficients["category"])


def test_select_layer_configs_spreads_over_modes() -> None:
    rows = [
        {
            "config_id": f"c{i}",
            "model_id": f"m{i // 4}",
            "family": "cnn" if i < 40 else "mlp",
            "builder": "torchvision" if i < 40 else "mlp",
            "mode": ("inference", "training")[i % 2],
            "batch": 1 + i % 4,
        }
        for i in range(48)
    ]
    manifest = pd.DataFrame(rows)
    chosen = select_layer_configs(manifest, None, 10)
    assert len(chosen) == 10 and set(chosen["family"]) == {"cnn"}
    assert (chosen["mode"] == "training").sum() == 5
    assert chosen["model_id"].nunique() >= 8
    assert len(select_layer_configs(manifest, ["cnn", "mlp"], 0)) == 48
    with pytest.raises(InputError, match="fit.gianniti_families: unknown family resnt"):
        select_layer_configs(manifest, ["resnt"], 10)


def test_profile_layer_configs_isolated(tmp_path: Path) -> None:
    from perfzoo.profiling import measure

    if "cpu_layers" not in measure.MEASURE:
        pytest.skip("measure.MEASURE['cpu_layers'] is not registered yet")
    configs = pd.DataFrame(
        [
            tiny_spec(tmp_path, "training"),
            {**tiny_spec(tmp_path, "inference"), "name": f"{tmp_path}/missing.py:make"},
        ]
    )
    table = profile_layer_configs(configs, "cpu", SETTINGS, progress=False)
    assert list(table.columns) == LAYER_TIMING_COLUMNS
    ok = table[table["status"] == "ok"]
    assert len(ok) == 9 and (ok["fw_ms"] > 0).all() and (ok["step_ms"] > 0).all()
    failed = table[table["status"] != "ok"]
    assert len(failed) == 1 and failed["status"].iloc[0] == "error" and failed["name"].iloc[0] == ""
