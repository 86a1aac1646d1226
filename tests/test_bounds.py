"""predict bounds what it says: physical floors, out-of-range intervals, qualified recommendations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import numpy as np
import pandas as pd

from perfzoo.prediction.bounds import RangeCheck, bound_predictions, memory_floor_mb, time_floor_ms
from perfzoo.prediction.predictors import TargetPrediction
from perfzoo.prediction import predict

from test_predict import _mlp, run_dir, workflow_dir  # noqa: F401 - the fixtures

pytest.importorskip("torchvision")


def test_huge_batch_is_bounded_and_out_of_range(run_dir: Path) -> None:
    """resnet18 at batch 1e6 on 3x32x32: the input alone is 12 GB, its FLOPs take seconds at the peak."""
    result = predict("torchvision:resnet18", batch=1_000_000, input_shape=(3, 32, 32))
    record = result.record
    row = next(iter(record["feature_rows"].values()))
    device, entry = next(iter(record["devices"].items()))
    mem, lat = entry["quantities"]["peak_mem_mb"], entry["quantities"]["latency_ms"]
    input_mib = 1_000_000 * 3 * 32 * 32 * 4 / 2**20
    assert memory_floor_mb(row) >= input_mib
    assert mem["value"] >= memory_floor_mb(row) and mem["lo"] >= memory_floor_mb(row)
    assert lat["value"] >= time_floor_ms(row) > 0 and lat["lo"] >= time_floor_ms(row)
    assert mem["out_of_range"] and lat["out_of_range"] and lat["hi"] is None  # unbounded above
    thr = entry["quantities"]["throughput"]
    assert thr["value"] <= 1_000_000 * 1000 / time_floor_ms(row) * (1 + 1e-9)
    text = result.to_text()
    assert "out of range" in text and "[" not in text.split("latency (ms)")[1].splitlines()[0]
    rec = record["recommendation"]
    if rec["device"]:
        assert "OUT OF RANGE" in rec["reason"] and rec["out_of_range"]
        assert "OUT OF RANGE" in [ln for ln in text.splitlines() if ln.startswith("recommended device")][0]
    json.dumps(record)  # still JSON-safe


def test_in_range_prediction_keeps_its_interval(run_dir: Path) -> None:
    result = predict(_mlp(), batch=4, input_shape=(64,))
    entry = next(iter(result.record["devices"].values()))
    lat = entry["quantities"]["latency_ms"]
    assert "out_of_range" not in lat and lat["hi"] is not None and lat["lo"] <= lat["value"] <= lat["hi"]


def test_memory_above_the_device_capacity_says_it_would_not_fit() -> None:
    """The ceiling: peak memory is capped at the device's memory and a point above it is named as not fitting."""
    X = pd.DataFrame({"input_bytes": [2**20], "weight_bytes": [2**20], "flops": [1e9], "hw_peak_gflops": [100.0],
                      "hw_mem_gb": [1.0], "batch": [4]})
    tp = {"peak_mem_mb": TargetPrediction(np.array([5000.0]), np.array([3000.0]), np.array([8000.0]), "random_forest")}
    point, lo, hi, method = bound_predictions(tp, X, RangeCheck())["peak_mem_mb"]
    assert hi[0] == lo[0] == 1024.0 and point[0] == 5000.0
    assert "would not fit" in method and "1 GiB" in method
    fits = {"peak_mem_mb": TargetPrediction(np.array([500.0]), np.array([300.0]), np.array([800.0]), "random_forest")}
    point, lo, hi, method = bound_predictions(fits, X, RangeCheck())["peak_mem_mb"]
    assert (lo[0], hi[0]) == (300.0, 800.0) and "would not fit" not in method


def test_a_model_calling_a_kind_more_often_than_any_profiled_config_is_outside_the_range() -> None:
    """A recurrent net's many small matrix products: beyond the profiled calls per step of its mode."""
    from perfzoo.prediction.bounds import range_check

    data = pd.DataFrame({"mode": ["inference", "inference", "training"], "flops": [1e9, 4e9, 8e9],
                         "params": [1e6, 2e6, 2e6], "batch": [1, 8, 8], "op_matmul_count": [10.0, 73.0, 300.0],
                         "op_attention_count": [0.0, 0.0, 0.0]})
    inside = {"flops": 2e9, "params": 1.5e6, "op_matmul_count": 73.0, "op_attention_count": 4.0}
    assert range_check(inside, 4, "inference", data).reasons == []  # a kind no profiled config ran: not compared
    beyond = range_check({**inside, "op_matmul_count": 257.0}, 4, "inference", data)
    assert beyond.widened and beyond.decades == pytest.approx(np.log10(257 / 73))
    assert beyond.reasons == ["matmul operators: 257 calls per step, profiled at most 73"]  # its own mode only
    assert range_check({**inside, "flops": 8e9, "op_matmul_count": 257.0}, 4, "training", data).reasons == []
    assert range_check({**inside, "op_matmul_count": 1e4}, 4, "inference", data).out_of_range


def test_a_device_faster_than_every_profiled_one_is_named_with_the_factor_it_lies_beyond() -> None:
    """Real rows: timm's RTX 3090/4090 files as the profiled data, the H200 measured here as the new device."""
    from perfzoo.dataset.external import ImportOptions, import_external
    from perfzoo.hardware.specs import lookup_gpu
    from perfzoo.prediction.bounds import hardware_beyond_profiled, range_warnings
    from perfzoo.prediction.spec import ModelSpec

    fixtures = Path(__file__).parent / "fixtures"
    timm = ImportOptions(fmt="timm", featurise_models=False)
    data = pd.concat([import_external(fixtures / "timm" / name, options=timm)[0] for name in
                      ("benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv", "benchmark-infer-amp-nchw-pt291-cu128-4090.csv")])
    row = import_external(fixtures / "gpu-h200" / "benchmark-infer-amp-nchw-pt211-cu130-h200.csv", options=timm)[0].iloc[0]
    h200, rtx4090, rtx3090 = (lookup_gpu(name) for name in ("H200 SXM", "RTX 4090", "RTX 3090"))
    peak, top_peak = 1e3 * h200["peak_fp16_tflops"], 1e3 * rtx4090["peak_fp16_tflops"]  # AMP rows: FP16 peaks
    bandwidth, top_bandwidth = h200["mem_bw_gbs"], rtx4090["mem_bw_gbs"]
    beyond = [f"its peak GFLOP/s {peak:.4g} is {peak / top_peak:.2f}x the largest profiled ({top_peak:.4g})",
              f"its memory bandwidth GB/s {bandwidth:.4g} is {bandwidth / top_bandwidth:.2f}x the largest profiled "
              f"({top_bandwidth:.4g})"]
    assert hardware_beyond_profiled(row, data, "amp") == beyond
    inside = {**row, "hw_peak_gflops": top_peak, "hw_mem_bw_gbs": top_bandwidth}
    assert hardware_beyond_profiled(inside, data, "amp") == []
    low_peak = 1e3 * rtx3090["peak_fp16_tflops"]
    slow = hardware_beyond_profiled({**row, "hw_peak_gflops": low_peak / 2}, data, "amp")[0]
    assert slow == f"its peak GFLOP/s {low_peak / 2:.4g} is 2.00x below the smallest profiled ({low_peak:.4g})"
    spec = ModelSpec("timm:resnet50", "timm", "resnet50", (3, 224, 224))
    devices = ["RTX 3090 pt240-cu124", "H200 SXM pt211-cu130"]
    warnings = range_warnings(spec, "ResNet", {}, 256, "inference", data, devices, {devices[1]: row}, "amp")
    [device_warning] = [w for w in warnings if w.startswith("device ")]
    assert device_warning == ("device H200 SXM pt211-cu130 has no profiled rows: its numbers extrapolate from "
                              "hardware features alone; " + "; ".join(beyond))


def test_flops_params_and_batch_outside_the_profiled_range_are_named_and_measured_in_decades() -> None:
    from perfzoo.prediction.bounds import range_check, range_warnings
    from perfzoo.prediction.spec import ModelSpec

    data = pd.DataFrame({"mode": ["inference", "inference", "training"], "flops": [1e6, 1e8, 1e12],
                         "params": [1e5, 1e6, 1e6], "batch": [2, 8, 8], "family": ["mlp"] * 3,
                         "device": ["cpu"] * 3})
    feats = {"flops": 1e10, "params": 1e4}  # 100x the most inference FLOPs; 10x below the fewest parameters
    check = range_check(feats, 1, "inference", data)
    assert check.reasons == ["flops 1e+10 outside the profiled [1e+06, 1e+08]",
                             "params 1e+04 outside the profiled [1e+05, 1e+06]",
                             "batch 1 outside the profiled [2, 8]"]
    assert check.decades == pytest.approx(2.0) and check.out_of_range
    assert range_check({"flops": 1e7, "params": 1e5}, 4, "inference", data).reasons == []
    spec = ModelSpec("mlp", "mlp", "mlp", (4,))
    texts = range_warnings(spec, "Sequential", feats, 1, "inference", data, ["cpu"])
    assert texts == ["flops 1e+10 is outside the profiled range [1e+06, 1e+08] of inference rows: the prediction "
                     "extrapolates", "params 1e+04 is outside the profiled range [1e+05, 1e+06]: the prediction "
                     "extrapolates", "batch 1 is below the smallest profiled batch (2)"]
    assert range_warnings(spec, "Sequential", feats, 64, "inference", data, ["cpu"])[2] == (
        "batch 64 is beyond the largest profiled batch (8): the prediction extrapolates")
