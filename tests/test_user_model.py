"""The README's own-model example (``examples/sequence_model.py``, a Conv1d + GRU classifier): it builds and
runs, its step is followed on the meta device (operator trace and memory simulation), the RNN's views cost
nothing, and ``perfzoo predict`` gives it finite latency and memory with the predictor that made them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import ROOT
from test_predict import run_dir, workflow_dir  # noqa: F401 - the session fixture of a finished tiny run

EXAMPLE = ROOT / "examples" / "sequence_model.py"


def _build():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sequence_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def test_example_builds_and_classifies_a_batch_of_sequences() -> None:
    import torch

    model = _build()()
    logits = model(torch.randn(2, 12, 32))
    assert logits.shape == (2, 100)
    assert any(isinstance(m, torch.nn.GRU) for m in model.modules())


def test_rnn_views_are_free_operators() -> None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from perfzoo.features.ops import FREE_KIND, op_kind, trace_step

    aten = torch.ops.aten
    assert op_kind(aten.unsafe_split.Tensor) == FREE_KIND  # what the GRU splits its gates with
    assert op_kind(aten.transpose_.default) == FREE_KIND  # an in-place view
    with torch.device("meta"):
        model, x = _build()(), torch.randn(2, 12, 32)
    table = trace_step(model, x, "training", FlopCounterMode(display=False).flop_registry)
    assert "other" not in set(table["kind"]), table.loc[table["kind"] == "other", "op"].unique()
    assert (table["kind"] == "matmul").sum() > 8  # the GRU's time steps are followed one by one


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_predict_gives_finite_latency_and_memory_with_the_predictor(
    run_dir: Path, mode: str  # noqa: F811
) -> None:
    from perfzoo.prediction import predict

    result = predict(f"{EXAMPLE}:build", batch=2, input_shape="12,32", mode=mode, devices=["cpu"])
    features = result.record["features"]
    assert not features.get("op_trace_error") and not features.get("sim_error")
    assert features["sim_peak_bytes"] > 0 and features["op_matmul_count"] > 0
    quantities = result.record["devices"]["cpu"]["quantities"]
    for target in ("latency_ms", "peak_mem_mb"):
        q = quantities[target]
        assert math.isfinite(q["value"]) and q["value"] > 0, q
        assert q["lo"] <= q["value"] and (q["hi"] is None or q["value"] <= q["hi"]), q  # None: out of range
        assert q["source"] == "{regressor}/{split}".format(**result.record["predictors"][target])
    assert any("ConvGRUClassifier" in w and "never profiled" in w for w in result.warnings)
