"""Measured per-operator times: recorded after the end-to-end window, with phases, classified into the meta
trace's kinds, missing with a reason, and never a regressor's feature."""

from __future__ import annotations

import collections
import types
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.flop_counter import FlopCounterMode

from perfzoo.dataset.build import feature_columns
from perfzoo.features.op_kinds import FREE_KIND
from perfzoo.features.op_times import KIND_TIME_COLUMNS, kind_time_labels, kind_times
from perfzoo.features.ops import recorded_op_kind, trace_step
from perfzoo.fitting import regressor_inputs
from perfzoo.io import InputError
from perfzoo.profiling import measure
from perfzoo.profiling.core import make_optimizer, make_step
from perfzoo.profiling.op_timing import CudaKernelClock, range_kernel_ms, time_operators
from perfzoo.profiling.runner import OP_TIME_COLUMNS, Task, op_times_frame

from conftest import FAULTY

SETTINGS = {"warmup_iters": 1, "min_iters": 3, "max_iters": 3, "max_time_s": 0.3, "ci_target": 0.02,
            "optimizer": "sgd", "threads": 1, "num_classes": 2, "op_timing": {"warmup_steps": 0, "steps": 2}}


def tiny_convnet() -> nn.Module:
    """A dense and a depthwise (grouped) convolution, a norm, an activation, pooling and a classifier."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=8),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def timed(mode: str) -> tuple[nn.Module, dict]:
    model, x, y = tiny_convnet(), torch.randn(2, 3, 12, 12), torch.tensor([0, 3])
    optimizer = make_optimizer(model, "sgd")  # shared with the plain step before, as in measure_on_cpu
    make_step(model, x, y, mode, optimizer)()
    times = time_operators(lambda phase: make_step(model, x, y, mode, optimizer, None, phase), SETTINGS)
    assert times.message == ""
    return model, times.as_dict()


@pytest.mark.parametrize("mode, phases", [("inference", {"forward"}),
                                          ("training", {"forward", "backward", "optimizer"})])
def test_operators_of_each_timed_step_are_recorded_with_their_phase(mode, phases) -> None:
    _, times = timed(mode)
    assert set(times["phase"]) == phases
    assert set(times["step"]) == {0, 1} and len(times["step_ms"]) == 2
    assert min(times["time_ms"]) >= 0
    for step, step_ms in enumerate(times["step_ms"]):  # operators run inside their step's wall time
        ops = [t for s, t in zip(times["step"], times["time_ms"], strict=True) if s == step]
        assert 0 < sum(ops) <= step_ms
        assert [o for s, o in zip(times["step"], times["order"], strict=True) if s == step] == list(range(len(ops)))
    convolutions = {g for op, g in zip(times["op"], times["grouped"], strict=True) if "convolution" in op}
    assert convolutions == {True, False}  # the depthwise convolution is flagged, the dense one not


def test_measured_kinds_are_the_meta_traces_kinds() -> None:
    _, times = timed("training")
    measured = collections.Counter(
        (phase, recorded_op_kind(op, grouped, phase))
        for step, op, phase, grouped in zip(times["step"], times["op"], times["phase"], times["grouped"],
                                            strict=True) if step == 0)
    with torch.device("meta"):
        model = tiny_convnet()
    meta = trace_step(model, torch.randn(2, 3, 12, 12, device="meta"), "training", FlopCounterMode().flop_registry)
    traced = collections.Counter(zip(meta["phase"], meta["kind"], strict=True))
    # the meta trace builds the loss targets inside its forward (one copy); the profiled step gets them
    costed = {key for key in traced if key[1] != FREE_KIND} - {("forward", "copy")}
    assert {key for key in measured if key[1] not in (None, FREE_KIND)} == costed
    assert "conv_grouped" in {kind for _, kind in costed}
    for key in costed:  # and the same number of calls per kind (the optimizer's state exists in both)
        assert measured[key] == traced[key], key


def test_end_to_end_labels_are_taken_before_the_operators_are_timed(monkeypatch) -> None:
    events: list[str] = []
    timed_window = measure.time_cpu_iterations

    def watched_window(step, settings):
        def watched_step():
            events.append("timed" if _get_current_dispatch_mode() is None else "timed under a dispatch mode")
            step()
        return timed_window(watched_step, settings)

    close_phase = measure.ResidentPeak.close_phase
    monkeypatch.setattr(measure, "time_cpu_iterations", watched_window)
    monkeypatch.setattr(measure.ResidentPeak, "close_phase", lambda self: events.append("peak") or close_phase(self))
    op_timer = measure.step_op_times
    monkeypatch.setattr(measure, "step_op_times", lambda *a: events.append("ops") or op_timer(*a))
    spec = {"builder": "python", "name": f"{FAULTY}:build_tiny", "builder_kwargs": "{}", "input_shape": "[4]",
            "dtype": "float32", "batch": 2, "mode": "training"}
    result = measure.measure_on_cpu(spec, SETTINGS)
    warmups = SETTINGS["warmup_iters"]  # the memory label's high-water mark is read after each warm-up step too
    assert events[:warmups] == ["peak"] * warmups and set(events[warmups:-2]) == {"timed"}
    assert events[-2:] == ["peak", "ops"]
    assert len(result.times_ms) == events.count("timed")
    assert result.extra["op_times"]["op"] and result.extra["op_times"]["message"] == ""


def test_warm_up_steps_are_not_kept() -> None:
    model, x, y = tiny_convnet(), torch.randn(2, 3, 12, 12), torch.tensor([0, 3])
    times = time_operators(lambda phase: make_step(model, x, y, "inference", None, None, phase),
                           {**SETTINGS, "op_timing": {"warmup_steps": 2, "steps": 1}})
    assert set(times.step) == {0} and len(times.step_ms) == 1 and times.order[0] == 0


def test_a_failing_op_timing_step_is_a_reason_not_rows() -> None:
    def broken(_phase):
        def step():
            raise RuntimeError("kernel exploded")
        return step

    times = time_operators(broken, SETTINGS)
    assert times.failed and "kernel exploded" in times.message and times.op == [] and times.step_ms == []


def _task(config_id: str) -> Task:
    return Task({"model_id": f"m{config_id}", "config_id": config_id, "mode": "inference", "batch": 2}, 0)


def test_configs_without_op_times_keep_one_row_with_the_reason() -> None:
    _, times = timed("inference")
    off = time_operators(lambda phase: None, {**SETTINGS, "op_timing": {"steps": 0}}).as_dict()
    measured = {"status": "ok", "message": "", "measurement": {"extra": {"op_times": times}}}
    done = {"a/0": measured,
            "b/0": {"status": "oom", "message": "worker killed", "measurement": None},
            "c/0": {"status": "ok", "message": "", "measurement": {"extra": {"op_times": off}}}}
    tasks = [_task("a"), _task("b"), _task("c")]
    table = op_times_frame(tasks, done)
    assert list(table.columns) == OP_TIME_COLUMNS
    missing = table[table["status"] != "ok"].set_index("config_id")
    assert dict(missing["status"]) == {"b": "oom", "c": "not_measured"}
    assert "worker killed" in missing.loc["b", "message"] and "steps is 0" in missing.loc["c", "message"]
    assert missing["time_ms"].isna().all()
    # a journal entry whose worker recorded no per-op times (a repeat's settings, or an older worker's entry)
    unrecorded = {"a/0": {"status": "ok", "message": "", "measurement": {"extra": {}}}}
    none = op_times_frame(tasks[:1], unrecorded)
    assert len(none) == 1 and none["status"].iloc[0] == "not_measured" and math.isnan(none["time_ms"].iloc[0])
    assert none["message"].iloc[0] == "per-op times not measured: the worker recorded none"

    kinds = kind_times(table.assign(device="cpu"))
    assert list(kinds.columns) == KIND_TIME_COLUMNS
    failed = kinds[kinds["status"] != "ok"]
    assert set(failed["config_id"]) == {"b", "c"} and failed["time_ms"].isna().all() and (failed["kind"] == "").all()
    ok = kinds[kinds["status"] == "ok"]
    assert ok["time_ms"].sum() == pytest.approx(ok["ops_ms"].iloc[0], rel=1e-9)  # per-op view included
    labels = kind_time_labels(kinds).set_index("model_id")
    assert labels.loc[["mb", "mc"]].filter(like="_ms").isna().all().all()
    assert labels.loc["ma", "optime_conv_ms"] > 0


def test_kind_times_over_more_steps_are_means_that_add_up_to_the_step() -> None:
    model, x, y = tiny_convnet(), torch.randn(2, 3, 12, 12), torch.tensor([0, 3])
    optimizer = make_optimizer(model, "sgd")
    settings = {**SETTINGS, "op_timing": {"warmup_steps": 0, "steps": 3}}
    times = time_operators(lambda phase: make_step(model, x, y, "training", optimizer, None, phase), settings)
    done = {"a/0": {"status": "ok", "message": "", "measurement": {"extra": {"op_times": times.as_dict()}}}}
    kinds = kind_times(op_times_frame([_task("a")], done).assign(device="cpu"))
    assert (kinds["n_steps"] == 3).all()
    assert kinds["time_ms"].sum() == pytest.approx(kinds["ops_ms"].iloc[0], rel=1e-9)


def test_a_config_whose_timer_saw_no_operator_is_not_measured() -> None:
    _, times = timed("inference")
    empty = {name: ([] if isinstance(value, list) else value) for name, value in times.items()}
    done = {"a/0": {"status": "ok", "message": "", "measurement": {"extra": {"op_times": empty}}}}
    table = op_times_frame([_task("a")], done)
    assert list(table["status"]) == ["not_measured"]
    assert table["message"].iloc[0] == "per-op timing recorded no operator"


def test_op_times_are_never_features() -> None:
    _, times = timed("inference")
    done = {"a/0": {"status": "ok", "message": "", "measurement": {"extra": {"op_times": times}}}}
    labels = kind_time_labels(kind_times(op_times_frame([_task("a")], done).assign(device="cpu")))
    data = pd.DataFrame({"model_id": ["ma"], "device": ["cpu"], "mode": ["inference"], "batch": [2],
                         "flops": [1.0], "is_training": [0.0], "hw_peak_gflops": [1.0]}).merge(labels)
    aux = [c for c in labels.columns if c.startswith("optime_")]
    assert aux and not set(aux) & set(feature_columns(data))
    assert not set(aux) & set(regressor_inputs(data, operator_features=True).columns)


def test_composed_on_op_times_fits_kind_models_on_measured_times_and_never_reads_them_to_predict() -> None:
    from perfzoo.features.op_kinds import COSTED_KINDS, OP_FEATURES
    from perfzoo.regressors.composed import ComposedOpTimeRegressor

    rng = np.random.default_rng(0)
    n = 40
    X = pd.DataFrame(0.0, index=range(n), columns=list(OP_FEATURES))
    X["op_matmul_flops"], X["op_matmul_count"] = rng.uniform(1e8, 1e10, n), rng.integers(1, 50, n)
    X["op_elementwise_bytes"], X["op_elementwise_count"] = rng.uniform(1e6, 1e9, n), rng.integers(1, 100, n)
    X["device"], X["is_training"], X["flops"] = "cpu", 0.0, X["op_matmul_flops"]
    for kind in COSTED_KINDS:
        X[f"optime_{kind}_ms"] = 0.0
    X["optime_matmul_ms"] = 2e-9 * X["op_matmul_flops"]
    X["optime_elementwise_ms"] = 1e-8 * X["op_elementwise_bytes"]
    y = 1.25 * (X["optime_matmul_ms"] + X["optime_elementwise_ms"]) + 0.5  # timer's scale, step overhead
    reg = ComposedOpTimeRegressor(weighting="none").fit(X, y)
    coef = reg.coefficients("cpu")
    assert coef["op_matmul_flops"] == pytest.approx(1.25 * 2e-9, rel=1e-6)
    assert coef["op_elementwise_bytes"] == pytest.approx(1.25 * 1e-8, rel=1e-6)
    assert coef["overhead"] == pytest.approx(0.5, rel=1e-6)
    unseen_times = X.drop(columns=[c for c in X.columns if c.startswith("optime_")])
    np.testing.assert_allclose(reg.predict(unseen_times), y, rtol=1e-6)
    assert not [c for c in reg.fallback_model_.feature_names_ if c.startswith("optime_")]
    with pytest.raises(InputError, match="optime_matmul_ms"):
        ComposedOpTimeRegressor().fit(unseen_times, y)


def test_coverage_names_the_held_out_familys_kinds_unseen_in_training() -> None:
    from perfzoo.features.op_times import family_coverage

    def kinds(model_id: str, times: dict[str, float], step_ms: float) -> list[dict]:
        return [{"device": "cpu", "config_id": f"c{model_id}", "model_id": model_id, "mode": "inference",
                 "batch": 1, "power_limit_w": math.nan, "kind": k, "time_ms": t, "calls": 1.0, "step_ms": step_ms,
                 "ops_ms": sum(times.values()), "n_steps": 2.0, "status": "ok", "message": ""}
                for k, t in times.items()]

    table = pd.DataFrame(kinds("a", {"conv": 6.0, "norm": 2.0}, 10.0) + kinds("b", {"conv": 3.0, "matmul": 5.0}, 10.0)
                         + [{"device": "cpu", "config_id": "cc", "model_id": "c", "mode": "inference", "batch": 1,
                             "kind": "", "status": "oom", "message": "config not measured: oom"}])
    data = pd.DataFrame({"row_id": ["ra", "rb", "rc"], "device": "cpu", "model_id": ["a", "b", "c"],
                         "mode": "inference", "batch": 1, "family": ["A", "B", "B"]})
    split = pd.DataFrame({"split": "leave_one_family_out", "fold": ["A", "A", "A", "B", "B", "B"],
                          "row_id": ["ra", "rb", "rc"] * 2, "set": ["test", "train", "train", "train", "test", "test"]})
    coverage = family_coverage(table, split, data).set_index("fold")
    assert coverage.loc["B", "covered_share"] == pytest.approx(0.3)  # conv seen in A; matmul never
    assert coverage.loc["B", "unseen_share"] == pytest.approx(0.5)
    assert coverage.loc["B", "outside_share"] == pytest.approx(0.2)
    assert coverage.loc["B", "unseen_kinds"] == "matmul 0.500" and coverage.loc["B", "configs"] == 1
    assert coverage.loc["B", "configs_without_op_times"] == 1  # the config that ran out of memory
    assert coverage.loc["A", "unseen_kinds"] == "norm 0.200"


def test_composed_on_op_times_reads_the_op_times_table_the_fit_rule_gives_it(tmp_path: Path) -> None:
    from perfzoo.features.op_kinds import OP_FEATURES
    from perfzoo.features.op_times import KIND_TIME_COLUMNS
    from perfzoo.fitting import fit_split
    from perfzoo.regressors.base import regressor_from_document

    rng = np.random.default_rng(1)
    n = 30
    data = pd.DataFrame(0.0, index=range(n), columns=list(OP_FEATURES))
    data["op_matmul_flops"], data["op_matmul_count"] = rng.uniform(1e8, 1e10, n), rng.integers(1, 50, n)
    matmul_ms = 2e-9 * data["op_matmul_flops"]
    data = data.assign(row_id=[f"r{i}" for i in range(n)], model_id=[f"m{i}" for i in range(n)], device="cpu",
                       mode="inference", batch=rng.integers(1, 64, n), family="f", label="x", is_training=0.0,
                       flops=data["op_matmul_flops"], params=1.0, latency_ms=1.5 * matmul_ms + 0.25)
    times = pd.DataFrame({"device": "cpu", "config_id": data["row_id"], "model_id": data["model_id"],
                          "mode": "inference", "batch": data["batch"], "power_limit_w": math.nan, "kind": "matmul",
                          "time_ms": matmul_ms, "calls": 1.0, "step_ms": 1.0, "ops_ms": 1.0, "n_steps": 2.0,
                          "status": "ok", "message": ""})[list(KIND_TIME_COLUMNS)]
    times = times[times["model_id"] != "m0"]  # a config without per-op times: left out of the per-kind fit
    path = tmp_path / "op_times.parquet"
    times.to_parquet(path)
    split = pd.DataFrame({"split": "random", "fold": 0, "row_id": data["row_id"],
                          "set": ["test" if i < 6 else "train" for i in range(n)]})
    predictions, models, _ = fit_split(data, split, "latency_ms", "composed_optime",
                                       {"op_times_path": str(path), "weighting": "none"})
    np.testing.assert_allclose(predictions["y_pred"], predictions["y_true"], rtol=1e-6)
    coef = models["0"].coefficients("cpu")
    assert coef["op_matmul_flops"] == pytest.approx(1.5 * 2e-9, rel=1e-6)
    stored = regressor_from_document(models["0"].to_document(), "test")
    assert stored.op_times_path == str(path)
    empty = tmp_path / "empty.parquet"
    times.iloc[:0].to_parquet(empty)
    _, none_fitted, notes = fit_split(data, split, "latency_ms", "composed_optime", {"op_times_path": str(empty)})
    assert not none_fitted and "no measured per-op times" in notes["skipped_folds"]["0"]


class _CpuProfiledClock(CudaKernelClock):
    """The CUDA clock's profiler ranges on the CPU (no kernels there, so every call's GPU time is 0)."""

    ACTIVITIES = ("CPU",)

    def sync(self) -> None:
        return None


def test_the_kernel_clock_finds_one_profiler_range_per_operator_call_in_order() -> None:
    model, x, y = tiny_convnet(), torch.randn(2, 3, 12, 12), torch.tensor([0, 3])
    optimizer = make_optimizer(model, "sgd")
    settings = {**SETTINGS, "op_timing": {"warmup_steps": 1, "steps": 2}}
    host = time_operators(lambda phase: make_step(model, x, y, "training", optimizer, None, phase), settings)
    clock = _CpuProfiledClock("cpu")
    profiled = time_operators(lambda phase: make_step(model, x, y, "training", optimizer, None, phase), settings,
                              clock)
    assert profiled.message == "" and profiled.op == host.op and profiled.phase == host.phase
    assert clock._calls == 3 * len(host.op) // 2  # the warm-up step's calls were profiled too, then dropped
    assert profiled.time_ms == [0.0] * len(host.op) and len(profiled.step_ms) == 2


def test_the_kernel_clock_reads_its_times_only_after_the_profiler_stopped() -> None:
    with pytest.raises(RuntimeError, match="when its 'with' block ends"):
        _CpuProfiledClock("cpu").times_ms()


def _event(name: str, device: str = "CPU", us: float = 0.0, kernels: tuple = (), children: tuple = ()) -> Any:
    """A torch.profiler FunctionEvent's fields that the attribution reads."""
    return types.SimpleNamespace(name=name, device_type=f"DeviceType.{device}", kernels=list(kernels),
                                 cpu_children=list(children), time_range=types.SimpleNamespace(elapsed_us=lambda: us))


def _kernel(name: str, us: float) -> Any:
    return types.SimpleNamespace(name=name, duration=us)


def _h100_like_profile(unlinked_us: float = 0.0) -> list[Any]:
    """A profile of two calls shaped as the H100's: the ranges' GPU-side copies (same name, their span on the
    device timeline) are device events beside the real kernels, as run 3 of bench/RESULTS.md listed them; here
    a copy is also linked among its host range's kernels, which the attribution must not count either way. The
    real kernels hang from the aten operator below the range; the first call launched two, the second none."""
    conv = _event("aten::cudnn_convolution", kernels=[_kernel("sm90_xmma_fprop", 30.0), _kernel("nhwcToNchw", 10.0)])
    first = _event("perfzoo_op_0", kernels=[_kernel("perfzoo_op_0", 55.0)], children=[conv])
    view = _event("perfzoo_op_1", children=[_event("aten::view")])
    device = [_event("perfzoo_op_0", "CUDA", 55.0), _event("sm90_xmma_fprop", "CUDA", 30.0),
              _event("nhwcToNchw", "CUDA", 10.0)]
    if unlinked_us:
        device.append(_event("void elementwise_kernel", "CUDA", unlinked_us))
    return [first, conv, view, *device]


def test_kernel_attribution_counts_real_kernels_below_each_range_not_the_ranges_device_copies() -> None:
    assert range_kernel_ms(_h100_like_profile(), "perfzoo_op_", 2) == pytest.approx([0.040, 0.0])


def test_kernel_attribution_refuses_kernels_it_cannot_place_and_missing_ranges() -> None:
    with pytest.raises(RuntimeError, match="0.040 ms of kernels to the operator calls but 0.060 ms in all"):
        range_kernel_ms(_h100_like_profile(unlinked_us=20.0), "perfzoo_op_", 2)
    with pytest.raises(RuntimeError, match="recorded 2 of 3 operator ranges"):
        range_kernel_ms(_h100_like_profile(), "perfzoo_op_", 3)
