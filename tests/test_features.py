"""Tests for static model features on the meta device (perfzoo.features.meta)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

import perfzoo
from perfzoo.features.meta import CATEGORIES, LAYER_COLUMNS, MODEL_COLUMNS, featurise
from perfzoo.io import InputError

FLOAT = 4  # bytes per float32 value


def tiny_cnn() -> nn.Module:
    """conv -> bn -> relu -> maxpool -> flatten -> linear on (3, 8, 8) inputs."""
    return nn.Sequential(
        nn.Conv2d(3, 4, kernel_size=3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 5),
    )


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


class ShapeBranch(nn.Module):
    """Python control flow on a shape: runs on meta, but torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(-1) > 4:
            return self.fc(x)
        return x


# --------------------------------------------------------------------------- hand-computed CNN


def test_tiny_cnn_inference_matches_hand_computation() -> None:
    b = 2
    feats, table = featurise(tiny_cnn, (3, 8, 8), b, "inference", model_id="tiny")

    conv_flops = 2 * b * 4 * 3 * 3 * 3 * 8 * 8  # 2 * N * C_out * C_in * k^2 * H_out * W_out
    fc_flops = 2 * b * 64 * 5
    assert feats["flops"] == feats["flops_fw"] == conv_flops + fc_flops
    assert feats["macs"] == (conv_flops + fc_flops) / 2

    params = (4 * 3 * 9 + 4) + (4 + 4) + (64 * 5 + 5)
    assert feats["params"] == feats["trainable_params"] == params
    bn_buffers = (4 + 4) * FLOAT + 8  # running mean/var + int64 num_batches_tracked
    assert feats["weight_bytes"] == params * FLOAT + bn_buffers

    conv_out = b * 4 * 8 * 8 * FLOAT
    pool_out = b * 4 * 4 * 4 * FLOAT
    out_bytes = [conv_out, conv_out, conv_out, pool_out, pool_out, b * 5 * FLOAT]
    assert table["out_bytes"].tolist() == out_bytes
    assert feats["activation_bytes"] == sum(out_bytes)
    assert feats["input_bytes"] == b * 3 * 8 * 8 * FLOAT
    assert feats["train_mem_estimate_bytes"] == feats["weight_bytes"] + sum(out_bytes)

    counts = {k: feats[k] for k in MODEL_COLUMNS if k.startswith("n_")}
    assert counts == {"n_layers": 6, "n_conv": 1, "n_linear": 1, "n_norm": 1, "n_act": 1, "n_pool": 1,
                      "n_attention": 0, "n_dropout": 0, "n_embedding": 0,
                      "n_module_calls": 7}  # fmt: skip  (the Sequential and its six layers)
    assert feats["depth"] == 1

    # Gianniti, per sample, C_out = output values of the layer
    conv_c = 256  # 4 channels x 8 x 8
    expected = [
        (9 * 3 * conv_c, (2 * 9 * 3 + 1) * conv_c),  # conv
        (5 * conv_c + 64 - 2, 8 * conv_c + 64 - 1),  # batchnorm, C_n = 8 * 8
        (3 * conv_c, 4 * conv_c),  # relu
        (4 * 64, 5 * 64),  # maxpool 2x2 on 64 outputs
        (0, 0),  # flatten
        (64 * 5, 2 * 64 * 5),  # linear
    ]
    assert list(zip(table["c_fw"], table["c_bw"], strict=True)) == [(b * f, b * w) for f, w in expected]
    assert feats["complexity_fw"] == b * sum(f for f, _ in expected)
    assert feats["complexity_bw"] == b * sum(w for _, w in expected)
    assert table["category"].tolist() == ["conv_fc", "norm", "relu_drop", "pool_s2", "other", "conv_fc"]
    assert table["flops"].tolist() == [conv_flops, 0, 0, 0, 0, fc_flops]
    assert table["name"].tolist() == ["0", "1", "2", "3", "4", "5"]


def test_tiny_cnn_training_counts_backward_and_loss() -> None:
    b = 2
    feats, table = featurise(tiny_cnn, (3, 8, 8), b, "training", model_id="tiny")
    conv_flops = 2 * b * 4 * 3 * 9 * 64
    fc_flops = 2 * b * 64 * 5
    # backward: conv weight grad only (input needs no grad), linear weight + input grads
    assert feats["flops_fw"] == conv_flops + fc_flops
    assert feats["flops"] == 2 * conv_flops + 3 * fc_flops
    assert feats["macs"] == feats["flops_fw"] / 2
    loss = table.iloc[-1]
    assert (loss["type"], loss["category"]) == ("Loss", "other")
    assert (loss["c_fw"], loss["c_bw"]) == (b * (4 * 5 - 1), b * (5 + 1))
    assert feats["n_layers"] == 6 and len(table) == 7
    assert feats["train_mem_estimate_bytes"] == 4 * feats["weight_bytes"] + feats["activation_bytes"]


def test_depthwise_conv_backward_is_not_overcounted() -> None:
    def depthwise() -> nn.Module:
        return nn.Conv2d(8, 8, kernel_size=3, padding=1, groups=8, bias=False)

    feats, _ = featurise(depthwise, (8, 6, 6), 2, "training")
    fw = 2 * 2 * 8 * 1 * 9 * 36
    assert feats["flops_fw"] == fw
    assert feats["flops"] == 2 * fw  # weight gradient costs as much as the forward, not 8x more


def test_pool_strides_and_sequence_layers() -> None:
    def pools() -> nn.Module:
        return nn.Sequential(
            nn.MaxPool2d(3, stride=1, padding=1), nn.AdaptiveAvgPool2d(4), nn.AdaptiveAvgPool2d(1)
        )

    _, table = featurise(pools, (2, 4, 4), 1, "inference")
    assert table["category"].tolist() == ["pool_s1", "pool_s1", "pool_s2"]
    assert table["c_fw"].tolist() == [9 * 32, 1 * 32, 16 * 2]

    def tokens() -> nn.Module:
        return nn.Sequential(nn.Embedding(100, 16), nn.LayerNorm(16), nn.Linear(16, 8))

    b, seq = 3, 10
    feats, table = featurise(tokens, (seq,), b, "inference", input_dtype="int64")
    assert table["category"].tolist() == ["embedding", "norm", "conv_fc"]
    assert table["c_fw"].tolist() == [0, b * (5 * seq * 16 + 16 - 2), b * seq * 16 * 8]
    assert feats["flops"] == 2 * b * seq * 16 * 8
    assert feats["n_embedding"] == 1 and feats["input_bytes"] == b * seq * 8


class _Recurrent(nn.Module):
    """A GRU over 20 time steps and a head: two child modules, hundreds of operators."""

    def __init__(self) -> None:
        super().__init__()
        self.gru, self.head = nn.GRU(8, 16, batch_first=True), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(x)[0][:, -1])


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_module_calls_count_calls_of_modules_not_the_operators_they_loop_over(mode: str) -> None:
    feats, _ = featurise(_Recurrent, (20, 8), 2, mode)
    assert feats["n_module_calls"] == 3  # the model, its GRU and its head, in either mode
    assert feats["op_elementwise_count"] > 20 * feats["n_module_calls"]  # the GRU's gates, per time step


class _HeldOutside(nn.Module):
    """A CNN whose forward also calls a module it holds outside its module tree (in a plain list)."""

    def __init__(self) -> None:
        super().__init__()
        self.cnn = tiny_cnn()
        self.outside = [nn.Linear(5, 5)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outside[0](self.cnn(x))


def _with_own_hook() -> nn.Module:
    """:class:`_HeldOutside` with a forward pre-hook of its own on the convolution (it runs no operator)."""
    model = _HeldOutside()
    model.cnn[0].register_forward_pre_hook(lambda module, args: None)
    return model


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_layer_rows_are_the_same_through_global_hooks_and_hooks_on_each_module(mode: str) -> None:
    """A model without hooks of its own is recorded by two global module hooks, one with hooks by hooks on each
    module (so that its own run first, as before); both record the model's modules only, with the same rows."""
    from perfzoo.features.meta import _Recorder

    model = _with_own_hook()
    for attached, expected in ((_HeldOutside(), 2), (model, 2 * len(list(model.modules())))):
        handles = _Recorder({}, lambda: 0).attach(attached)
        for handle in handles:
            handle.remove()
        assert len(handles) == expected
    feats_global, table_global = featurise(_HeldOutside, (3, 8, 8), 2, mode, model_id="m")
    feats_each, table_each = featurise(_with_own_hook, (3, 8, 8), 2, mode, model_id="m")
    assert table_global.equals(table_each)
    layers = [f"cnn.{i}" for i in range(6)] + (["loss"] if mode == "training" else [])
    assert list(table_global["name"]) == layers  # not the Linear held outside the module tree
    assert feats_global["n_module_calls"] == feats_each["n_module_calls"] == 8  # the model, its CNN and six layers
    assert feats_global == feats_each


# --------------------------------------------------------------------------- scaling laws


def test_mlp_training_is_about_three_times_inference() -> None:
    inference, _ = featurise(mlp, (256,), 16, "inference")
    training, _ = featurise(mlp, (256,), 16, "training")
    ratio = training["flops"] / inference["flops"]
    assert 2.5 <= ratio <= 3.0  # < 3: the first layer needs no input gradient
    assert training["flops_fw"] == inference["flops"]


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_flops_and_complexity_scale_linearly_in_batch(mode: str) -> None:
    one, _ = featurise(tiny_cnn, (3, 8, 8), 1, mode)
    many, _ = featurise(tiny_cnn, (3, 8, 8), 7, mode)
    for key in ("flops", "flops_fw", "activation_bytes", "input_bytes", "complexity_fw", "complexity_bw"):
        assert many[key] == 7 * one[key], key
    assert many["params"] == one["params"] and many["weight_bytes"] == one["weight_bytes"]


# --------------------------------------------------------------------------- real models


def test_torchvision_resnet18() -> None:
    import torchvision

    feats, table = featurise(torchvision.models.resnet18, (3, 64, 64), 2, "inference", model_id="rn18")
    real = torchvision.models.resnet18()
    assert feats["params"] == sum(p.numel() for p in real.parameters())
    assert math.isfinite(feats["flops"]) and feats["flops"] > 0
    assert (feats["n_conv"], feats["n_linear"], feats["n_norm"]) == (20, 1, 20)
    assert feats["n_act"] == 17  # each BasicBlock calls its ReLU twice
    assert feats["graph_nodes"] > 0 and feats["graph_edges"] > 0 and feats["graph_error"] == ""
    assert list(table.columns) == LAYER_COLUMNS
    assert table["layer_idx"].tolist() == list(range(len(table)))
    assert set(table["category"]) <= set(CATEGORIES)
    assert (table["model_id"] == "rn18").all() and (table["batch"] == 2).all()
    assert table["flops"].sum() == feats["flops"]  # resnet18's FLOPs all happen inside leaf modules


def test_timm_vit_tiny() -> None:
    import timm

    def build() -> nn.Module:
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64)

    feats, _ = featurise(build, (3, 64, 64), 2, "training", model_id="vit")
    assert feats["params"] == sum(p.numel() for p in build().parameters())
    assert math.isfinite(feats["flops"]) and feats["flops"] > feats["flops_fw"] > 0
    assert feats["n_attention"] == 12
    assert list(feats) == MODEL_COLUMNS


BIG_ENCODER_SCRIPT = textwrap.dedent(
    """
    import json, resource
    from torch import nn
    from perfzoo.features.meta import featurise

    VOCAB, D, HEADS, FF, LAYERS, SEQ = 32000, 4096, 32, 16384, 12, 128

    class TokenEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D)
            layer = nn.TransformerEncoderLayer(D, HEADS, FF, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)

        def forward(self, tokens):
            return self.encoder(self.embed(tokens))

    def peak_rss():
        # VmHWM: this process's own high-water mark; after fork/exec ru_maxrss also holds the
        # parent's (pytest's) peak on Linux, so it is only the fallback
        try:
            with open("/proc/self/status") as status:
                return next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmHWM:"))
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    featurise(lambda: nn.Linear(4, 4), (4,), 1, "inference")  # FlopCounterMode's lazy imports
    before = peak_rss()
    feats, _ = featurise(TokenEncoder, (SEQ,), 2, "inference", input_dtype="int64", model_id="big")
    peak = peak_rss()
    print(json.dumps({"before": before, "peak": peak, "params": feats["params"], "flops": feats["flops"],
                      "weight_bytes": feats["weight_bytes"], "n_attention": feats["n_attention"]}))
    """
)


def test_multi_billion_parameter_encoder_featurises_in_little_memory() -> None:
    src = str(Path(perfzoo.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", BIG_ENCODER_SCRIPT],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])

    d, ff, layers = 4096, 16384, 12
    per_layer = (3 * d * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d) + 4 * d
    expected_params = 32000 * d + layers * per_layer
    assert result["params"] == expected_params > 2_000_000_000
    assert result["weight_bytes"] == 4 * expected_params  # ~10 GB that must never be allocated
    assert result["n_attention"] == layers and result["flops"] > 0
    mib = {k: round(result[k] / 2**20) for k in ("before", "peak")}
    assert result["peak"] - result["before"] < 128 * 2**20, f"featurising allocated memory: {mib}"
    assert result["peak"] < 2**30, f"peak RSS over 1 GiB (imports alone: {mib['before']} MiB): {mib}"


class SharedAndFunctional(nn.Module):
    """A parameter shared by two modules, read as an attribute, and buffers handed to a functional."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)
        self.b.weight = self.a.weight
        self.scale = nn.Parameter(torch.ones(6))
        self.register_buffer("mean", torch.zeros(6))
        self.register_buffer("var", torch.ones(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b(self.a(x)) * self.scale + self.a.weight.sum()
        return nn.functional.batch_norm(x, self.mean, self.var, self.scale, None, False)


def graph_counts(graph: torch.fx.Graph) -> tuple[float, float]:
    nodes = list(graph.nodes)
    return float(len(nodes)), float(sum(len(n.all_input_nodes) for n in nodes))


@pytest.mark.parametrize("build", [SharedAndFunctional, tiny_cnn, ShapeBranch], ids=lambda b: b.__name__)
def test_graph_and_its_size_are_those_of_torch_fx_symbolic_trace(build) -> None:
    from perfzoo.features.meta import _graph_size, _IndexedTracer

    model = build()
    try:
        reference = torch.fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 - both must fail
        reference = None
    got = _graph_size(model)
    if reference is None:
        assert math.isnan(got[0]) and math.isnan(got[1]) and got[2]
        return
    assert got == (*graph_counts(reference), "")
    assert str(_IndexedTracer().trace(model)) == str(reference)  # the same nodes, get_attr names included


# --------------------------------------------------------------------------- failures


def test_untraceable_model_gets_nan_graph_size_and_reason() -> None:
    feats, _ = featurise(ShapeBranch, (8,), 2, "inference", model_id="branchy")
    assert math.isnan(feats["graph_nodes"]) and math.isnan(feats["graph_edges"])
    assert feats["graph_error"] and "\n" not in feats["graph_error"]
    assert feats["flops"] == 2 * 2 * 8 * 8  # everything else is still computed


def test_builder_that_raises_names_the_model() -> None:
    def broken() -> nn.Module:
        raise RuntimeError("no such variant")

    with pytest.raises(InputError, match=r"model bad-42: .*no such variant") as err:
        featurise(broken, (3, 8, 8), 1, "inference", model_id="bad-42")
    assert "\n" not in str(err.value)


def test_forward_failure_and_bad_arguments_raise_input_error() -> None:
    with pytest.raises(InputError, match="model wrong-shape: inference step failed"):
        featurise(tiny_cnn, (3, 10, 10), 1, "inference", model_id="wrong-shape")
    with pytest.raises(InputError, match="model m: unknown mode"):
        featurise(tiny_cnn, (3, 8, 8), 1, "serving", model_id="m")
    with pytest.raises(InputError, match="model m: bad input spec"):
        featurise(tiny_cnn, (3, 8, 8), 1, "inference", input_dtype="float99", model_id="m")


class _ValueGated(nn.Module):
    """Branches on a tensor's value: the meta device has none."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h.relu() if h.sum() > 0 else h


def test_a_step_branching_on_a_tensor_value_raises_the_data_dependent_error_others_do_not() -> None:
    """The prediction counts such a step on the CPU instead; it tells it apart by the error's type, not its text."""
    from perfzoo.features.ops import DataDependentError

    with pytest.raises(DataDependentError, match="model gated: inference step failed on meta device: .*meta"):
        featurise(_ValueGated, (8,), 2, "inference", model_id="gated")
    with pytest.raises(InputError, match="model wrong-shape: inference step failed") as err:
        featurise(tiny_cnn, (3, 10, 10), 1, "inference", model_id="wrong-shape")
    assert not isinstance(err.value, DataDependentError)


class _Token(nn.Module):
    """Returns a view of its parameter: made under no_grad, it needs a gradient and has no gradient function."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.zeros(1, 1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.token.expand(x.shape[0], -1, -1)


class _WithToken(nn.Module):
    """A class token prepended to the sequence, as CaiT, PiT and SigLIP's attention pool have one."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.fc = _Token(), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.tok(x), x], dim=1).mean(1))


def test_an_inference_step_with_a_parameter_view_is_counted_with_the_parameters_requires_grad_off() -> None:
    # FlopCounterMode's module tracker fails on such a view ("Expected gradient function to be set"); the inference
    # step is counted again with requires_grad off, and the model keeps its trainable parameters afterwards
    features, layers = featurise(_WithToken, (4, 8), 2, "inference", "float32", "tok")
    assert features["flops"] == features["flops_fw"] == 2 * 2 * 8 * 3  # the head's matrix product, batch 2
    assert features["trainable_params"] == 8 + 8 * 3 + 3 and not layers.empty
    assert featurise(_WithToken, (4, 8), 2, "training", "float32", "tok")[0]["flops"] == 3 * 96


def test_an_inference_step_the_module_tracker_fails_on_recounts_frozen_and_equals_the_separate_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared steps stand for the operator trace and the memory simulation; only the frozen FLOP count runs
    again, and every feature and layer row is what the separate passes give."""
    from perfzoo.features import meta

    def featurised() -> tuple[dict, pd.DataFrame]:
        return featurise(_WithToken, (4, 8), 2, "inference", "float32", "tok")

    separate_calls = []
    separate = meta._separate_passes
    monkeypatch.setattr(meta, "_separate_passes", lambda *a, **k: separate_calls.append(1) or separate(*a, **k))
    shared_features, shared_layers = featurised()
    assert not separate_calls  # the shared steps stood in
    monkeypatch.setattr(meta, "_two_steps", lambda *a, **k: None)
    separate_features, separate_layers = featurised()
    assert separate_calls == [1]
    assert shared_features.keys() == separate_features.keys()
    assert all(shared_features[k] == separate_features[k] or (shared_features[k] != shared_features[k]
               and separate_features[k] != separate_features[k]) for k in shared_features)  # NaN == NaN
    assert shared_layers.equals(separate_layers) and shared_features["flops"] == 2 * 2 * 8 * 3


class _InitialisedInPlace(nn.Module):
    """Initialises its weight in place (timm's trunc_normal_, which unlike torch's runs on a meta tensor) and copies
    a tensor into a buffer of another shape."""

    def __init__(self, source_shape: tuple[int, ...]) -> None:
        from timm.layers import trunc_normal_

        super().__init__()
        self.weight = nn.Parameter(torch.empty(4, 8))
        trunc_normal_(self.weight, std=0.02)
        self.register_buffer("table", torch.empty(4))
        with torch.no_grad():
            self.table.copy_(torch.empty(source_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t() + self.table


def test_a_meta_build_skips_weight_initialisation_but_not_an_in_place_op_with_a_tensor_argument() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    from perfzoo.features.meta import _build_on_meta

    class Operators(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with torch.device("meta"), Operators() as operators:
        model = _build_on_meta(lambda: _InitialisedInPlace((4,)))
    assert "copy_" in operators.seen  # a tensor argument: the op runs and checks it
    assert not {"uniform_", "erfinv_", "mul_", "add_", "clamp_"} & set(operators.seen)
    assert model.weight.is_meta and model.weight.shape == (4, 8) and model.weight.requires_grad
    with pytest.raises(InputError, match=r"model bad: build failed: .*size"):
        featurise(lambda: _InitialisedInPlace((3,)), (8,), 2, "inference", "float32", "bad")


def test_a_manifest_featurised_in_two_processes_gives_the_same_tables_in_the_same_order() -> None:
    """The features rule's worker processes change nothing: model, layer and operator tables equal, rows in order,
    and a model that cannot be built keeps its row with the reason, as in one process."""
    from perfzoo.features.meta import featurise_manifest
    from perfzoo.models.zoo import expand_zoo, manifest_frame

    families = {
        "mlp": {"builder": "mlp", "models": [{"name": "a", "kwargs": {"in_features": 24, "hidden": [32]}},
                                             {"name": "b", "kwargs": {"in_features": 24, "hidden": [16, 16]}}],
                "input_shape": [24], "batch_sizes": [2, 5]},
        "enc": {"builder": "transformer", "models": [{"name": "encoder", "variant": "t",
                                                      "kwargs": {"d_model": 16, "heads": 2, "layers": 1}}],
                "sequence_lengths": [8], "batch_sizes": [3]},
        "bad": {"builder": "mlp", "models": [{"name": "c", "kwargs": {"in_features": 24, "hidden": [-4]}}],
                "input_shape": [24],
                "batch_sizes": [2]},
    }
    manifest = manifest_frame(expand_zoo({"zoo": {"num_classes": 10, "families": families}}))
    tables = {}
    for workers in (1, 2):
        ops: list[pd.DataFrame] = []
        models, layers = featurise_manifest(manifest, 10, progress=False, op_tables=ops, workers=workers)
        tables[workers] = (models, layers, pd.concat(ops, ignore_index=True))
    for one, two in zip(tables[1], tables[2], strict=True):
        pd.testing.assert_frame_equal(one, two)
    models = tables[2][0]
    assert len(models) == 2 * 2 * 2 + 2 + 2 and (models["feature_error"] != "").sum() == 2  # the bad model's configs
    assert tables[2][2]["model_id"].nunique() == models.loc[models["feature_error"] == "", "model_id"].nunique()
