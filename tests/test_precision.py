"""Precision as a dimension: zoo configs, the profiled step, meta-device features, hardware peaks."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from perfzoo.dataset.build import add_roofline_features, precision_peaks
from perfzoo.features.meta import featurise_manifest
from perfzoo.io import InputError
from perfzoo.hardware.precision import normalise_precision, peak_for
from perfzoo.profiling.core import make_step, set_precision
from perfzoo.models.zoo import expand_zoo, manifest_frame

FAMILY = {"builder": "mlp", "models": [{"name": "m", "kwargs": {"in_features": 16, "hidden": [8]}}],
          "input_shape": [16], "batch_sizes": [4], "modes": ["inference", "training"]}


def zoo(precisions: list[str] | None) -> pd.DataFrame:
    family = dict(FAMILY, **({"precisions": precisions} if precisions else {}))
    return manifest_frame(expand_zoo({"zoo": {"num_classes": 10, "families": {"mlp": family}}}))


def test_precisions_are_configs_and_fp32_keeps_its_ids() -> None:
    before, after = zoo(None), zoo(["fp32", "fp16", "amp"])
    assert len(after) == 3 * len(before) and set(after["precision"]) == {"fp32", "fp16", "amp"}
    fp32 = after[after["precision"] == "fp32"]
    assert fp32["config_id"].tolist() == before["config_id"].tolist()  # unchanged ids, unchanged tables
    assert after["model_id"].nunique() == 3 and after.loc[after["precision"] == "fp16", "label"].str.endswith(
        "/fp16").all()


def test_features_follow_the_precision_dtype() -> None:
    models, _ = featurise_manifest(zoo(["fp32", "fp16", "bf16", "amp"]), 10, progress=False)
    manifest = zoo(["fp32", "fp16", "bf16", "amp"])
    merged = models.merge(manifest[["model_id", "mode", "batch", "precision"]].drop_duplicates(),
                          on=["model_id", "mode", "batch"])
    weights = merged[merged["mode"] == "inference"].set_index("precision")["weight_bytes"]
    assert weights["fp16"] == weights["bf16"] == weights["fp32"] / 2 and weights["amp"] == weights["fp32"]
    assert (merged["feature_error"] == "").all()


@pytest.mark.parametrize("precision", ["fp32", "bf16", "amp"])
def test_profiled_step_runs_at_the_precision(precision: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10))
    x, y = torch.randn(4, 16), torch.randint(0, 10, (4,))
    model, x, context = set_precision(model, x, precision, "cpu")
    assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 is False
    expected = torch.bfloat16 if precision == "bf16" else torch.float32
    assert next(model.parameters()).dtype == expected and x.dtype == expected
    seen = []
    model.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    make_step(model, x, y, "training", "sgd", context)()
    assert seen == [torch.float16 if precision == "amp" else expected]
    set_precision(model, x, "tf32", "cpu")
    assert torch.backends.cuda.matmul.allow_tf32 is True
    set_precision(model, x, "fp32", "cpu")


def test_profiled_rows_use_the_measured_gemm_of_their_precision() -> None:
    hardware = {"gpu": {"kind": "cuda", "measured_gemm_tflops": {"fp32": 19.0, "tf32": 100.0, "fp16": 250.0,
                                                                  "bf16": None}},
                "cpu": {"kind": "cpu"}}
    data = pd.DataFrame({"device": ["gpu", "gpu", "gpu", "cpu"], "precision": ["fp32", "amp", "bf16", "amp"],
                         "hw_peak_gflops": [19000.0, 19000.0, 19000.0, 50.0], "hw_mem_bw_gbs": 1000.0,
                         "flops": 1e12, "weight_bytes": 1e6, "activation_bytes": 1e6})
    out = add_roofline_features(precision_peaks(data, hardware))
    assert out["hw_peak_gflops"].iloc[:2].tolist() == [19000.0, 250000.0]
    assert math.isnan(out["hw_peak_gflops"].iloc[2]) and math.isnan(out["hw_peak_gflops"].iloc[3])
    assert out["hw_tensor_cores"].tolist() == [0.0, 1.0, 1.0, 0.0]
    assert out["roofline_compute_ms"].iloc[1] == pytest.approx(1e12 / 250e12 * 1e3)
    fp32_only = data.assign(precision="fp32")
    assert precision_peaks(fp32_only, hardware).equals(fp32_only)  # fp32 zoos: nothing added


def test_precision_names_and_peaks() -> None:
    assert normalise_precision("Half") == "fp16" and normalise_precision("bfloat16") == "bf16"
    with pytest.raises(InputError, match="unknown precision 'int8'"):
        normalise_precision("int8")
    spec = {"name": "V100 X", "arch": "Volta", "peak_fp32_tflops": 15.7, "peak_fp16_tflops": 125.0}
    assert peak_for(spec, "amp").tflops == 125.0 and peak_for(spec, "amp").tensor_cores
    with pytest.raises(InputError, match="precision tf32 is not supported on V100 X"):
        peak_for(spec, "tf32")
    assert math.isnan(peak_for({"name": "B", "arch": "Blackwell"}, "fp32").tflops)  # not stated: missing
