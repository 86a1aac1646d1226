"""Static model features computed on PyTorch's ``meta`` device (no weight memory, no GPU).

``featurise`` builds a model on the meta device, runs one forward step (inference) or one
forward + loss + backward step (training) under ``FlopCounterMode`` with hooks on every module,
and returns a model-level feature dict plus a per-layer table.

How the step is replayed
------------------------
The numbers are those of three separate passes over the step: ``FlopCounterMode`` with the module hooks
(the model's first call), the operator trace of :mod:`perfzoo.features.ops` (its second call) and the memory
simulation of :mod:`perfzoo.features.memory` (two steps). They are recorded in the memory simulation's two
steps instead (:class:`_SharedSteps`): the FLOPs and layer rows in the first, the operator trace in the
second, each operator's kernel run once for all of them (through a
:class:`~perfzoo.features.ops.MetaKernelCache`, which answers an operator seen before on the same argument
metadata without rerunning its meta kernel); an inference step that the memory simulation counts twice from
one replay records all three in that one. A model built on the meta device skips its weight initialisation
(:class:`_MetaInitSkipped`: a meta tensor has no values to fill). The training FLOPs are then those of the profiled
cross-entropy loss's backward rather than of the summed outputs': they differ only in the loss's own
operators, which have no FLOP formula. Where the shared steps cannot stand in exactly (a step that fails,
an operator decomposed into outputs of other metadata than its kernel's, a higher-order operator, a training
step ``FlopCounterMode``'s module tracker fails on, more than one output tensor) the separate passes run
(:func:`_separate_passes`), and give the features or the error they always gave. For an inference step the
module tracker fails on (CaiT, PiT, SigLIP's attention pool: :func:`_counted_step`), only the separate passes'
first pass runs again, which counts with the parameters frozen (:func:`_frozen_count`).

Definitions
-----------
layer
    An *innermost module invocation*: a call of a module during which no other module of the
    model is called. This is every leaf module (no children), plus modules whose children are
    not called as modules (``nn.MultiheadAttention`` computes through its ``out_proj`` weight
    without calling it). A module reused several times (torchvision's ``BasicBlock.relu``)
    gives one row per call. Rows are in execution order.
flops
    FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` for the whole step of the
    mode: forward only for inference, forward + backward for training. ``flops_fw`` is the
    forward part, ``macs = flops_fw / 2``. The per-layer ``flops`` column is the forward FLOPs
    counted while that invocation ran. The weight-gradient term of ``convolution_backward`` is
    divided by ``groups`` (torch 2.14's formula ignores groups and overcounts depthwise convs by
    the channel count; the same fix was proposed upstream in pytorch/pytorch#183405).
training loss
    The sum of all floating-point output tensors (model-agnostic: logits, hidden states,
    tuples or dicts of them). Its complexity appears as one extra row, ``type == "Loss"``
    (category ``other``), using the Gianniti loss formula.
Gianniti complexities (``c_fw``, ``c_bw``)
    From the per-layer table of Gianniti et al. (Conv, FC, Loss, Norm, Pool, ReLU/Dropout).
    ``C_out`` is read as the number of output values of one sample (channels x output
    positions); ``C_in`` and ``H_f W_f`` are per output position (kernel volume, input channels
    per group), so ``Conv fw = H_f W_f C_in C_out``. FC: ``H_in W_in`` is the number of positions
    the linear map is applied at (``numel(input) / in_features`` per sample), ``C_in/C_out`` are
    ``in/out_features``. Norm: ``C_n`` is the number of elements normalised together per channel
    (BatchNorm/InstanceNorm: spatial positions; GroupNorm: group size; LayerNorm/RMSNorm:
    ``prod(normalized_shape)``; LRN: window size). Adaptive pools use the kernel
    ``ceil(in / out)`` per spatial dim. Pools are split into ``pool_s1`` (all strides 1;
    adaptive: output not smaller than input) and ``pool_s2``. Layers the table does not cover
    (attention, embedding, other) get 0. Per-sample values are multiplied by ``batch``.
activation_bytes
    Sum of the bytes of every layer output during the forward step.
train_mem_estimate_bytes
    ``weight_bytes * k + activation_bytes`` with ``k = 4`` for training (weights, gradients,
    two Adam moments) and ``k = 1`` for inference: a simple static memory feature, not a
    prediction.
sim_peak_bytes, sim_start_bytes, sim_weight_bytes, sim_grad_bytes, sim_optimizer_bytes, sim_activation_bytes,
sim_heap_churn_bytes, sim_heap_peak_bytes, sim_op_kinds, sim_onednn_conv, sim_cl_depthwise_weight_bytes, sim_error
    The profiled step (``perfzoo.profiling.core.make_step``: cross-entropy loss and an optimizer step in
    training) replayed twice on the meta device by :func:`perfzoo.features.memory.simulate_peak_memory`: the
    peak of live tensor bytes, the bytes before the first step, the split of the peak by category, the bytes
    both steps allocate in blocks below 32 MiB (the traffic through a C allocator's heap), the peak footprint
    of the step's storages in a model of glibc's heap (:mod:`perfzoo.features.heap`), the
    number of distinct operators, whether a convolution runs on oneDNN on the CPU and the weight bytes of the
    largest depthwise convolution whose weight gradient comes from a channels-last gradient (oneDNN's blocked
    temporary on the CPU; :class:`perfzoo.features.memory.SimulatedMemory`). When that step cannot
    run (an output the profiled cross-entropy loss does not take, as a backbone without a classifier head)
    they are NaN and ``sim_error`` holds the one-line reason (else "").
n_module_calls
    ``nn.Module`` calls in one forward of the model, containers (``Sequential``, blocks) included, once per
    module call: each runs Python (``Module.__call__``, the ``forward`` body) outside any aten operator, a cost
    per call that does not grow with the batch. An ``nn.GRU`` is one call however many time steps its
    operators loop over.
depth
    Deepest nesting level in the module tree (the root is 0; ``Sequential(conv, ...)`` has 1).
graph_nodes, graph_edges
    Nodes of the ``torch.fx.symbolic_trace`` graph and the sum of ``len(node.all_input_nodes)``.
    When tracing fails both are NaN and ``graph_error`` holds a one-line reason (else "").
    fx's default leaf rule keeps every ``torch.nn`` built-in module (``nn.TransformerEncoder``
    included) as one node, so those count as single nodes.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count
from tqdm import tqdm

from perfzoo.features.attention import ATTENTION_FLOP_FORMULAS
from perfzoo.features.recurrent import RECURRENT_FLOP_FORMULAS, cpu_kernels, has_lstm
from perfzoo.features.memory import (
    SIM_COLUMNS,
    Runner,
    SimulatedMemory,
    StepRider,
    feature_row,
    simulate_peak_memory,
    simulated_memory_features,
)
from perfzoo.features.op_kinds import OP_ERROR_COLUMN, OP_FEATURES
from perfzoo.features.ops import (
    CACHE_BYTES,
    DataDependentError,
    MetaKernelCache,
    OpRecorder,
    class_targets,
    tensor_bytes,
    tensors_in,
    traced_op_features,
)
from perfzoo.io import InputError, one_line
from perfzoo.models.builders import build_model
from perfzoo.hardware.precision import BUILD_DTYPES, normalise_precision

MODES = ("inference", "training")
CATEGORIES = ("conv_fc", "norm", "pool_s1", "pool_s2", "relu_drop", "attention", "embedding", "other")
LAYER_COLUMNS = [
    "model_id", "mode", "batch", "layer_idx", "name", "type", "category",
    "c_fw", "c_bw", "out_bytes", "flops",
]  # fmt: skip
MODEL_COLUMNS = [
    "model_id", "mode", "batch", "flops", "flops_fw", "macs", "params", "trainable_params",
    "weight_bytes", "activation_bytes", "input_bytes", "train_mem_estimate_bytes",
    "n_layers", "n_conv", "n_linear", "n_norm", "n_act", "n_pool", "n_attention", "n_dropout",
    "n_embedding", "n_module_calls", "graph_nodes", "graph_edges", "graph_error", "complexity_fw",
    "complexity_bw", "depth", *SIM_COLUMNS, "sim_error", *OP_FEATURES, OP_ERROR_COLUMN,
]  # fmt: skip

_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    nn.CrossMapLRN2d,
    nn.RMSNorm,
)
_POOL_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.pooling._MaxPoolNd,
    nn.modules.pooling._AvgPoolNd,
    nn.modules.pooling._LPPoolNd,
)
_ADAPTIVE_POOL_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd,
)
_DROPOUT_NAMES = frozenset({"DropPath", "DropBlock2d", "DropBlock"})


# --------------------------------------------------------------------------- module classification


def _is_dropout(module: nn.Module) -> bool:
    return isinstance(module, nn.modules.dropout._DropoutNd) or type(module).__name__ in _DROPOUT_NAMES


def _is_activation(module: nn.Module) -> bool:
    """torch.nn activation modules (not MultiheadAttention) and timm's own activation classes."""
    if isinstance(module, nn.MultiheadAttention):
        return False
    module_path = type(module).__module__
    return module_path == "torch.nn.modules.activation" or (
        module_path.startswith("timm.") and "activations" in module_path
    )


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, _NORM_TYPES) or type(module).__name__.endswith(("Norm", "Norm1d", "Norm2d"))


def _is_attention(module: nn.Module) -> bool:
    return "Attention" in type(module).__name__


def _pool_is_stride_one(module: nn.Module, in_shape: torch.Size, out_shape: torch.Size) -> bool:
    """Stride-1 pool; an adaptive pool counts as stride 1 unless its output is smaller than its input."""
    if isinstance(module, _ADAPTIVE_POOL_TYPES):
        n_spatial = _spatial_dims(module)
        return math.prod(out_shape[-n_spatial:]) >= math.prod(in_shape[-n_spatial:])
    stride = module.stride if module.stride is not None else module.kernel_size
    return all(s == 1 for s in _as_tuple(stride))


def _category(module: nn.Module, in_shape: torch.Size | None, out_shape: torch.Size | None) -> str:
    if isinstance(module, (nn.modules.conv._ConvNd, nn.Linear)):
        return "conv_fc"
    if _is_norm(module):
        return "norm"
    if (
        isinstance(module, _POOL_TYPES + _ADAPTIVE_POOL_TYPES)
        and in_shape is not None
        and out_shape is not None
    ):
        return "pool_s1" if _pool_is_stride_one(module, in_shape, out_shape) else "pool_s2"
    if _is_activation(module) or _is_dropout(module):
        return "relu_drop"
    if _is_attention(module):
        return "attention"
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return "embedding"
    return "other"


# --------------------------------------------------------------------------- Gianniti complexities


def _as_tuple(value: int | Iterable[int]) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, Iterable) else (int(value),)


def _spatial_dims(module: nn.Module) -> int:
    """Number of spatial dims of a pooling module (1, 2 or 3), read from its class name."""
    name = type(module).__name__
    return int(name[-2]) if name[-1] == "d" and name[-2].isdigit() else 2


def _pool_kernel_volume(module: nn.Module, in_shape: torch.Size, out_shape: torch.Size) -> int:
    n_spatial = _spatial_dims(module)
    if isinstance(module, _ADAPTIVE_POOL_TYPES):
        return math.prod(
            math.ceil(i / o) for i, o in zip(in_shape[-n_spatial:], out_shape[-n_spatial:], strict=True)
        )
    kernel = _as_tuple(module.kernel_size)
    return math.prod(kernel * n_spatial if len(kernel) == 1 else kernel)


def _norm_group_size(module: nn.Module, out_per_sample: int, out_shape: torch.Size) -> int:
    """C_n: elements normalised together per channel, per sample."""
    if isinstance(module, nn.GroupNorm):
        return out_per_sample // module.num_groups
    if getattr(module, "normalized_shape", None) is not None:
        return math.prod(_as_tuple(module.normalized_shape))
    if isinstance(module, (nn.LocalResponseNorm, nn.CrossMapLRN2d)):
        return int(module.size)
    num_features = getattr(module, "num_features", None)
    if num_features:
        return out_per_sample // num_features
    return int(out_shape[-1])


def _conv_complexity(
    module: nn.modules.conv._ConvNd, in_per_sample: int, out_per_sample: int
) -> tuple[int, int]:
    kernel = math.prod(module.kernel_size)
    if module.transposed:  # work is per input position: C_in = in_channels, C_out = out_channels / groups
        c_in = module.in_channels
        c_out = (in_per_sample // module.in_channels) * (module.out_channels // module.groups)
    else:
        c_in = module.in_channels // module.groups
        c_out = out_per_sample
    return kernel * c_in * c_out, (2 * kernel * c_in + 1) * c_out


def _layer_complexity(
    module: nn.Module, category: str, in_shape: torch.Size | None, out_shape: torch.Size | None, batch: int
) -> tuple[int, int]:
    """Gianniti forward/backward complexity of one layer invocation, for the whole batch."""
    if in_shape is None or out_shape is None or category in ("attention", "embedding", "other"):
        return 0, 0
    in_per_sample = math.prod(in_shape) // batch
    out_per_sample = math.prod(out_shape) // batch
    if isinstance(module, nn.modules.conv._ConvNd):
        fw, bw = _conv_complexity(module, in_per_sample, out_per_sample)
    elif isinstance(module, nn.Linear):
        positions = in_per_sample // module.in_features
        fw = positions * module.in_features * module.out_features
        bw = 2 * fw
    elif category == "norm":
        c_n = _norm_group_size(module, out_per_sample, out_shape)
        fw, bw = 5 * out_per_sample + c_n - 2, 8 * out_per_sample + c_n - 1
    elif category in ("pool_s1", "pool_s2"):
        kernel = _pool_kernel_volume(module, in_shape, out_shape)
        fw, bw = kernel * out_per_sample, (kernel + 1) * out_per_sample
    elif category == "relu_drop":
        fw, bw = 3 * out_per_sample, 4 * out_per_sample
    else:  # conv_fc subclasses not handled above
        return 0, 0
    return fw * batch, bw * batch


def _loss_complexity(out_per_sample: int, batch: int) -> tuple[int, int]:
    """Gianniti loss row, C_out = output values per sample."""
    return (4 * out_per_sample - 1) * batch, (out_per_sample + 1) * batch


# --------------------------------------------------------------------------- FLOP counting


def _transpose01(shape: Iterable[int]) -> list[int]:
    shape = list(shape)
    return [shape[1], shape[0], *shape[2:]]


def _conv_backward_flop(
    grad_out_shape: list[int],
    x_shape: list[int],
    w_shape: list[int],
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    groups: int,
    output_mask: list[bool],
    out_shape: Any = None,
    **_: Any,
) -> int:
    """FLOPs of ``aten.convolution_backward``: torch's formula with the weight-gradient term / groups."""
    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        first, second = (grad_out_shape, x_shape) if transposed else (x_shape, grad_out_shape)
        weight_grad = conv_flop_count(
            _transpose01(first), _transpose01(second), _transpose01(out_shape[1]), transposed=False
        )
        flops += weight_grad // groups
    return flops


KERNEL_CACHE_ENTRIES = 50_000
"""Most operator outputs :data:`PROCESS_KERNELS` keeps: about 1.6 kB each, so about 80 MB at the bound (a timm
inference config adds about 55)."""
PROCESS_KERNELS = MetaKernelCache(max_entries=KERNEL_CACHE_ENTRIES)
"""The kernel cache of every step this process featurises: layers of the same shapes recur across the models of
a zoo or an imported table."""


def _flop_counter() -> FlopCounterMode:
    return FlopCounterMode(
        display=False,
        custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flop, **ATTENTION_FLOP_FORMULAS,
                        **RECURRENT_FLOP_FORMULAS},
    )


# --------------------------------------------------------------------------- forward recording


def _first_shape(obj: Any) -> torch.Size | None:
    tensors = tensors_in(obj)
    return tensors[0].shape if tensors else None


@dataclass
class _Frame:
    module: nn.Module
    flops_before: int
    called_child: bool = False


@dataclass
class _Recorder:
    """Forward hooks that record innermost module invocations and count attention blocks."""

    names: dict[int, str]
    total_flops: Callable[[], int]
    """FLOPs counted so far in the step (``FlopCounterMode.get_total_flops`` or a recorder's running total)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    stack: list[_Frame] = field(default_factory=list)
    n_attention: int = 0
    n_module_calls: int = 0
    """Module calls in the forward, containers included (each runs Python outside any operator)."""
    active: bool = True

    def attach(self, model: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
        """Hook every module of ``model``: by two global module hooks that pass the model's own modules on, or,
        where a module has hooks of its own (which must keep running before ours, as they may run operators),
        by two hooks on each module. Registering on each module costs a hook handle per module and step."""
        modules = list(model.modules())
        if any(m._forward_pre_hooks or m._forward_hooks for m in modules):
            handles = []
            for module in modules:
                handles.append(module.register_forward_pre_hook(self._enter, with_kwargs=True))
                handles.append(module.register_forward_hook(self._leave, with_kwargs=True))
            return handles
        members = {id(m) for m in modules}

        def enter(module: nn.Module, args: tuple) -> None:
            if id(module) in members:
                self._enter(module, args, {})

        def leave(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if id(module) in members:
                self._leave(module, args, kwargs, output)

        return [register_module_forward_pre_hook(enter), register_module_forward_hook(leave, with_kwargs=True)]

    def _enter(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not self.active:
            return
        self.n_module_calls += 1
        if self.stack:
            self.stack[-1].called_child = True
        if _is_attention(module) and not any(_is_attention(f.module) for f in self.stack):
            self.n_attention += 1
        self.stack.append(_Frame(module, self.total_flops()))

    def _leave(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not self.active or not self.stack:
            return
        frame = self.stack.pop()
        if frame.called_child:
            return
        self.rows.append(
            {
                "module": module,
                "name": self.names.get(id(module)) or "<root>",
                "in_shape": _first_shape((args, kwargs)),
                "out_shape": _first_shape(output),
                "out_bytes": tensor_bytes(output),
                "flops": self.total_flops() - frame.flops_before,
            }
        )


# --------------------------------------------------------------------------- steps



def _make_input(input_shape: tuple[int, ...], batch: int, input_dtype: str) -> torch.Tensor:
    dtype = getattr(torch, input_dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"unknown input_dtype {input_dtype!r}")
    shape = (batch, *input_shape)
    if dtype.is_floating_point:
        return torch.empty(shape, dtype=dtype, device="meta")
    return torch.zeros(shape, dtype=dtype, device="meta")


_VALUE_ONLY_IN_PLACE = frozenset(getattr(torch.Tensor, name) for name in (
    "uniform_", "normal_", "zero_", "fill_", "erfinv_", "mul_", "add_", "sub_", "div_", "clamp_", "clamp_min_",
    "clamp_max_"))
"""Tensor methods that change only the values of the tensor they are called on, as weight initialisation calls them
(timm's ``trunc_normal_`` is ``uniform_``, ``erfinv_``, ``mul_``, ``add_`` and ``clamp_``)."""


class _MetaInitSkipped(torch.overrides.TorchFunctionMode):
    """Skips the weight initialisation of a model built on the meta device: a :data:`_VALUE_ONLY_IN_PLACE` call on
    a floating-point meta tensor, with no other tensor among its arguments, returns the tensor as it is.

    A meta tensor has no values, and with scalars only there is no shape to disagree with: the call could only
    reject a nonsensical scalar (a negative standard deviation), which no feature depends on. Yet it runs PyTorch's
    Python decompositions and meta kernels (a random fill is several): about half of building a timm model on the
    meta device. Any call with a tensor argument (``copy_``) runs and checks its shapes."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _VALUE_ONLY_IN_PLACE and _only_meta_float_self(args, kwargs):
            return args[0]
        return func(*args, **kwargs)


def _only_meta_float_self(args: tuple, kwargs: dict) -> bool:
    """Whether the first argument is a floating-point meta tensor and no other argument is a tensor."""
    first, rest = (args[0], (args[1:], kwargs)) if args else (None, None)
    return (isinstance(first, torch.Tensor) and first.is_meta and first.is_floating_point()
            and not tensors_in(rest))


def _build_on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    with _MetaInitSkipped():
        model = build()
    if not isinstance(model, nn.Module):
        raise TypeError(f"builder returned {type(model).__name__}, not an nn.Module")
    if any(t.device.type != "meta" for t in (*model.parameters(), *model.buffers())):
        model = model.to(device="meta")  # builder ignored the default device: drop real storage
    return model


def _sum_loss(output: Any) -> torch.Tensor:
    """Training loss: sum of every floating-point output tensor that requires grad."""
    tensors = [t for t in tensors_in(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        raise ValueError("model output has no differentiable floating-point tensor")
    return sum(t.sum() for t in tensors)


GRAD_FN_MISSING = "Expected gradient function to be set"
"""FlopCounterMode's module tracker on a tensor that needs a gradient and has no gradient function."""


def _counted_step(model: nn.Module, x: torch.Tensor, mode: str
                  ) -> tuple[FlopCounterMode, _Recorder, tuple[int, int, Any]]:
    """The step of ``mode`` under FlopCounterMode with the layer hooks: (counter, layer recorder, what
    :func:`_run_step` returns).

    The counter's module tracker hooks the gradient of every module input and output that needs one, and fails
    on a view of a parameter made under ``no_grad`` (it needs a gradient and has no gradient function: CaiT's
    and PiT's class tokens, the SigLIP attention pool's latent; 45 timm models). An inference step that fails so
    is counted again with the parameters' ``requires_grad`` off (restored after); only then, because PyTorch
    takes other paths for some modules without it (``nn.TransformerEncoderLayer``'s fused path), and the
    operator trace and the memory simulation, which have no module tracker, keep the step as it is profiled."""
    try:
        return _counted_once(model, x, mode, frozen=False)
    except AssertionError as exc:
        if mode != "inference" or GRAD_FN_MISSING not in str(exc):
            raise
    return _counted_once(model, x, mode, frozen=True)


def _counted_once(model: nn.Module, x: torch.Tensor, mode: str, frozen: bool
                  ) -> tuple[FlopCounterMode, _Recorder, tuple[int, int, Any]]:
    """One try of :func:`_counted_step`, with the parameters' ``requires_grad`` off when ``frozen``."""
    counter = _flop_counter()
    recorder = _Recorder({id(m): name for name, m in model.named_modules()}, counter.get_total_flops)
    handles = recorder.attach(model)
    try:
        with cpu_kernels(), _parameters_frozen(model) if frozen else contextlib.nullcontext():
            return counter, recorder, _run_step(model, x, mode, recorder, counter)
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _parameters_frozen(model: nn.Module) -> Iterator[None]:
    """The model's parameters without ``requires_grad`` inside (restored after)."""
    frozen = [p for p in model.parameters() if p.requires_grad]
    for parameter in frozen:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in frozen:
            parameter.requires_grad_(True)


def _run_step(model: nn.Module, x: torch.Tensor, mode: str, recorder: _Recorder, counter: FlopCounterMode
              ) -> tuple[int, int, Any]:
    """Run the step of ``mode``; return (total FLOPs, forward FLOPs, model output)."""
    if mode == "inference":
        model.eval()
        with torch.no_grad(), counter:
            output = model(x)
        flops_fw = counter.get_total_flops()
        return flops_fw, flops_fw, output
    model.train()
    with counter:
        output = model(x)
        flops_fw = counter.get_total_flops()
        recorder.active = False  # recomputed forwards (checkpointing) must not add rows
        _sum_loss(output).backward()
    return counter.get_total_flops(), flops_fw, output


class _IndexedTracer(torch.fx.Tracer):
    """``torch.fx.Tracer`` finding a module's parameters and buffers by identity in a dict.

    The base tracer looks each one up by walking ``named_parameters()`` / ``named_buffers()`` of the whole
    model, once per use: quadratic in the model's size, and a seventh of a timm model's featurisation. Same
    graph (the first name of a shared tensor, as those walks find it); anything else goes to the base."""

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> torch.fx.Graph:
        module = root if isinstance(root, nn.Module) else nn.Module()  # a function has none of either
        self._parameter_names = _first_names(module.named_parameters())
        self._buffer_names = _first_names(module.named_buffers())
        return super().trace(root, concrete_args)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        name = self._parameter_names.get(id(attr_val)) if isinstance(attr_val, nn.Parameter) else None
        if name is None or self.param_shapes_constant:
            return super().getattr(attr, attr_val, parameter_proxy_cache)
        if name not in parameter_proxy_cache:
            parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
        return parameter_proxy_cache[name]

    def create_arg(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            names = self._parameter_names if isinstance(a, nn.Parameter) else self._buffer_names
            if id(a) in names:
                return self.create_node("get_attr", names[id(a)], (), {})
        return super().create_arg(a)


def _first_names(named: Iterable[tuple[str, torch.Tensor]]) -> dict[int, str]:
    names: dict[int, str] = {}
    for name, tensor in named:
        names.setdefault(id(tensor), name)
    return names


def _graph_size(model: nn.Module) -> tuple[float, float, str]:
    """(nodes, edges, error) of the torch.fx symbolic trace; NaN and a reason when tracing fails."""
    try:
        graph = _IndexedTracer().trace(model)
    except Exception as exc:  # noqa: BLE001 - tracing fails in many model-specific ways
        return math.nan, math.nan, one_line(exc)
    nodes = list(graph.nodes)
    return float(len(nodes)), float(sum(len(n.all_input_nodes) for n in nodes)), ""


def _module_depth(model: nn.Module) -> int:
    return max(name.count(".") + 1 if name else 0 for name, _ in model.named_modules())


def _unique_tensors(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for t in tensors:
        seen.setdefault(id(t), t)
    return list(seen.values())


# --------------------------------------------------------------------------- assembly


def _loss_values(output: Any, batch: int) -> tuple[int, int]:
    """(output values per sample, bytes of one value) of the training loss's input: its Gianniti row's size."""
    floats = [t for t in tensors_in(output) if t.is_floating_point()]
    return sum(t.numel() for t in floats) // batch, floats[0].element_size()


def _layer_table(
    rows: list[dict[str, Any]], loss_values: tuple[int, int] | None, mode: str, batch: int, model_id: str
) -> pd.DataFrame:
    records = []
    for row in rows:
        module = row["module"]
        category = _category(module, row["in_shape"], row["out_shape"])
        c_fw, c_bw = _layer_complexity(module, category, row["in_shape"], row["out_shape"], batch)
        records.append(
            {"name": row["name"], "type": type(module).__name__, "category": category,
             "c_fw": c_fw, "c_bw": c_bw, "out_bytes": row["out_bytes"], "flops": row["flops"]}
        )  # fmt: skip
    if mode == "training":
        out_per_sample, value_bytes = loss_values
        c_fw, c_bw = _loss_complexity(out_per_sample, batch)
        records.append(
            {"name": "loss", "type": "Loss", "category": "other", "c_fw": c_fw, "c_bw": c_bw,
             "out_bytes": value_bytes, "flops": 0}
        )  # fmt: skip
    table = pd.DataFrame.from_records(records, columns=LAYER_COLUMNS[4:])
    table.insert(0, "layer_idx", range(len(table)))
    table.insert(0, "batch", batch)
    table.insert(0, "mode", mode)
    table.insert(0, "model_id", model_id)
    return table.astype({"c_fw": "int64", "c_bw": "int64", "out_bytes": "int64", "flops": "float64"})


def _layer_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    modules = [row["module"] for row in rows]
    return {
        "n_layers": len(modules),
        "n_conv": sum(isinstance(m, nn.modules.conv._ConvNd) for m in modules),
        "n_linear": sum(isinstance(m, nn.Linear) for m in modules),
        "n_norm": sum(_is_norm(m) for m in modules),
        "n_act": sum(_is_activation(m) for m in modules),
        "n_pool": sum(isinstance(m, _POOL_TYPES + _ADAPTIVE_POOL_TYPES) for m in modules),
        "n_dropout": sum(_is_dropout(m) for m in modules),
        "n_embedding": sum(isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for m in modules),
    }


def featurise(
    build: Callable[[], nn.Module],
    input_shape: tuple[int, ...],
    batch: int,
    mode: str,
    input_dtype: str = "float32",
    model_id: str = "",
    trace_graph: bool = True,
    optimizer: str = "sgd",
    op_tables: list[pd.DataFrame] | None = None,
    cache_bytes: int = CACHE_BYTES,
) -> tuple[dict, pd.DataFrame]:
    """Build the model on the meta device and return (model-level features, per-layer table).

    ``input_shape`` excludes the batch dim; ``input_dtype`` is a torch dtype name ("float32" for
    images/MLPs, "int64" for token ids). ``mode`` is "inference" or "training". A model that
    fails to build or run raises ``InputError`` naming ``model_id``. See the module docstring
    for the definition of every feature; the ``sim_*`` columns come from
    :func:`perfzoo.features.memory.simulate_peak_memory` with ``optimizer`` (the profiled training step's,
    config ``profiling.optimizer``). ``trace_graph=False`` skips the fx trace (graph features NaN,
    ``graph_error`` "not traced"), for callers that already traced the same model. The ``op_*`` features come
    from the profiled step (with the same ``optimizer``) traced into aten operators
    (:mod:`perfzoo.features.ops`); that per-operator table is appended to ``op_tables`` when given.
    ``cache_bytes`` is the cache capacity behind its ``bytes_cached`` (:data:`perfzoo.features.ops.CACHE_BYTES`;
    benchmarks compare others).
    """
    if mode not in MODES:
        raise InputError(f"model {model_id}: unknown mode {mode!r} (expected one of {', '.join(MODES)})")
    if int(batch) < 1:
        raise InputError(f"model {model_id}: batch must be >= 1, got {batch}")
    batch = int(batch)
    with torch.device("meta"):
        try:
            model = _build_on_meta(build)
        except Exception as exc:  # noqa: BLE001 - any builder error becomes a one-line InputError
            raise InputError(f"model {model_id}: build failed: {one_line(exc)}") from None
        try:
            x = _make_input(tuple(int(d) for d in input_shape), batch, input_dtype)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise InputError(f"model {model_id}: bad input spec: {one_line(exc)}") from None
    step = _two_steps(model, x, mode, optimizer, model_id, cache_bytes, op_table=op_tables is not None)
    if step is None:  # the shared steps could not stand in for the separate passes: run those
        step = _separate_passes(build, x, mode, optimizer, model_id, cache_bytes)
        model = step.model
    with torch.device("meta"):
        graph_nodes, graph_edges, graph_error = (_graph_size(model) if trace_graph
                                                 else (math.nan, math.nan, "not traced"))
    table = _layer_table(step.layers.rows, step.loss_values, mode, batch, model_id)
    counted = {"model_id": model_id, "mode": mode, "batch": batch, "flops": step.flops, "flops_fw": step.flops_fw,
               **step.memory}
    graph = {"graph_nodes": graph_nodes, "graph_edges": graph_edges, "graph_error": graph_error,
             **step.op_features}
    if op_tables is not None and step.op_table is not None:
        op_tables.append(step.op_table)
    return _model_features(model, x, step.layers, table, counted, graph), table


@dataclass
class _Recorded:
    """What the steps of one config recorded: layer rows, FLOPs, operator trace and simulated memory."""

    model: nn.Module
    layers: _Recorder
    flops: int
    flops_fw: int
    loss_values: tuple[int, int] | None
    op_features: dict[str, Any]
    op_table: pd.DataFrame | None
    memory: dict[str, Any]


class _SharedSteps:
    """Rides along in the memory simulation's two replayed steps (:data:`perfzoo.features.memory.StepRider`),
    recording in them what the separate passes record in steps of their own:

    * step 1 (the model's first call, as the FlopCounterMode pass): the module hooks' layer rows and the FLOPs
      of the forward and backward, counted with FlopCounterMode's formulas and decompositions;
    * step 2 (the model's second call, with the optimizer state the first created, as the operator trace): one
      row per aten operator, phase by phase, and the class targets the trace creates.

    An inference step records the operator trace in step 1 as well (its FLOPs are the trace's): the memory
    simulation counts the second step as a repeat of the first where nothing the first left could change it
    (:func:`perfzoo.features.memory.simulate_peak_memory`), and where it does run the second step, the trace
    is recorded again there.

    The memory simulation sees each operator's own kernel output; an operator the trace or the counter
    decomposes also runs its decomposition for them, and :attr:`differs` says when that (or anything else)
    makes the recordings differ from those of the separate passes."""

    def __init__(self, model: nn.Module, mode: str, batch: int, model_id: str) -> None:
        self.model, self.mode, self.batch, self.model_id = model, mode, batch, model_id
        self.registry, self.kernels = _flop_counter().flop_registry, PROCESS_KERNELS
        self.trace = self._recorder(record_rows=True)
        self.counter = self.trace if mode == "inference" else self._recorder(record_rows=False)
        self.layers = _Recorder({id(m): name for name, m in model.named_modules()}, self._counted)
        self.flops_fw: int | None = None
        self.flops: int | None = None
        self.loss_values: tuple[int, int] | None = None
        self.tracker_fails = ""  # why FlopCounterMode's module tracker would fail on step 1 (then it is recounted)

    def _recorder(self, record_rows: bool) -> OpRecorder:
        recorder = OpRecorder(self.model_id, self.registry, record_rows=record_rows)
        recorder.kernel = self.kernels
        return recorder

    @property
    def differs(self) -> str:
        return self.counter.differs or self.trace.differs

    def _counted(self) -> int:
        return self.counter.total_flops

    @contextlib.contextmanager
    def __call__(self, index: int, untracked: Callable[[], contextlib.AbstractContextManager[None]]
                 ) -> Iterator[Runner]:
        if index == 1 and self.trace is self.counter:  # an inference step after all: trace it again there
            self.trace = self._recorder(record_rows=True)
        riding = self._count_flops() if index == 0 else self._trace_ops(untracked)
        with riding as run:
            yield run

    @contextlib.contextmanager
    def _count_flops(self) -> Iterator[Runner]:
        """Step 1: layer rows and FLOPs of the forward, and of the loss and backward in training (the
        FlopCounterMode pass has no optimizer step: its operators run uncounted)."""

        def forward_done(module: nn.Module, args: tuple, output: Any) -> None:
            self.layers.active = False  # recomputed forwards (checkpointing) must not add rows
            self.flops_fw = self.counter.total_flops
            if self.mode == "training":
                self.loss_values = _loss_values(output, self.batch)

        def optimizer_starts(*_: Any) -> None:
            self.flops = self.counter.total_flops

        def run(func: Any, args: tuple, kwargs: dict) -> Any:
            if self.flops is None:
                return self.counter.run(func, args, kwargs, keep_kernel=True)
            return self.kernels(func, args, kwargs)

        def tracked_module(module: nn.Module, args: tuple, output: Any = None) -> None:
            # FlopCounterMode's ModuleTracker hooks the gradient of every module's inputs and outputs; it fails
            # on a tensor that needs a gradient but has no gradient function (a view made under no_grad)
            if self.flops is not None:  # the FLOP count is over: nothing left to check
                return
            if any(t.requires_grad and t.grad_fn is None for t in tensors_in(args if output is None else output)):
                self.tracker_fails = f"a tensor of {type(module).__name__} needs grad but has no grad_fn"

        handles = [*self.layers.attach(self.model), self.model.register_forward_hook(forward_done),
                   register_optimizer_step_pre_hook(optimizer_starts),
                   register_module_forward_pre_hook(tracked_module), register_module_forward_hook(tracked_module)]
        try:
            yield run
        finally:
            for handle in handles:
                handle.remove()
        if self.mode == "inference":
            self.flops = self.counter.total_flops

    @contextlib.contextmanager
    def _trace_ops(self, untracked: Callable[[], contextlib.AbstractContextManager[None]]) -> Iterator[Runner]:
        """Step 2: the operator trace; its phases change where the trace's change: after the loss module
        (the first module outside the model to finish after the model's forward) and when the optimizer
        steps."""
        modules, model_done = {id(m) for m in self.model.modules()}, []

        def forward_done(module: nn.Module, args: tuple, output: Any) -> None:
            model_done.append(True)
            if self.mode == "training":
                with untracked():  # the trace's own class targets, not the simulated step's
                    class_targets(output, self.model_id)

        def loss_done(module: nn.Module, args: tuple, output: Any) -> None:
            if model_done and id(module) not in modules:
                self.trace.phase = "backward"

        def optimizer_starts(*_: Any) -> None:
            self.trace.phase = "optimizer"

        handles = [self.model.register_forward_hook(forward_done), register_module_forward_hook(loss_done),
                   register_optimizer_step_pre_hook(optimizer_starts)]
        try:
            yield partial(self.trace.run, keep_kernel=True)
        finally:
            for handle in handles:
                handle.remove()


def _two_steps(model: nn.Module, x: torch.Tensor, mode: str, optimizer: str, model_id: str,
               cache_bytes: int = CACHE_BYTES, op_table: bool = True) -> _Recorded | None:
    """Everything the separate passes record, from the memory simulation's two replayed steps with
    :class:`_SharedSteps` riding along; None when the steps fail or the recordings could differ from the
    separate passes' (the caller then runs those), and for a model with an LSTM, whose operator trace and FLOP
    count follow the CPU's fused layer and whose memory simulation does not (:mod:`perfzoo.features.recurrent`).
    ``op_table=False``: the operator trace's aggregates without its per-operator table (``op_table`` None)."""
    if has_lstm(model):
        return None
    shared = _SharedSteps(model, mode, int(x.shape[0]), model_id)
    try:
        simulated = simulate_peak_memory(model, x, mode, optimizer, model_id, rider=shared)
    except InputError:
        return None
    if shared.differs or shared.counter.failure or shared.flops is None or shared.flops_fw is None:
        return None
    layers, flops, flops_fw = shared.layers, shared.flops, shared.flops_fw
    if shared.tracker_fails:  # the separate passes count with the parameters frozen: that pass alone
        counted = _frozen_count(model, x, mode)
        if counted is None:
            return None
        layers, flops, flops_fw = counted
    op_features, table = shared.trace.features(mode, int(x.shape[0]), cache_bytes, table=op_table)
    memory = feature_row(lambda: simulated)
    return _Recorded(model, layers, flops, flops_fw, shared.loss_values, op_features, table, memory)


def _frozen_count(model: nn.Module, x: torch.Tensor, mode: str) -> tuple[_Recorder, int, int] | None:
    """The layer rows and FLOPs of :func:`_separate_passes`'s first pass (:func:`_counted_step`) for an inference
    step FlopCounterMode's module tracker fails on, which it counts with the parameters frozen; the operator trace
    and the memory simulation of the shared steps stand as they are (the separate passes keep the step unfrozen
    too). None in training or where the pass fails: the separate passes then give their error."""
    if mode != "inference":
        return None
    with torch.device("meta"):
        try:
            _, recorder, (flops, flops_fw, _) = _counted_step(model, x, mode)
        except Exception:  # noqa: BLE001 - the separate passes report it
            return None
    return recorder, flops, flops_fw


def _separate_passes(build: Callable[[], nn.Module], x: torch.Tensor, mode: str, optimizer: str, model_id: str,
                     cache_bytes: int = CACHE_BYTES) -> _Recorded:
    """The recordings by separate passes over the step of a new build: FlopCounterMode with the module hooks,
    the operator trace, the memory simulation (the reference :func:`_two_steps` stands in for)."""
    with torch.device("meta"):
        try:
            model = _build_on_meta(build)
        except Exception as exc:  # noqa: BLE001 - any builder error becomes a one-line InputError
            raise InputError(f"model {model_id}: build failed: {one_line(exc)}") from None
        try:
            counter, recorder, (flops, flops_fw, output) = _counted_step(model, x, mode)
        except Exception as exc:  # noqa: BLE001 - any model error becomes a one-line InputError
            raise _step_failure(exc, model_id, mode) from None
        op_features, op_table = traced_op_features(lambda: model, x, mode, counter.flop_registry, model_id,
                                                   optimizer, cache_bytes)
    loss_values = _loss_values(output, int(x.shape[0])) if mode == "training" else None
    memory = simulated_memory_features(model, x, mode, optimizer, model_id)
    return _Recorded(model, recorder, flops, flops_fw, loss_values, op_features, op_table, memory)


_VALUE_DEPENDENT_TEXT = ("cannot be called on meta tensors", "data-dependent", "_local_scalar_dense",
                         "Cannot copy out of meta tensor")
"""PyTorch's own words when a meta-device step needs a tensor's value (``Tensor.item()``, ``if tensor:``,
``nonzero``): it raises a plain ``RuntimeError``, so its text is all there is to go by."""


def _step_failure(error: BaseException, model_id: str, mode: str) -> InputError:
    """The one-line error of a meta-device step that failed with ``error``: a :class:`DataDependentError` where
    its control flow needs tensor values (the operator recorder's own, or PyTorch's words for it)."""
    value_dependent = isinstance(error, DataDependentError) or any(t in str(error) for t in _VALUE_DEPENDENT_TEXT)
    kind = DataDependentError if value_dependent else InputError
    return kind(f"model {model_id}: {mode} step failed on meta device: {one_line(error)}")


def featurise_on_cpu(build: Callable[[], nn.Module], input_shape: tuple[int, ...], batch: int, mode: str,
                     input_dtype: str = "float32", model_id: str = "", reason: str = "") -> dict[str, Any]:
    """Model-level features (:data:`MODEL_COLUMNS`) of a step the meta device cannot follow because its control
    flow depends on tensor values (``reason``: where and why the meta step stopped), counted in one real step on
    the CPU on the profiler's seeded random input: the FLOPs, layer rows, parameters and activation bytes of the
    path that input takes. The fx graph size, the memory simulation and the operator trace follow the step on
    the meta device, so they are missing with the reason (never zeros, never another model's values), and the
    predictors that need them give no number (:meth:`perfzoo.prediction.predictors.Predictor.predict`)."""
    from perfzoo.profiling.core import synthetic_batch  # lazy: only a model the meta device cannot follow

    with torch.device("cpu"):
        try:
            model = build()
        except Exception as exc:  # noqa: BLE001 - any builder error becomes a one-line InputError
            raise InputError(f"model {model_id}: build failed on the CPU: {one_line(exc)}") from None
        spec = {"batch": batch, "input_shape": json.dumps(list(input_shape)), "dtype": input_dtype}
        x = synthetic_batch(spec, 2, "cpu")[0].to(getattr(torch, input_dtype))
        try:
            _, recorder, (flops, flops_fw, output) = _counted_step(model, x, mode)
        except Exception as exc:  # noqa: BLE001 - any model error becomes a one-line InputError
            raise InputError(f"model {model_id}: {mode} step failed on the CPU too: {one_line(exc)}") from None
    loss_values = _loss_values(output, int(batch)) if mode == "training" else None
    table = _layer_table(recorder.rows, loss_values, mode, int(batch), model_id)
    why = f"not followed on the meta device ({reason})"
    counted = {"model_id": model_id, "mode": mode, "batch": int(batch), "flops": flops, "flops_fw": flops_fw,
               **dict.fromkeys(SIM_COLUMNS, math.nan), "sim_error": why}
    graph = {"graph_nodes": math.nan, "graph_edges": math.nan, "graph_error": why,
             **dict.fromkeys(OP_FEATURES, math.nan), OP_ERROR_COLUMN: why}
    return _model_features(model, x, recorder, table, counted, graph)


def _model_features(model: nn.Module, x: torch.Tensor, recorder: _Recorder, table: pd.DataFrame,
                    counted: dict[str, Any], graph: dict[str, Any]) -> dict[str, Any]:
    """The model-level features (:data:`MODEL_COLUMNS`, in that order) of one traced step."""
    mode, flops_fw = counted["mode"], counted["flops_fw"]
    params = _unique_tensors(model.parameters())
    weight_bytes = tensor_bytes(_unique_tensors([*params, *model.buffers()]))
    activation_bytes = sum(row["out_bytes"] for row in recorder.rows)
    features: dict[str, Any] = {
        **counted,
        "macs": flops_fw / 2,
        "params": sum(p.numel() for p in params),
        "trainable_params": sum(p.numel() for p in params if p.requires_grad),
        "weight_bytes": weight_bytes,
        "activation_bytes": activation_bytes,
        "input_bytes": x.numel() * x.element_size(),
        "train_mem_estimate_bytes": weight_bytes * (4 if mode == "training" else 1) + activation_bytes,
        **_layer_counts(recorder.rows),
        "n_attention": recorder.n_attention,
        "n_module_calls": recorder.n_module_calls,
        **graph,
        "complexity_fw": int(table["c_fw"].sum()),
        "complexity_bw": int(table["c_bw"].sum()),
        "depth": _module_depth(model),
    }
    return {key: features[key] for key in MODEL_COLUMNS}


def _at_precision(build: Callable[[], nn.Module], input_dtype: str, precision: str
                  ) -> tuple[Callable[[], nn.Module], str]:
    """(builder, input dtype) of a config at ``precision``: fp16/bf16 models and float inputs take that dtype;
    fp32, tf32 and amp keep float32 weights (amp's float16 activations are not modelled on the meta device)."""
    dtype = BUILD_DTYPES[normalise_precision(precision)]  # an unknown precision is an error, not fp32
    if dtype == "float32":
        return build, input_dtype
    floating = input_dtype.startswith(("float", "bfloat"))
    return (lambda: build().to(getattr(torch, dtype))), (dtype if floating else input_dtype)


def manifest_builder(row: dict[str, Any], num_classes: int) -> tuple[Callable[[], nn.Module], str]:
    """(builder, input dtype) of one zoo-manifest row at its precision."""
    shape = tuple(json.loads(row["input_shape"]))
    kwargs = json.loads(row["builder_kwargs"])
    build = partial(build_model, row["builder"], row["name"], kwargs, num_classes, shape)
    return _at_precision(build, row["dtype"], row.get("precision", "fp32"))


def featurise_manifest(manifest: pd.DataFrame, num_classes: int, progress: bool = True, optimizer: str = "sgd",
                       op_tables: list[pd.DataFrame] | None = None, cache_bytes: int = CACHE_BYTES,
                       workers: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Features of every (model, mode, batch) config of the zoo manifest: (model table, layer table);
    ``optimizer`` is the profiled training step's (config ``profiling.optimizer``), for the ``sim_*`` and
    ``op_*`` columns; the per-operator tables are appended to ``op_tables`` when given; ``cache_bytes`` as
    in :func:`featurise`. With ``workers`` > 1 the configs are featurised in that many processes forked from this
    one (torch, torchvision and timm imported first); the tables are the same, in the same order."""
    rows = manifest.drop_duplicates(["model_id", "mode", "batch"]).to_dict("records")
    task = partial(_featurise_row, num_classes=num_classes, optimizer=optimizer, cache_bytes=cache_bytes,
                   keep_ops=op_tables is not None)
    models, layers = [], []
    with _row_results(task, rows, workers) as results:
        for feats, table, ops in tqdm(results, total=len(rows), desc="features", file=sys.stderr,
                                      disable=not progress, mininterval=1):
            models.append(feats)
            layers.append(table)
            if op_tables is not None:
                op_tables.extend(ops)
    columns = [*MODEL_COLUMNS, "feature_error"]
    model_table = pd.DataFrame(models, columns=columns).sort_values(["model_id", "mode", "batch"])
    model_table["feature_error"] = model_table["feature_error"].astype("object").fillna("")
    layers = [t for t in layers if t is not None]
    layer_table = pd.concat(layers, ignore_index=True) if layers else pd.DataFrame(columns=list(LAYER_COLUMNS))
    return model_table.reset_index(drop=True), layer_table


RowResult = tuple[dict, "pd.DataFrame | None", list[pd.DataFrame]]


def _featurise_row(row: dict[str, Any], num_classes: int, optimizer: str, cache_bytes: int, keep_ops: bool
                   ) -> RowResult:
    """(model-level features, layer table, operator tables) of one manifest row; a model that cannot be built
    keeps a row, its features missing and the one-line reason in ``feature_error``."""
    shape = tuple(json.loads(row["input_shape"]))
    build, input_dtype = manifest_builder(row, num_classes)
    ops: list[pd.DataFrame] | None = [] if keep_ops else None
    try:
        feats, table = featurise(build, shape, int(row["batch"]), row["mode"], input_dtype, row["model_id"],
                                 optimizer=optimizer, op_tables=ops, cache_bytes=cache_bytes)
    except InputError as exc:
        print(f"features: {exc}", file=sys.stderr)
        feats, table = {"model_id": row["model_id"], "mode": row["mode"], "batch": int(row["batch"]),
                        "feature_error": str(exc)}, None
    return feats, table, ops or []


@contextlib.contextmanager
def _row_results(task: Callable[[dict[str, Any]], RowResult], rows: list[dict[str, Any]], workers: int
                 ) -> Iterator[Iterable[RowResult]]:
    """``task`` of every row, in order: here, or in ``workers`` processes forked from this one."""
    if workers <= 1 or len(rows) <= 1:
        yield map(task, rows)
        return
    with forked_pool(workers) as pool:
        yield pool.map(task, rows, chunksize=1)


@contextlib.contextmanager
def forked_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """``workers`` warm featurising processes: forked from this one after torch, torchvision and timm are imported
    (once here, not in every worker), each with one intra-op thread."""
    import multiprocessing

    import timm  # noqa: F401
    import torchvision  # noqa: F401

    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        yield pool


def simulated_memory(build: Callable[[], nn.Module], input_shape: tuple[int, ...], batch: int, mode: str,
                     input_dtype: str = "float32", optimizer: str = "sgd", model_id: str = ""
                     ) -> SimulatedMemory:
    """The memory simulation alone (:func:`perfzoo.features.memory.simulate_peak_memory`) of a fresh meta
    build, its operators' kernels run through a :class:`~perfzoo.features.ops.MetaKernelCache`."""
    with torch.device("meta"):
        try:
            model = _build_on_meta(build)
            x = _make_input(tuple(int(d) for d in input_shape), int(batch), input_dtype)
        except Exception as exc:  # noqa: BLE001 - any builder error becomes a one-line InputError
            raise InputError(f"model {model_id}: build failed: {one_line(exc)}") from None
    return simulate_peak_memory(model, x, mode, optimizer, model_id, rider=_through_kernel_cache())


def _through_kernel_cache() -> StepRider:
    """A rider that runs the operators of both replayed steps through the process's :class:`MetaKernelCache`."""
    kernels = PROCESS_KERNELS

    @contextlib.contextmanager
    def ride(index: int, untracked: Callable[[], contextlib.AbstractContextManager[None]]) -> Iterator[Runner]:
        yield kernels

    return ride


def simulate_manifest(manifest: pd.DataFrame, num_classes: int, optimizer: str = "sgd") -> pd.DataFrame:
    """Simulated memory (:data:`SIM_COLUMNS`) of every (model, mode, batch) of the zoo manifest; a config the
    simulation fails on keeps its row with missing values and the one-line reason in ``sim_error``."""
    records = []
    for row in manifest.drop_duplicates(["model_id", "mode", "batch"]).to_dict("records"):
        build, input_dtype = manifest_builder(row, num_classes)
        key = {"model_id": row["model_id"], "mode": row["mode"], "batch": int(row["batch"])}
        shape = tuple(json.loads(row["input_shape"]))
        simulate = partial(simulated_memory, build, shape, key["batch"], key["mode"], input_dtype, optimizer,
                           row.get("label", row["model_id"]))
        records.append({**key, **feature_row(simulate)})
    return pd.DataFrame(records, columns=["model_id", "mode", "batch", *SIM_COLUMNS, "sim_error"])
