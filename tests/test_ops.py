"""Operator-level features on the meta device and the composed (sum of operator costs) regressor."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from perfzoo.features import meta, ops
from perfzoo.features.meta import MODEL_COLUMNS, featurise
from perfzoo.features.op_kinds import COSTED_KINDS, OP_COLUMNS, OP_ERROR_COLUMN, OP_FEATURES
from perfzoo.features.ops import (
    CACHE_BYTES,
    MetaKernelCache,
    OpTraceError,
    cached_bytes,
    op_aggregates,
    trace_step,
    traced_op_features,
)
from perfzoo.io import InputError
from perfzoo.models.builders import build_model
from perfzoo.regressors import ComposedRegressor, load_regressor, make_regressor
from step_models import IN, CachesOnFirstCall

REGISTRY = FlopCounterMode(display=False).flop_registry


def tiny_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))


def on_meta(build, shape, batch=2):
    with torch.device("meta"):
        return build(), torch.empty((batch, *shape))


def test_inference_trace_of_a_linear_has_its_matmul_and_exact_bytes():
    model, x = on_meta(lambda: nn.Linear(8, 4), (8,))
    table = trace_step(model, x, "inference", REGISTRY, "lin")
    assert list(table.columns) == OP_COLUMNS
    addmm = table[table["op"] == "aten.addmm.default"].iloc[0]
    assert addmm["kind"] == "matmul" and addmm["phase"] == "forward"
    assert addmm["flops"] == 2 * 2 * 8 * 4
    assert addmm["bytes_read"] == (4 + 2 * 8 + 8 * 4) * 4  # bias, input, transposed weight (float32)
    assert addmm["bytes_written"] == 2 * 4 * 4
    assert addmm["intensity"] == pytest.approx(128 / (208 + 32))
    views = table[table["kind"] == "view"]
    assert "aten.t.default" in set(views["op"]) and (views[["bytes_read", "bytes_written"]] == 0).all().all()


def test_training_trace_adds_backward_and_optimizer_and_matches_flop_counter():
    model, x = on_meta(tiny_cnn, (3, 8, 8))
    table = trace_step(model, x, "training", REGISTRY, "cnn")
    assert set(table["phase"]) == {"forward", "backward", "optimizer"}
    assert {"conv", "conv_backward", "norm", "pool", "softmax"} <= set(table["kind"])
    assert (table.loc[table["phase"] == "optimizer", "kind"].isin(["optimizer", "view"])).all()
    reference, x2 = on_meta(tiny_cnn, (3, 8, 8))  # the profiled step, counted by FlopCounterMode
    opt = torch.optim.SGD(reference.parameters(), lr=1e-3, momentum=0.9)
    with FlopCounterMode(display=False) as counter:
        out = reference(x2)
        nn.functional.cross_entropy(out, torch.zeros(2, dtype=torch.long, device="meta")).backward()
        opt.step()
    assert table["flops"].sum() == counter.get_total_flops() > 0
    inference = trace_step(*on_meta(tiny_cnn, (3, 8, 8)), "inference", REGISTRY, "cnn")
    assert set(inference["phase"]) == {"forward"}


def test_aggregates_sum_costed_kinds_and_leave_views_out():
    table = trace_step(*on_meta(tiny_cnn, (3, 8, 8)), "training", REGISTRY, "cnn")
    agg = op_aggregates(table)
    assert list(agg) == list(OP_FEATURES)
    costed = table[table["kind"] != "view"]
    assert sum(agg[f"op_{k}_count"] for k in COSTED_KINDS) == len(costed)
    moved = costed["bytes_read"] + costed["bytes_written"] - costed["bytes_cached"]
    assert sum(agg[f"op_{k}_bytes"] for k in COSTED_KINDS) == moved.sum()
    assert 0 < costed["bytes_cached"].sum() <= costed["bytes_read"].sum()  # a tiny step: all in cache
    flops = agg["op_conv_flops"] + agg["op_conv_backward_flops"] + agg["op_matmul_flops"]
    assert flops == table["flops"].sum()


class Recurrent(nn.Module):
    """One weight applied at every time step, as a recurrent layer does."""

    def __init__(self, steps: int = 5) -> None:
        super().__init__()
        self.cell, self.steps = nn.Linear(64, 64, bias=False), steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            x = self.cell(x)
        return x


def test_a_weight_read_at_every_time_step_is_read_from_cache():
    table = trace_step(*on_meta(Recurrent, (64,)), "inference", REGISTRY, "rnn")
    products = table[table["kind"] == "matmul"]
    weight = 64 * 64 * 4
    assert len(products) == 5 and (products["bytes_read"] == weight + 2 * 64 * 4).all()
    assert (products["bytes_cached"] == products["bytes_read"]).all()  # steady state: all in cache
    small = trace_step(*on_meta(Recurrent, (64,)), "inference", REGISTRY, "rnn", cache_bytes=weight - 1)
    assert (small.loc[small["kind"] == "matmul", "bytes_cached"] == 2 * 64 * 4).all()  # the weight never fits


def test_cache_is_least_recently_used_over_whole_storages():
    def op(*reads, writes=()):
        return {"_accesses": (tuple(reads), tuple(writes))}

    a, b, c = (1, 40, 40), (2, 40, 40), (3, 40, 80)  # (storage, bytes read, storage bytes)
    rows = [op(a), op(b), op(a), op(c, writes=[(4, 8, 8)])]
    assert cached_bytes(rows, capacity=100).tolist() == [0, 0, 40, 0]  # c evicts a and b, a evicts c
    assert cached_bytes(rows, capacity=1000).tolist() == [40, 40, 40, 40]  # warm: every storage stays
    assert cached_bytes([op((5, 10, 10)), op((5, 10, 20))], capacity=1000).tolist() == [0, 0]  # new storage


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


_LIB = torch.library.Library("perfzoo_test", "DEF")
_LIB.define("cpu_only(Tensor x) -> Tensor")
_LIB.impl("cpu_only", lambda x: x * 2, "CPU")


class NoMetaKernel(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.perfzoo_test.cpu_only(x)


@pytest.mark.parametrize(
    ("module", "op"), [(DataDependent, "_local_scalar_dense"), (NoMetaKernel, "perfzoo_test.cpu_only")]
)
def test_an_operator_the_tracer_cannot_follow_is_named_with_the_model(module, op):
    model, x = on_meta(module, (4,))
    with pytest.raises(OpTraceError, match=rf"model odd-1: .*{op}"):
        trace_step(model, x, "inference", REGISTRY, "odd-1")
    features, table = traced_op_features(lambda: on_meta(module, (4,))[0], x, "inference", REGISTRY, "odd-1")
    assert table is None and op in features[OP_ERROR_COLUMN]
    assert all(np.isnan(features[c]) for c in OP_FEATURES)  # missing, never zero


def test_featurise_carries_the_operator_features_and_table():
    tables: list[pd.DataFrame] = []
    feats, _ = featurise(tiny_cnn, (3, 8, 8), 2, "training", model_id="cnn", op_tables=tables)
    assert list(feats) == MODEL_COLUMNS and feats[OP_ERROR_COLUMN] == ""
    assert len(tables) == 1 and feats["op_conv_count"] == (tables[0]["kind"] == "conv").sum() > 0


# --------------------------------------------------------------------------- composed regressor

TRUE = {"op_matmul_flops": 2e-9, "op_elementwise_bytes": 1e-8, "op_norm_count": 0.01, "n_module_calls": 0.004}


def synthetic(n: int, seed: int = 0, overhead: float = 0.0) -> tuple[pd.DataFrame, np.ndarray]:
    """Rows whose latency is :data:`TRUE`'s costs exactly, plus a constant ``overhead`` per step."""
    rng = np.random.default_rng(seed)
    X = pd.DataFrame(0.0, index=range(n), columns=list(OP_FEATURES))
    X["op_matmul_flops"] = rng.uniform(1e8, 1e10, n)
    X["op_matmul_count"] = rng.integers(1, 50, n)
    X["op_elementwise_bytes"] = rng.uniform(1e6, 1e9, n)
    X["op_elementwise_count"] = rng.integers(1, 100, n)
    X["op_norm_count"] = rng.integers(0, 60, n)
    X["n_module_calls"] = rng.integers(1, 80, n)
    X["device"], X["is_training"], X["model_id"] = "cpu", 0.0, [f"m{i % 8}" for i in range(n)]
    y = overhead + sum(coef * X[name] for name, coef in TRUE.items())
    return X, y.to_numpy()


def bn_silu_cnn() -> nn.Module:  # BatchNorm and SiLU's backward run through decompositions in the trace
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.SiLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 4, 3, groups=4), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))


def small_encoder() -> nn.Module:
    return build_model("transformer", "encoder", {"d_model": 32, "heads": 2, "layers": 2}, 5, (16,))


def featurise_both_ways(monkeypatch, build, shape, mode, dtype, optimizer):
    """featurise with its two shared steps, and with the separate passes they stand in for."""
    separate = []
    monkeypatch.setattr(meta, "_separate_passes", lambda *a: separate.append(1) or SEPARATE_PASSES(*a))
    shared_tables: list = []
    shared = featurise(build, shape, 4, mode, dtype, "m", optimizer=optimizer, op_tables=shared_tables)
    assert not separate, "the shared steps gave way to the separate passes"
    monkeypatch.setattr(meta, "_two_steps", lambda *a, **k: None)
    separate_tables: list = []
    reference = featurise(build, shape, 4, mode, dtype, "m", optimizer=optimizer, op_tables=separate_tables)
    return (shared, shared_tables), (reference, separate_tables)


SEPARATE_PASSES = meta._separate_passes


def same_features(a: dict, b: dict) -> bool:
    """The same keys and values, a missing (NaN) value equal to a missing one."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)


@pytest.mark.parametrize(("build", "shape", "dtype"), [(bn_silu_cnn, (3, 8, 8), "float32"),
                                                       (small_encoder, (16,), "int64")])
@pytest.mark.parametrize(("mode", "optimizer"), [("inference", "sgd"), ("training", "sgd"), ("training", "adam")])
def test_shared_steps_record_what_the_separate_passes_record(monkeypatch, build, shape, dtype, mode, optimizer):
    # the FLOP count with the layer hooks, the operator trace and the memory simulation in the memory
    # simulation's two steps give the numbers of a pass each: model features, layer table and operator table
    (shared, shared_ops), (reference, reference_ops) = featurise_both_ways(monkeypatch, build, shape, mode,
                                                                           dtype, optimizer)
    features, layers = shared
    assert same_features(features, reference[0]), {k: (features[k], reference[0][k]) for k in features
                                                    if features[k] != reference[0][k]}
    assert layers.equals(reference[1])
    assert len(shared_ops) == len(reference_ops) and all(a.equals(b) for a, b in zip(shared_ops, reference_ops))
    assert features["flops"] > 0 and features["sim_peak_bytes"] > 0
    if optimizer == "adam" and mode == "training":  # Adam reads its step count: the trace stops, missing
        assert "_local_scalar_dense" in features[OP_ERROR_COLUMN] and not shared_ops
    else:
        assert features[OP_ERROR_COLUMN] == "" and len(shared_ops[0]) > 0


@pytest.mark.parametrize(("build", "shape", "model_calls"), [(bn_silu_cnn, (3, 8, 8), 1),
                                                               (CachesOnFirstCall, (IN,), 2)])
def test_an_inference_step_runs_once_unless_it_leaves_state_and_records_what_two_steps_record(
        monkeypatch, build, shape, model_calls):
    # a step that leaves the model as it found it is replayed once (FLOPs, layers and trace recorded in it); one
    # that leaves a cache is replayed again and traced there: every feature, layer and operator row is what both
    # steps replayed give
    import perfzoo.features.memory as memory

    calls = []

    def counted() -> nn.Module:
        model = build()
        model.register_forward_pre_hook(lambda *_: calls.append(1))
        return model

    shared_ops: list = []
    features, layers = featurise(counted, shape, 4, "inference", "float32", "m", op_tables=shared_ops)
    assert len(calls) == model_calls
    monkeypatch.setattr(memory, "_repeats_itself", lambda *_: lambda: False)
    calls.clear()
    both_ops: list = []
    both = featurise(counted, shape, 4, "inference", "float32", "m", op_tables=both_ops)
    assert len(calls) == 2 and same_features(features, both[0]) and layers.equals(both[1])
    assert len(shared_ops) == len(both_ops) == 1 and shared_ops[0].equals(both_ops[0])


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_features_without_the_operator_table_are_its_aggregates(mode):
    # the import path keeps no per-operator table: its op_* features are summed from the rows, as from the table
    tables: list = []
    with_table = featurise(bn_silu_cnn, (3, 8, 8), 4, mode, "float32", "m", op_tables=tables)[0]
    without = featurise(bn_silu_cnn, (3, 8, 8), 4, mode, "float32", "m")[0]
    assert same_features(with_table, without)
    assert {k: with_table[k] for k in OP_FEATURES} == op_aggregates(tables[0]) and with_table["op_conv_count"] > 0


def test_kernel_cache_reuses_fresh_outputs_and_never_a_view_of_an_input():
    cache, aten = MetaKernelCache(), torch.ops.aten
    a, b = torch.empty(4, 8, device="meta"), torch.empty(8, 3, device="meta")
    first, again = cache(aten.mm.default, (a, b), {}), cache(aten.mm.default, (a, b), {})
    assert cache.hits == 1 and again.shape == first.shape and again.stride() == first.stride()
    assert again.untyped_storage()._cdata != first.untyped_storage()._cdata  # a tensor of its own, as a kernel's
    x = torch.empty(2, 3, 4, device="meta")
    for _ in range(2):  # _unsafe_view has no alias annotation, yet its output shares the input's storage
        view = cache(aten._unsafe_view.default, (x, [6, 4]), {})
        assert view.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert cache.hits == 1


def test_kernel_cache_starts_afresh_at_its_bound():
    cache, aten = MetaKernelCache(max_entries=2), torch.ops.aten
    tensors = [torch.empty(n, 3, device="meta") for n in (1, 2, 3)]
    for t in tensors:
        cache(aten.neg.default, (t,), {})
    assert len(cache.outputs) == 1  # the third entry found two: cleared, then kept
    cache(aten.neg.default, (tensors[0],), {})
    assert cache.hits == 0  # the first was dropped with the rest


def test_a_warm_process_kernel_cache_changes_no_feature(monkeypatch):
    # featurising one model after others (the process's kernel cache answering their layers' shapes) gives the
    # numbers of a featurisation with a cold cache
    def featurised(build, shape, mode):
        return featurise(build, shape, 4, mode, "float32", "m")

    cold = meta.MetaKernelCache(max_entries=meta.KERNEL_CACHE_ENTRIES)
    monkeypatch.setattr(meta, "PROCESS_KERNELS", cold)
    monkeypatch.setattr(ops, "_FLOPS", {})  # the FLOP formulas' answers, cold too
    alone = {mode: featurised(bn_silu_cnn, (3, 8, 8), mode) for mode in ("inference", "training")}
    warm = meta.MetaKernelCache(max_entries=meta.KERNEL_CACHE_ENTRIES)
    monkeypatch.setattr(meta, "PROCESS_KERNELS", warm)
    featurised(tiny_cnn, (3, 8, 8), "training")
    featurised(bn_silu_cnn, (3, 8, 8), "inference")
    hits = warm.hits
    for mode in ("training", "inference"):
        features, layers = featurised(bn_silu_cnn, (3, 8, 8), mode)
        assert same_features(features, alone[mode][0])
        assert layers.equals(alone[mode][1])
    assert warm.hits > hits  # the cache did answer


def test_a_flop_formula_runs_once_per_argument_metadata(monkeypatch):
    monkeypatch.setattr(ops, "_FLOPS", {})
    calls, mm = [], torch.ops.aten.mm.default

    def formula(a, b, out_val=None):
        calls.append(out_val)
        return 2 * a.shape[0] * a.shape[1] * b.shape[1]

    def meta_tensor(*shape):
        return torch.empty(*shape, device="meta")

    b = meta_tensor(3, 4)
    assert ops._flops(formula, mm, (meta_tensor(2, 3), b), {}, meta_tensor(2, 4)) == 48
    assert ops._flops(formula, mm, (meta_tensor(2, 3), b), {}, meta_tensor(2, 4)) == 48
    assert len(calls) == 1  # the same shapes, strides and dtypes: answered from the cache
    assert ops._flops(formula, mm, (meta_tensor(5, 3), b), {}, meta_tensor(5, 4)) == 120
    assert ops._flops(formula, mm, (meta_tensor(5, 3).t().contiguous().t(), b), {}, meta_tensor(5, 4)) == 120
    assert len(calls) == 3  # other shapes, then other strides: the formula again
    for _ in range(2):  # a CPU tensor is not keyed (its values might matter): the formula every time
        assert ops._flops(formula, mm, (torch.empty(2, 3), b), {}, meta_tensor(2, 4)) == 48
    assert len(calls) == 5


def test_kernel_cache_answers_an_in_place_operator_with_its_argument_unless_it_changes_its_metadata():
    cache, aten = MetaKernelCache(), torch.ops.aten
    x, y = torch.empty(2, 3, device="meta"), torch.empty(2, 3, device="meta")
    assert cache(aten.relu_.default, (x,), {}) is x and cache.hits == 0
    assert cache(aten.relu_.default, (y,), {}) is y and cache.hits == 1  # same metadata: no kernel, itself
    with pytest.raises(RuntimeError):  # other metadata: the kernel runs, and refuses what it always refused
        cache(aten.add_.Tensor, (x, torch.empty(4, 3, device="meta")), {})
    for _ in range(2):  # unsqueeze_ changes its argument's shape: it always runs
        z = torch.empty(2, 3, device="meta")
        assert cache(aten.unsqueeze_.default, (z, 0), {}).shape == (1, 2, 3)
    assert cache.hits == 1


def test_a_model_flop_counter_mode_cannot_count_is_recounted_frozen_without_the_separate_passes(monkeypatch):
    class NoGradView(nn.Module):  # hands a module a view made under no_grad of a parameter
        def __init__(self) -> None:
            super().__init__()
            self.latent, self.proj = nn.Parameter(torch.empty(1, 4)), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.proj(self.latent.expand(x.shape[0], -1))

    separate = []
    monkeypatch.setattr(meta, "_separate_passes", lambda *a: separate.append(1) or SEPARATE_PASSES(*a))
    features, _ = featurise(NoGradView, (4,), 2, "inference", model_id="odd")  # counted with requires_grad off
    assert features["flops"] == 2 * 2 * 4 * 4 and features["trainable_params"] == 4 + 16 + 4
    assert not separate  # only that count ran again: the shared steps' trace and memory simulation stand
    monkeypatch.setattr(meta, "_frozen_count", lambda *a: None)  # a recount that fails: the separate passes
    again = featurise(NoGradView, (4,), 2, "inference", model_id="odd")[0]
    assert separate == [1] and pd.Series(again).equals(pd.Series(features))  # NaN where NaN


@pytest.mark.parametrize("weighting", ["none", "relative", "mape"])
@pytest.mark.parametrize("constant", [False, True])
def test_composed_recovers_known_coefficients(weighting, constant):
    X, y = synthetic(60, overhead=0.5 if constant else 0.0)
    params = {"constant_overhead": True} if constant else {}
    reg = make_regressor("composed", weighting=weighting, shrinkage=0.0, **params).fit(X, y)
    coef = reg.coefficients("cpu")
    true = {**TRUE, "overhead": 0.5} if constant else TRUE
    for name, value in true.items():
        assert coef[name] == pytest.approx(value, rel=1e-6)
    others = coef.drop([*true, *(["overhead_training"] if constant else [])])
    assert np.allclose(others.to_numpy(), 0.0, atol=1e-12)
    np.testing.assert_allclose(reg.predict(X), y, rtol=1e-6)


def test_composed_has_no_constant_per_step_unless_asked():
    X, y = synthetic(40, overhead=0.5)
    reg = ComposedRegressor(shrinkage=0.0).fit(X, y)
    assert not {"overhead", "overhead_training"} & set(reg.feature_names_)
    nothing = X.head(1).copy()
    nothing[[*OP_FEATURES, "n_module_calls"]] = 0.0
    assert reg.predict(nothing)[0] == 0.0  # no module call and no operator: no time
    with_constant = ComposedRegressor(shrinkage=0.0, constant_overhead=True).fit(X, y)
    assert with_constant.predict(nothing)[0] == pytest.approx(0.5, rel=1e-6)


def test_composed_refuses_a_file_fitted_on_other_per_step_terms(tmp_path):
    X, y = synthetic(30)
    path = tmp_path / "composed.json"
    ComposedRegressor(constant_overhead=True).fit(X, y).save(path)
    document = json.loads(path.read_text())
    del document["params"]["constant_overhead"]  # as a version before the parameter wrote it
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match="fitted on other terms .*overhead, overhead_training.*refit"):
        load_regressor(path).predict(X)


def test_composed_inner_cv_leaves_exact_costs_unshrunk():
    X, y = synthetic(60)
    reg = ComposedRegressor(shrinkage="cv").fit(X, y)  # unshrunk, it predicts every held-out model exactly
    assert reg.shrinkage_["cpu"] == 0.0
    np.testing.assert_allclose(reg.predict(X), y, rtol=1e-6)


def test_composed_shrinkage_pulls_the_per_kind_costs_to_the_pooled_fit():
    # two kinds with a per-byte cost 10x apart: the stronger the shrinkage, the closer their fitted costs
    X, y = synthetic(60)
    extra_elementwise, norm_per_byte = 1e-7, 1e-8
    y = y + extra_elementwise * X["op_elementwise_bytes"].to_numpy()
    X["op_norm_bytes"] = X["op_elementwise_bytes"].to_numpy()[::-1] * 0.5
    y = y + norm_per_byte * X["op_norm_bytes"].to_numpy()
    ratio = []
    for strength in (0.0, 1.0, 1e4):
        coef = ComposedRegressor(shrinkage=strength).fit(X, y).coefficients("cpu")
        ratio.append(coef["op_elementwise_bytes"] / coef["op_norm_bytes"])
    true_ratio = (TRUE["op_elementwise_bytes"] + extra_elementwise) / norm_per_byte  # unshrunk: recovered
    assert ratio[0] == pytest.approx(true_ratio, rel=1e-3)
    assert ratio[0] > ratio[1] > ratio[2] and ratio[2] == pytest.approx(1.0, rel=0.05)


def test_composed_holds_a_term_the_training_steps_barely_run_near_its_prior():
    # a loss-sized softmax (<= 51 KB) whose bytes track a per-sample cost no other term carries (up to 0.5 ms of a
    # 2-30 ms step): unfloored, the fit prices its bytes at tens of times the pooled cost per byte, which a 25 MB
    # attention softmax would then pay in full
    X, y = synthetic(60)
    X["op_softmax_bytes"] = np.random.default_rng(1).uniform(800, 51_200, len(X))
    X["op_softmax_count"] = 2.0
    y = y + 1e-5 * X["op_softmax_bytes"].to_numpy()
    free = ComposedRegressor(min_prior_share=0.0).fit(X, y).coefficients("cpu")
    held = ComposedRegressor().fit(X, y).coefficients("cpu")  # default: priced as >= 0.1 % of the step
    assert free["op_softmax_bytes"] > 2e-7
    assert held["op_softmax_bytes"] < 3e-8  # near the pooled ~1e-8 per byte
    for name in ("op_matmul_flops", "op_elementwise_bytes"):  # terms the steps exercise keep their own fit
        assert held[name] == pytest.approx(free[name], rel=0.01)
        assert held[name] == pytest.approx(TRUE[name], rel=0.05)
    with pytest.raises(InputError, match=r"min_prior_share 1.5 must be a number in \[0, 1\)"):
        ComposedRegressor(min_prior_share=1.5).fit(X, y)


def _with_measured_times(X: pd.DataFrame, per_byte: dict[str, float]) -> pd.DataFrame:
    """``X`` with each costed kind's measured time: ``per_byte[kind]`` times its bytes (0 for the others)."""
    from perfzoo.regressors.composed import COSTED_KINDS

    times = {f"optime_{k}_ms": per_byte.get(k, 0.0) * X[f"op_{k}_bytes"] if k in per_byte else 0.0
             for k in COSTED_KINDS}
    return X.assign(**times)


def test_composed_shrinks_each_per_byte_cost_towards_its_measured_one_where_op_times_exist():
    # optimizer bytes grow with the elementwise bytes: the latency alone cannot tell their costs apart
    X, y = synthetic(60)
    optimizer_per_byte = 5e-8
    X["op_optimizer_bytes"], X["op_optimizer_count"] = 0.2 * X["op_elementwise_bytes"], 10.0
    y = y + optimizer_per_byte * X["op_optimizer_bytes"].to_numpy()
    measured = {"elementwise": TRUE["op_elementwise_bytes"], "optimizer": optimizer_per_byte}
    gpu = X.assign(device="gpu")  # a device without per-op times: the pooled prior there
    timed = pd.concat([_with_measured_times(X, measured), gpu.assign(**{f"optime_{k}_ms": np.nan for k in measured})],
                      ignore_index=True)
    strong = ComposedRegressor(shrinkage=1e4)
    with_times = strong.fit(timed, np.concatenate([y, y]))
    coef = with_times.coefficients("cpu")
    assert coef["op_optimizer_bytes"] / coef["op_elementwise_bytes"] == pytest.approx(5.0, rel=0.05)
    assert with_times.measured_prior_kinds_["cpu"] == ["elementwise", "optimizer"]
    assert with_times.measured_prior_kinds_["gpu"] == []
    assert with_times.measured_prior_kinds_["*"] == []  # two devices together: not one device's measured costs
    one_device = ComposedRegressor(shrinkage=1e4).fit(_with_measured_times(X, measured), y)
    assert one_device.measured_prior_kinds_["*"] == ["elementwise", "optimizer"]
    on_gpu = with_times.coefficients("gpu")
    assert on_gpu["op_optimizer_bytes"] / on_gpu["op_elementwise_bytes"] == pytest.approx(1.0, rel=0.05)
    without = ComposedRegressor(shrinkage=1e4).fit(X, y).coefficients("cpu")  # pooled prior: one cost per byte
    assert without["op_optimizer_bytes"] / without["op_elementwise_bytes"] == pytest.approx(1.0, rel=0.05)
    # the measured times are labels: never a feature, never read to predict
    assert not [c for c in with_times.feature_names_ + with_times.fallback_model_.feature_names_ if "optime" in c]
    np.testing.assert_allclose(with_times.predict(X), with_times.predict(_with_measured_times(X, measured)))


def test_composed_shrinks_each_per_call_cost_towards_the_devices_measured_tiny_call():
    # elementwise calls grow with the elementwise bytes (every operand ~1 MB): the latency alone cannot tell a cost
    # per call from one per byte, and the pooled fit's per-call cost is what it gives the calls
    from perfzoo.hardware import CALL_COST_COLUMNS

    X, y = synthetic(60)
    X["op_elementwise_count"] = X["op_elementwise_bytes"] / 1e6
    y = sum(coef * X[name] for name, coef in TRUE.items()).to_numpy() + 2e-3 * X["op_elementwise_count"].to_numpy()
    tiny_us = {"elementwise": 2.0, "matmul": 5.0}  # µs; the kinds the device has not timed: NaN columns
    measured = X.assign(**{c: tiny_us.get(kind, np.nan) for kind, c in CALL_COST_COLUMNS.items()})
    gpu = X.assign(device="gpu", **{c: np.nan for c in CALL_COST_COLUMNS.values()})  # a device without them
    both = ComposedRegressor(shrinkage=1e4).fit(pd.concat([measured, gpu], ignore_index=True), np.concatenate([y, y]))
    assert both.coefficients("cpu")["op_elementwise_count"] == pytest.approx(2e-3, rel=0.05)  # ms per call
    assert both.coefficients("cpu")["op_matmul_count"] == pytest.approx(5e-3, rel=0.05)
    assert both.measured_call_kinds_["cpu"] == ["matmul", "elementwise"]
    assert both.measured_call_kinds_["gpu"] == both.measured_call_kinds_["*"] == []  # two devices: no one's costs
    pooled = ComposedRegressor(shrinkage=1e4).fit(X, y).coefficients("cpu")  # without: the pooled per-call cost
    assert pooled["op_elementwise_count"] == pytest.approx(both.coefficients("gpu")["op_elementwise_count"])
    assert abs(pooled["op_elementwise_count"] - 2e-3) > 0.5e-3
    one = ComposedRegressor(shrinkage=1e4).fit(measured, y)
    assert one.measured_call_kinds_["*"] == one.measured_call_kinds_["cpu"]  # one device: its own costs
    from perfzoo.regressors.composed import COSTED_KINDS, _FitData, _measured_calls

    two = np.vstack([np.full(len(COSTED_KINDS), 2e-3), np.full(len(COSTED_KINDS), 3e-3)])
    two[:, 0] = 2e-3  # the first kind measured alike on both rows' devices
    priors = _measured_calls(_FitData(np.zeros((2, 1)), np.ones(2), call_costs=two))
    assert priors[0] == 2e-3 and np.isnan(priors[1:]).all()  # devices that differ: no one's cost, never a median
    # device constants: never a feature of composed or its fallback, not needed to predict
    assert not [c for c in both.feature_names_ + both.fallback_model_.feature_names_ if c.startswith("device_")]
    np.testing.assert_allclose(both.predict(X), both.predict(measured))


def test_composed_keeps_the_pooled_prior_for_a_kind_measured_in_too_few_configs():
    from perfzoo.regressors.composed import MIN_TIMED_ROWS

    X, y = synthetic(40)
    timed = _with_measured_times(X, {"elementwise": 1e-6})  # 100x the true cost, but in too few configs
    timed.loc[MIN_TIMED_ROWS - 1:, "optime_elementwise_ms"] = np.nan
    reg = ComposedRegressor(shrinkage=1e4).fit(timed, y)
    assert reg.measured_prior_kinds_["cpu"] == []
    assert reg.coefficients("cpu")["op_elementwise_bytes"] < 1e-7


def test_a_blend_gives_its_members_that_take_them_the_measured_op_times():
    from perfzoo.regressors.blend import BlendRegressor

    blend = BlendRegressor(op_times_path="results/features/op_times.parquet")
    assert blend._member("composed").op_times_path == "results/features/op_times.parquet"
    assert "op_times_path" not in blend._member("poly_lasso").get_params()
    assert BlendRegressor()._member("composed").op_times_path is None


def test_composed_inner_cv_needs_model_ids_and_mape_weighting_no_shrinkage():
    X, y = synthetic(20)
    with pytest.raises(InputError, match="model_id"):
        ComposedRegressor(shrinkage="cv").fit(X.drop(columns="model_id"), y)
    with pytest.raises(InputError, match="shrinkage"):
        ComposedRegressor(weighting="mape", shrinkage=1.0).fit(X, y)


def test_composed_step_terms_cost_a_model_feature_once_per_step():
    X, y = synthetic(40)
    X["weight_bytes"] = np.linspace(1e6, 4e8, len(X))
    y = y + 2e-9 * X["weight_bytes"].to_numpy()
    reg = ComposedRegressor(step_terms=("n_module_calls", "weight_bytes"), shrinkage=0.0)
    coef = reg.fit(X, y).coefficients("cpu")
    assert coef["weight_bytes"] == pytest.approx(2e-9, rel=1e-6)


def test_composed_names_a_kind_never_seen_in_training_and_does_not_cost_it_zero():
    X, y = synthetic(40)
    reg = ComposedRegressor(weighting="none").fit(X, y)
    new = X.head(2).copy()
    new.loc[1, ["op_pool_bytes", "op_pool_count"]] = [5e8, 3]
    unseen = reg.unseen_kinds(new)
    assert unseen["kind"].tolist() == ["pool"] and unseen["row"].tolist() == [1]
    assert 0 < unseen["share"].iloc[0] < 1
    assert reg.predict(new)[1] > reg.predict(X.head(2))[1]
    assert any("'pool' never seen in training" in note for note in reg.prediction_notes(new))


def test_composed_falls_back_for_a_config_without_operator_trace():
    X, y = synthetic(40)
    X["flops"] = X["op_matmul_flops"]
    X[OP_ERROR_COLUMN] = ""
    reg = ComposedRegressor(fallback="linear").fit(X, y)
    new = X.head(3).copy()
    new.loc[2, list(OP_FEATURES)] = np.nan
    new.loc[2, OP_ERROR_COLUMN] = "model m: aten.nonzero.default depends on tensor values"
    pred = reg.predict(new)
    assert np.isfinite(pred).all() and pred[2] > 0
    report = reg.fallback_rows(new)
    reason = new.loc[2, OP_ERROR_COLUMN]
    assert report.to_dict("records") == [{"row": 2, "fallback": "linear", "reason": reason}]
    assert any("aten.nonzero" in note and "'linear'" in note for note in reg.prediction_notes(new))
    new.loc[2, "flops"] = np.nan  # the fallback's own feature: the row rests on a median unless named
    assert reg.missing_features(new) == [[], [], ["flops"]]
    new.loc[0, "flops"] = np.nan  # a composed row does not use it
    assert reg.missing_features(new)[0] == []


def test_composed_falls_back_naming_a_missing_step_feature():
    X, y = synthetic(40)
    X["flops"] = X["op_matmul_flops"]
    reg = ComposedRegressor(fallback="linear").fit(X, y)
    new = X.head(3).copy()
    new.loc[1, "n_module_calls"] = np.nan  # its operator trace is complete
    new.loc[2, list(OP_FEATURES)] = np.nan
    report = reg.fallback_rows(new)
    assert report["row"].tolist() == [1, 2]
    assert report["reason"].tolist() == ["n_module_calls missing", "operator features missing"]
    assert np.isfinite(reg.predict(new)).all()


def test_composed_save_load_round_trip(tmp_path):
    X, y = synthetic(30)
    reg = ComposedRegressor().fit(X, y)
    reg.save(tmp_path / "composed.json")
    loaded = load_regressor(tmp_path / "composed.json")
    assert isinstance(loaded, ComposedRegressor)
    np.testing.assert_array_equal(loaded.predict(X), reg.predict(X))
    assert loaded.fallback_model_.kind == "linear"


def test_only_the_composed_regressor_sees_operator_features_in_fit_split():
    from perfzoo.dataset.splits import make_split
    from perfzoo.fitting import fit_split, unsupported_reason

    X, y = synthetic(40)
    data = X.assign(row_id=[f"r{i:03d}" for i in range(40)], model_id=[f"m{i}" for i in range(40)],
                    mode="inference", batch=1, family=[f"f{i % 4}" for i in range(40)], label="x",
                    flops=X["op_matmul_flops"], latency_ms=y)
    split = make_split("leave_one_family_out", data, {"seed": 1337, "random_fractions": [0.7, 0.15, 0.15]})
    params = {"weighting": "none", "shrinkage": 0.0}
    preds, models, _ = fit_split(data, split, "latency_ms", "composed", params)
    np.testing.assert_allclose(preds["y_pred"], preds["y_true"], rtol=1e-6)  # exact synthetic sum
    _, linear, _ = fit_split(data, split, "latency_ms", "linear")
    assert not any(c.startswith("op_") for m in linear.values() for c in m.feature_names_)
    _, with_ops, _ = fit_split(data, split, "latency_ms", "linear", operator_features=True)
    assert "op_matmul_flops" in next(iter(with_ops.values())).feature_names_
    assert unsupported_reason("composed", "peak_mem_mb") is not None


# --------------------------------------------------------------------------- composed blended with poly_lasso


def blend_frame(n: int = 40) -> tuple[pd.DataFrame, np.ndarray]:
    X, y = synthetic(n)
    X["flops"], X["params"] = X["op_matmul_flops"], X["op_elementwise_bytes"] / 4
    return X, y


def test_blend_is_the_geometric_mean_of_its_members_each_fitted_as_on_its_own():
    X, y = blend_frame()
    blend = make_regressor("composed_blend").fit(X, y)
    composed = make_regressor("composed").fit(X, y)
    poly = make_regressor("poly_lasso").fit(X.drop(columns=list(OP_FEATURES)), y)
    assert not any(c in OP_FEATURES for c in blend.members_[1].feature_names_)  # poly_lasso as on its own
    new = X.tail(5)
    expected = np.sqrt(composed.predict(new) * poly.predict(new))
    np.testing.assert_allclose(blend.predict(new), expected, rtol=1e-12)
    np.testing.assert_allclose(blend.member_predictions(new), np.column_stack(
        [composed.predict(new), poly.predict(new)]), rtol=1e-12)


def test_blend_passes_on_member_notes():
    X, y = blend_frame()
    blend = make_regressor("composed_blend").fit(X, y)
    new = X.head(2).copy()
    new.loc[1, ["op_pool_bytes", "op_pool_count"]] = [5e8, 3]  # a kind composed never saw
    assert np.isfinite(blend.predict(new)).all()
    assert any(n.startswith("composed: operator kind 'pool' never seen") for n in blend.prediction_notes(new))


def test_blend_gives_no_number_where_a_member_gives_none():
    rng = np.random.default_rng(3)
    X = pd.DataFrame({"device": "cpu", "mode": "training", "flops": rng.uniform(1e9, 1e10, 40),
                      "sim_heap_peak_bytes": rng.uniform(1e7, 1e9, 40), "sim_activation_bytes": rng.uniform(1e6, 1e8, 40),
                      "sim_op_kinds": rng.integers(5, 30, 40).astype(float), "sim_onednn_conv": 1.0,
                      "sim_cl_depthwise_weight_bytes": 0.0})
    y = 30 + X["sim_heap_peak_bytes"] / 2**20
    blend = make_regressor("composed_blend", members=("memory_sim", "linear")).fit(X, y)
    new = X.head(3).copy()
    new.loc[1, "sim_heap_peak_bytes"] = np.nan  # the simulation failed on this model: memory_sim gives no number
    members = blend.member_predictions(new)
    assert np.isnan(members[1, 0]) and np.isfinite(members[1, 1])
    pred = blend.predict(new)
    assert np.isnan(pred[1])  # never the other member's number alone
    np.testing.assert_allclose(pred[[0, 2]], np.sqrt(members[[0, 2], 0] * members[[0, 2], 1]), rtol=1e-12)


def test_blend_round_trips_with_its_members_and_refuses_bad_members(tmp_path):
    X, y = blend_frame()
    blend = make_regressor("composed_blend").fit(X, y)
    blend.save(tmp_path / "blend.json")
    loaded = load_regressor(tmp_path / "blend.json")
    assert [m.kind for m in loaded.members_] == ["composed", "poly_lasso"]
    np.testing.assert_array_equal(loaded.predict(X), blend.predict(X))
    for members in (("composed",), ("composed", "composed"), ("composed", "random_forrest"),
                    ("composed_blend", "linear")):
        with pytest.raises(InputError, match="members"):
            make_regressor("composed_blend", members=members).fit(X, y)


def blend_split_data() -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`blend_frame` as a dataset of four families, and its leave-one-family-out split."""
    from perfzoo.dataset.splits import make_split

    X, y = blend_frame()
    data = X.assign(row_id=[f"r{i:03d}" for i in range(40)], model_id=[f"m{i}" for i in range(40)],
                    mode="inference", batch=1, family=[f"f{i % 4}" for i in range(40)], label="x", latency_ms=y)
    return data, make_split("leave_one_family_out", data, {"seed": 1337, "random_fractions": [0.7, 0.15, 0.15]})


def test_a_blend_takes_the_member_its_own_fit_job_saved_on_the_same_rows_and_predicts_the_same(tmp_path):
    from perfzoo.fitting import fit_split, load_models, save_models
    from perfzoo.regressors.base import FittedModels

    data, split = blend_split_data()
    _, poly, _ = fit_split(data, split, "latency_ms", "poly_lasso")  # the member's own fit job
    save_models(tmp_path / "poly.json", poly, {})
    saved = list(load_models(tmp_path / "poly.json")[0].values())
    fresh, fresh_models, fresh_notes = fit_split(data, split, "latency_ms", "composed_blend")
    reused, models, notes = fit_split(data, split, "latency_ms", "composed_blend", reusable=saved)
    assert notes["reused_fits"] == len(models) == 4 and "reused_fits" not in fresh_notes
    assert reused.equals(fresh)  # the same predictions, to the bit
    assert all(any(m.members_[1] is s for s in saved) for m in models.values())  # taken, not refitted
    assert ({f: m.to_document()["payload"] for f, m in models.items()}
            == {f: m.to_document()["payload"] for f, m in fresh_models.items()})  # the same saved members
    other_rows = data.assign(latency_ms=data["latency_ms"] * 1.01)  # fitted on other labels: fitted again
    _, other, _ = fit_split(other_rows, split, "latency_ms", "poly_lasso")
    _, _, notes = fit_split(data, split, "latency_ms", "composed_blend", reusable=other.values())
    assert "reused_fits" not in notes
    X = data.drop(columns=list(OP_FEATURES))  # other parameters: fitted again
    fitted = FittedModels([FittedModels().fit(make_regressor("poly_lasso", degree=1), X, data["latency_ms"])])
    fitted.fit(make_regressor("poly_lasso"), X, data["latency_ms"])
    assert fitted.reused == 0
    fitted.fit(make_regressor("poly_lasso", degree=1), X, data["latency_ms"])
    assert fitted.reused == 1


def test_the_fit_rule_gives_a_blend_the_models_of_its_members_fitted_on_their_own_and_fits_those_first(tmp_path):
    from conftest import copy_workflow, snakemake, tiny_config

    config = tiny_config()
    config["fit"]["regressors"] = ["poly_lasso", "composed", "composed_blend", "memory_sim", "memory_blend"]
    folder = copy_workflow(tmp_path / "wf", config)
    jobs = re.split(r"^\[.*\]$", snakemake(folder, "-n", "--forceall", cores=None).stdout, flags=re.M)
    fits = {line.split("regressor=")[1].strip(): job for job in jobs if job.startswith("\nrule fit:")
            for line in job.splitlines() if "wildcards:" in line and "target=latency_ms" in line}
    assert "results/fit/latency_ms/poly_lasso/random.models.json" in fits["composed_blend"]
    assert "results/fit/latency_ms/composed/" not in fits["composed_blend"]  # composed reads the operator times
    assert {"poly_lasso", "memory_sim"} <= {m for m in ("poly_lasso", "memory_sim", "composed")
                                            if f"results/fit/latency_ms/{m}/random.models.json" in fits["memory_blend"]}
    assert "priority: 1" in fits["poly_lasso"] and "priority: 1" not in fits["composed"]


def test_the_fit_rule_gives_operator_features_to_the_blend_and_fits_it_on_latency_only():
    from perfzoo.fitting import OPERATOR_FEATURE_REGRESSORS, unsupported_reason

    assert {"composed", "composed_optime", "composed_blend"} <= OPERATOR_FEATURE_REGRESSORS
    assert "poly_lasso" not in OPERATOR_FEATURE_REGRESSORS
    assert unsupported_reason("composed_blend", "peak_mem_mb") is not None
    assert unsupported_reason("composed_blend", "latency_ms") is None


@pytest.mark.parametrize("build, shape", [
    (lambda: nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)), (64,)),  # the shared steps
    (lambda: nn.LSTM(6, 8, batch_first=True), (7, 6)),  # an LSTM: the separate passes
])
def test_the_cache_capacity_reaches_the_operator_table_on_both_featurisation_paths(build, shape):
    tables = {}
    for capacity in (0, CACHE_BYTES):
        tables[capacity] = []
        featurise(build, shape, 4, "inference", model_id="m", op_tables=tables[capacity], cache_bytes=capacity)
    without, with_cache = tables[0][0], tables[CACHE_BYTES][0]
    assert (without["bytes_cached"] == 0).all() and with_cache["bytes_cached"].sum() > 0
    assert without.drop(columns="bytes_cached").equals(with_cache.drop(columns="bytes_cached"))
