"""Operator-level features: one profiled step traced on the meta device into its aten operators.

:func:`trace_step` runs the step the profiler times (:func:`perfzoo.profiling.core.make_step`: an inference
forward under ``no_grad``, or a training step of forward, cross-entropy loss, backward and optimizer step)
on a meta-device model under a ``TorchDispatchMode`` and records one row per aten operator
(:data:`OP_COLUMNS`). In a training step the optimizer steps once untraced before its traced step, so the
traced optimizer operators are those of the steady state the profiler measures (its state exists).

Per operator
------------
op
    The aten overload, e.g. ``aten.addmm.default``.
kind
    One of :data:`OP_KINDS`, from the operator name (:func:`op_kind`); convolutions with ``groups > 1``
    (depthwise, grouped) are kinds of their own, as they run far fewer FLOPs per second than dense ones on a
    CPU; every operator run by the optimizer
    step is of kind ``optimizer``. ``view`` holds views, metadata and allocation-only operators
    (``view``, ``t``, ``expand``, ``detach``, ``empty``...): they move no data and cost nothing, so their
    bytes are 0 and they are left out of the model-level aggregates.
phase
    ``forward`` (model and loss), ``backward`` or ``optimizer``.
flops
    Counted by the formulas of ``torch.utils.flop_counter`` (the registry of a ``FlopCounterMode``, passed
    in by the caller so that it matches the model-level ``flops``); 0 for operators without a formula
    (elementwise, pooling, norms: FlopCounterMode counts matmuls, convolutions and attention only).
    Operators without a formula are decomposed first when PyTorch has a decomposition, as FlopCounterMode
    does, so the per-operator FLOPs sum to FlopCounterMode's total.
bytes_read, bytes_written
    Sum of the bytes of the input tensors and of the output tensors of the call (an in-place operator
    reads and writes its first argument). ``intensity = flops / (bytes_read + bytes_written)``, NaN for an
    operator that moves no bytes.
bytes_cached
    The part of ``bytes_read`` still in a cache of :data:`CACHE_BYTES` when the operator reads it, in the
    steady state of a loop over the step (:func:`cached_bytes`): a recurrent layer's weights, read at every
    time step, or an activation read right after it was written.

Model level
-----------
:func:`op_aggregates` sums, per kind of :data:`COSTED_KINDS`, the bytes moved to and from memory
(``bytes_read + bytes_written - bytes_cached``) and calls into ``op_<kind>_bytes`` and
``op_<kind>_count``, and FLOPs into ``op_<kind>_flops`` for the kinds that have FLOP formulas
(:data:`FLOP_KINDS`; for the others it would always be 0) (:data:`OP_FEATURES`).

Operators the tracer cannot follow
----------------------------------
An operator without a meta kernel, data-dependent control flow (``Tensor.item()``, ``bool(tensor)``,
``nonzero``...) or any other failure inside the step raises :class:`OpTraceError` naming the model and the
operator (or the last operator that ran); :func:`traced_op_features` turns it into missing aggregates with the
reason in ``op_trace_error``, never zeros.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves

from perfzoo.features.recurrent import cpu_kernels
from perfzoo.features.op_kinds import (
    FLOP_KINDS,
    FREE_KIND,
    GROUPED_KINDS,
    OP_COLUMNS,
    OP_ERROR_COLUMN,
    OP_FEATURES,
    OP_FEATURE_KINDS,
)
from perfzoo.io import InputError, one_line
from perfzoo.profiling.core import OPTIMIZERS, make_optimizer, step_loss


# Operator packet names per kind (after ``aten.``); pointwise operators are found by their ``pointwise`` tag.
_KIND_NAMES: dict[str, frozenset[str]] = {
    "matmul": frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_int_mm", "addmv", "mv", "dot"}),
    "attention": frozenset({
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
        "_efficient_attention_forward", "_flash_attention_forward", "_efficient_attention_backward",
        "_flash_attention_backward",
    }),
    "conv": frozenset({"convolution", "_convolution", "mkldnn_convolution", "conv2d", "conv1d", "conv3d"}),
    "conv_backward": frozenset({"convolution_backward"}),
    "recurrent": frozenset({"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"}),
    "norm": frozenset({
        "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
        "_native_batch_norm_legit_functional", "native_batch_norm_backward", "native_layer_norm",
        "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward", "_fused_rms_norm",
        "_fused_rms_norm_backward", "batch_norm_backward", "cudnn_batch_norm", "cudnn_batch_norm_backward",
    }),
    "pool": frozenset({
        "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "max_pool3d_with_indices",
        "max_pool3d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "avg_pool3d",
        "avg_pool3d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d",
        "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "max_pool2d",
        "_low_memory_max_pool_with_offsets", "_low_memory_max_pool_offsets_to_indices",
    }),
    "softmax": frozenset({
        "_softmax", "_safe_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
    }),
    "reduction": frozenset({
        "sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "norm", "prod",
        "argmax", "argmin", "cumsum", "logsumexp", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward",
        "nll_loss2d_backward", "linalg_vector_norm", "any", "all", "topk", "sort",
    }),
    "embedding": frozenset({"embedding", "embedding_dense_backward", "_embedding_bag", "embedding_bag"}),
    "copy": frozenset({
        "clone", "copy_", "_to_copy", "cat", "stack", "constant_pad_nd", "index_select", "gather", "scatter",
        "index", "index_put", "index_put_", "flip", "roll", "repeat", "_unsafe_index", "slice_scatter",
        "select_scatter", "as_strided_scatter", "new_zeros", "zeros_like", "ones_like", "full_like", "zeros",
        "ones", "full", "fill_", "zero_", "new_ones", "new_full", "tril", "triu", "masked_fill",
        "reflection_pad2d", "replication_pad2d", "upsample_nearest2d", "upsample_bilinear2d", "im2col", "col2im",
        "select_backward", "slice_backward", "arange",
    }),
    "elementwise": frozenset({
        "hardtanh_backward", "hardswish_backward", "hardsigmoid_backward", "bernoulli_", "bernoulli",
        "native_dropout", "native_dropout_backward", "silu_backward", "elu_backward", "leaky_relu_backward",
        "softplus_backward", "mish_backward",
    }),
    "view": frozenset({
        "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze",
        "select", "slice", "split", "split_with_sizes", "unbind", "chunk", "narrow", "detach", "alias",
        "as_strided", "unfold", "flatten", "view_as", "lift_fresh", "empty", "empty_like", "empty_strided",
        "new_empty", "new_empty_strided", "_reshape_alias", "diagonal", "movedim", "expand_as", "real",
        "_unsafe_view_copy", "set_", "resize_", "_has_compatible_shallow_copy_type", "is_same_size",
        "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk",  # views without autograd's tracking (RNNs)
    }),
}
# Operators that query metadata only and return no tensor: not recorded.
_METADATA_OPS = frozenset({
    "sym_is_contiguous", "is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense", "size",
    "sym_size", "stride", "sym_stride", "storage_offset", "sym_storage_offset", "numel", "sym_numel", "dim",
    "layout", "device",
})
# Operators whose result depends on tensor values: they cannot be followed on the meta device.
_DATA_DEPENDENT_OPS = frozenset({"_local_scalar_dense", "item", "nonzero", "masked_select", "unique_dim",
                                 "_unique2", "unique_consecutive", "equal", "is_nonzero"})


class OpTraceError(InputError):
    """An operator of the step could not be followed on the meta device; the message names model and op."""


class DataDependentError(OpTraceError):
    """The step's control flow depends on tensor values (``Tensor.item()``, ``if tensor:``, ``nonzero``), which
    the meta device does not have; the message names the model and the operator or PyTorch's error."""


# Position of ``groups`` in the arguments of the convolution operators.
_GROUPS_ARG = {"convolution": 8, "_convolution": 8, "convolution_backward": 9}


def _is_grouped(name: str, args: tuple) -> bool:
    position = _GROUPS_ARG.get(name)
    return position is not None and len(args) > position and int(args[position]) > 1


def grouped_kind(kind: str, grouped: bool) -> str:
    """``kind``, or for a convolution with ``groups > 1`` its grouped kind (:data:`GROUPED_KINDS`)."""
    return GROUPED_KINDS.get(kind, kind) if grouped else kind


def op_kind(func: torch._ops.OpOverload, args: tuple = ()) -> str:
    """The kind (:data:`OP_KINDS`) of an aten operator, from its packet name or its ``pointwise`` tag; a
    convolution with ``groups > 1`` in ``args`` has its grouped kind (:func:`grouped_kind`)."""
    name = func._overloadpacket.__name__
    for kind, names in _KIND_NAMES.items():
        if name in names:
            return grouped_kind(kind, _is_grouped(name, args))
    if getattr(func, "is_view", False) or torch.Tag.inplace_view in getattr(func, "tags", ()):  # transpose_
        return FREE_KIND
    if torch.Tag.pointwise in getattr(func, "tags", ()):
        return "elementwise"
    return "other"


def phase_kind(kind: str, phase: str) -> str:
    """The recorded kind of an operator of ``kind`` run in ``phase``: every costed operator of the optimizer
    step is of kind ``optimizer``."""
    return "optimizer" if phase == "optimizer" and kind != FREE_KIND else kind


@functools.cache
def recorded_op_kind(op: str, grouped: bool = False, phase: str = "forward") -> str | None:
    """The kind the meta trace gives an operator recorded by name (``str(func)``, e.g. ``aten.addmm.default``)
    with its grouped-convolution flag and phase (the measured per-operator times of
    :mod:`perfzoo.profiling.op_timing`); None for an operator the meta trace does not record (metadata
    queries, profiler ranges). An unknown name raises a one-line InputError."""
    namespace, packet, overload = (op.split(".") + ["", ""])[:3]
    if packet in _METADATA_OPS or namespace == "profiler":
        return None
    try:
        func = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except (AttributeError, RuntimeError):
        raise InputError(f"unknown operator {op!r} (not a registered torch operator overload)") from None
    return phase_kind(grouped_kind(op_kind(func), grouped), phase)


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """The tensors among the leaves of ``obj`` (nested tuples, lists, dicts of them), in pytree order."""
    found: list[torch.Tensor] = []
    _collect_tensors(obj, found)
    return found


_PLAIN_LEAVES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def _collect_tensors(obj: Any, found: list[torch.Tensor]) -> None:
    """Plain tuples, lists and dicts walked directly (an operator's arguments and outputs), anything else by
    ``tree_leaves`` (registered containers such as named tuples); the order is ``tree_leaves``'s."""
    kind = type(obj)
    if isinstance(obj, torch.Tensor):
        found.append(obj)
    elif kind is tuple or kind is list:
        for item in obj:
            _collect_tensors(item, found)
    elif kind is dict:
        for item in obj.values():
            _collect_tensors(item, found)
    elif kind not in _PLAIN_LEAVES:
        found.extend(leaf for leaf in tree_leaves(obj) if isinstance(leaf, torch.Tensor))


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors among the leaves of ``obj``."""
    return sum(t.numel() * t.element_size() for t in tensors_in(obj))


def _shapes(tensors: list[torch.Tensor]) -> str:
    """The shapes as a JSON list of lists (``str`` of a list of lists of ints writes the same text as
    ``json.dumps``, at a fraction of its cost)."""
    return str([list(t.shape) for t in tensors])


def _run_kernel(func: Any, args: tuple, kwargs: dict) -> Any:
    return func(*args, **kwargs)


def _decomposable(func: torch._ops.OpOverload) -> bool:
    """Whether ``func.decompose`` has a decomposition to run (a Python or CompositeImplicitAutograd kernel)."""
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    return key in func.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)


def _metadata(out: Any) -> tuple:
    """What later operators and their records see of an output: its structure and, per tensor, shape, strides,
    offset and dtype."""
    leaves, spec = tree_flatten(out)
    return spec, [(tuple(v.shape), v.stride(), v.storage_offset(), v.dtype) if isinstance(v, torch.Tensor) else v
                  for v in leaves]


_ACCESSES = "_accesses"
"""Key of a recorded row's memory accesses (:meth:`_Storages.accesses` of its inputs and of its outputs); not a
column."""
CACHE_BYTES = 16 * 2**20
"""Capacity of the cache the trace's reuse is judged against (``bytes_cached``): 16 MiB, chosen among 2, 4, 8, 16
and 32 MiB by the lowest MAPE of ``composed`` on the selection splits of two default runs (``bench/RESULTS.md``,
"Bytes read from cache"; 8 MiB was 0.01 points behind); it lies between the default CPU's L2 (1 MiB a core) and
its shared L3 (32 MiB). One value for every device: the operator trace does not depend on the device."""


class _Storages:
    """A serial number for each storage the trace sees, so that the cache simulation depends on the step alone:
    a storage freed and another allocated at its address get different numbers, whatever the allocator does."""

    def __init__(self) -> None:
        self.serials: dict[int, int] = {}
        self.count = itertools.count()

    def accesses(self, tensors: list[torch.Tensor]) -> tuple[tuple[int, int, int], ...]:
        """(serial, bytes of the tensor, bytes of its storage) of each tensor an operator reads or writes."""
        return tuple(self._access(t) for t in tensors)

    def serial(self, t: torch.Tensor, alias: int | None = None) -> int:
        """The storage's serial number; a storage seen for the first time takes ``alias`` when given."""
        return self._access(t, alias)[0]

    def fresh(self) -> int:
        return next(self.count)

    def _access(self, t: torch.Tensor, alias: int | None = None) -> tuple[int, int, int]:
        """(serial, bytes of ``t``, bytes of its storage): views share a storage; a tensor without one is its
        own, never forgotten."""
        nbytes = t.numel() * t.element_size()
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            storage = None
        key, storage_bytes = (storage._cdata, storage.nbytes()) if storage is not None else (id(t), nbytes)
        serial = self.serials.get(key)
        if serial is None:
            serial = self.serials[key] = next(self.count) if alias is None else alias
            if storage is not None:  # a freed storage's address may hold the next one: forget its number
                weakref.finalize(storage, self.serials.pop, key, None)
        return serial, nbytes, storage_bytes


def _remapped(row: dict[str, Any], serials: dict[int, int], fresh: Callable[[], int]) -> dict[str, Any]:
    """A recorded row again, its storages renamed by ``serials`` (a storage not in it gets a fresh number, added
    to it): the rows of a decomposition replayed on other tensors."""
    accesses = tuple(tuple((serials[s] if s in serials else serials.setdefault(s, fresh()), n, b)
                           for s, n, b in group) for group in row.get(_ACCESSES, ()))
    return {**row, _ACCESSES: accesses}


def cached_bytes(rows: list[dict[str, Any]], capacity: int = CACHE_BYTES) -> np.ndarray:
    """Per operator, the bytes it reads that are still in a least-recently-used cache of ``capacity`` bytes
    of whole storages, in the steady state of a loop over the step (the step replayed once to warm the cache,
    then counted): a weight read at every time step of a recurrent layer, or an activation read right after
    it was written, is read from cache. Outputs are allocated in the cache as they are written; a storage
    larger than the cache never stays in it."""
    cache: OrderedDict[int, int] = OrderedDict()
    held = 0
    counted = np.zeros(len(rows), dtype=np.int64)
    for counting in (False, True):
        for i, row in enumerate(rows):
            accesses = row.get(_ACCESSES, ())
            for is_output, group in enumerate(accesses):
                for key, nbytes, storage_bytes in group:
                    hit = cache.get(key) == storage_bytes
                    if hit:
                        cache.move_to_end(key)
                        if counting and not is_output:
                            counted[i] += nbytes
                        continue
                    held -= cache.pop(key, 0)
                    if storage_bytes > capacity:
                        continue
                    cache[key] = storage_bytes
                    held += storage_bytes
                    while held > capacity:
                        held -= cache.popitem(last=False)[1]
    return counted


@dataclass(frozen=True)
class _Decomposed:
    """What a decomposition recorded: its rows and FLOPs, and the storage serials of the call's inputs and of
    the decomposition's outputs."""

    rows: list[dict[str, Any]]
    flops: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


class OpRecorder(TorchDispatchMode):
    """Dispatch mode that runs every aten operator and records one row per call (and the FLOPs of all)."""

    def __init__(self, model_id: str, flop_registry: dict[Any, Callable[..., int]], record_rows: bool = True
                 ) -> None:
        super().__init__()
        self.model_id = model_id
        self.flop_registry = flop_registry
        self.record_rows = record_rows
        self.phase = "forward"
        self.rows: list[dict[str, Any]] = []
        self.last_op = ""
        self.total_flops = 0
        """FLOPs of every operator recorded so far (the running total FlopCounterMode keeps)."""
        self.kernel: Callable[[Any, tuple, dict], Any] = _run_kernel
        """Runs an operator's kernel: plainly, or through a :class:`MetaKernelCache`."""
        self.decomposable: dict[Any, bool] = {}
        self.decompositions: dict[tuple, _Decomposed] = {}
        """What a decomposition recorded, by phase and argument metadata (:meth:`run` with ``keep_kernel``
        replays it instead of decomposing again)."""
        self.storages = _Storages()
        self.failure: OpTraceError | None = None
        """The operator :meth:`run` with ``keep_kernel`` could not follow (the trace stopped there and the
        step ran on untraced)."""
        self.differs = ""
        """Why operators run by :meth:`run` with ``keep_kernel`` were recorded differently from this mode alone
        (empty when they were not)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return self.run(func, args, kwargs or {})

    def run(self, func: Any, args: tuple, kwargs: dict, keep_kernel: bool = False) -> Any:
        """Run and record one operator as this mode does; with ``keep_kernel`` (the operator is also seen by an
        outer mode, such as the memory simulation's) a decomposed operator returns its own kernel's output,
        not the decomposition's, and :attr:`differs` says when the two outputs' metadata differ or when
        ``FlopCounterMode`` would have counted the operator differently."""
        if self.failure is not None:
            return self.kernel(func, args, kwargs)
        name = func._overloadpacket.__name__
        untraced = name in _METADATA_OPS or func.namespace == "profiler"
        if isinstance(func, torch._ops.HigherOrderOperator) and keep_kernel:
            self.differs = f"{func} is a higher-order operator"
        if untraced or isinstance(func, torch._ops.HigherOrderOperator):
            return self.kernel(func, args, kwargs)
        if name in _DATA_DEPENDENT_OPS:
            error = DataDependentError(
                f"model {self.model_id}: {func} depends on tensor values (data-dependent control flow, e.g. "
                "Tensor.item() or `if tensor:`); it cannot be traced on the meta device"
            )
            if not keep_kernel:
                raise error
            self.failure = error  # an outer mode needs the step to go on (a CPU tensor's value can be read)
            return self.kernel(func, args, kwargs)
        formula = func._overloadpacket in self.flop_registry
        if not formula and self._decomposable(func):  # as FlopCounterMode: count a decomposition's ops
            key = _metadata_key(func, args, kwargs) if keep_kernel else None
            recorded = self.decompositions.get((self.phase, key)) if key is not None else None
            if recorded is not None:  # the same decomposition on the same metadata: the same records
                return self._replay(recorded, func, args, kwargs)
            rows, flops = len(self.rows), self.total_flops
            inputs = self._serials(tensors_in((args, kwargs)))
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented and not keep_kernel:
                return out
            if out is not NotImplemented:
                decomposed = self._serials(tensors_in(out))
                out = self._kernel_output(func, args, kwargs, out)
                for tensor, serial in zip(tensors_in(out), decomposed, strict=False):  # it stands for them
                    self.storages.serial(tensor, alias=serial)
                if key is not None and not self.differs and self.failure is None:
                    self.decompositions[(self.phase, key)] = _Decomposed(
                        self.rows[rows:], self.total_flops - flops, inputs, decomposed)
                return out
        elif formula and keep_kernel and self._decomposable(func):
            self.differs = f"FlopCounterMode decomposes {func}, which has a FLOP formula"
        self.last_op = str(func)
        try:
            out = self.kernel(func, args, kwargs)
        except OpTraceError:
            raise
        except Exception as exc:  # noqa: BLE001 - any kernel failure names the operator
            raise OpTraceError(f"model {self.model_id}: {func} cannot run on the meta device: {one_line(exc)}"
                               ) from None
        self._record(func, args, kwargs, out)
        return out

    def _serials(self, tensors: list[torch.Tensor]) -> tuple[int, ...]:
        return tuple(self.storages.serial(t) for t in tensors) if self.record_rows else ()

    def _replay(self, recorded: _Decomposed, func: Any, args: tuple, kwargs: dict) -> Any:
        """The kernel's output, after the rows of a decomposition recorded on the same metadata, their storages
        renamed: the recorded inputs and outputs to this call's, the intermediates to new ones."""
        serials = dict(zip(recorded.inputs, self._serials(tensors_in((args, kwargs))), strict=False))
        out = self.kernel(func, args, kwargs)
        serials.update(zip(recorded.outputs, self._serials(tensors_in(out)), strict=False))
        self.rows.extend(_remapped(row, serials, self.storages.fresh) for row in recorded.rows)
        self.total_flops += recorded.flops
        return out

    def _decomposable(self, func: Any) -> bool:
        decomposable = self.decomposable.get(func)
        if decomposable is None:
            decomposable = self.decomposable[func] = _decomposable(func)
        return decomposable

    def _kernel_output(self, func: Any, args: tuple, kwargs: dict, decomposed: Any) -> Any:
        """The operator's own output, after its decomposition ran for the record; notes in :attr:`differs`
        when the later operators would see other metadata than the decomposition's output gives them."""
        out = self.kernel(func, args, kwargs)
        if _metadata(out) != _metadata(decomposed):
            self.differs = f"{func} and its decomposition give outputs of different shapes, strides or dtypes"
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        formula = self.flop_registry.get(func._overloadpacket)
        flops = _flops(formula, func, args, kwargs, out) if formula is not None else 0
        self.total_flops += flops
        if not self.record_rows:
            return
        kind = op_kind(func, args)
        inputs, outputs = tensors_in((args, kwargs)), tensors_in(out)
        free = kind == FREE_KIND
        read, written = (0, 0) if free else (tensor_bytes(inputs), tensor_bytes(outputs))
        self.rows.append({
            "op": str(func), "kind": phase_kind(kind, self.phase),
            "phase": self.phase, "in_shapes": _shapes(inputs), "out_shapes": _shapes(outputs),
            "dtype": str(outputs[0].dtype).removeprefix("torch.") if outputs else "",
            "flops": flops, "bytes_read": read, "bytes_written": written,
            _ACCESSES: () if free else (self.storages.accesses(inputs), self.storages.accesses(outputs)),
        })  # fmt: skip

    def features(self, mode: str, batch: int, cache_bytes: int = CACHE_BYTES, table: bool = True
                 ) -> tuple[dict[str, Any], pd.DataFrame | None]:
        """(``op_*`` aggregates and ``op_trace_error``, per-operator table) of the rows recorded, as
        :func:`traced_op_features` gives them (missing, with the reason, after a :attr:`failure`);
        ``cache_bytes`` is the capacity behind ``bytes_cached``; ``table=False`` gives the aggregates alone
        (no table is built: the import path keeps none)."""
        if self.failure is not None:
            return _untraced(self.failure), None
        cached = cached_bytes(self.rows, cache_bytes)
        columns = ([row[column] for row in self.rows] for column in ("kind", "flops", "bytes_read", "bytes_written"))
        aggregates = _aggregates(*columns, cached.tolist())
        return ({**aggregates, OP_ERROR_COLUMN: ""},
                _op_table(self.rows, self.model_id, mode, batch, cached) if table else None)

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        self.phase = phase
        with self:
            yield


_FLOPS: dict[tuple, int] = {}
"""FLOPs of a formula by operator and argument metadata (:func:`_metadata_key`), for this process."""
FLOP_CACHE_ENTRIES = 100_000
"""Most entries :data:`_FLOPS` keeps before it starts afresh."""


def _flops(formula: Callable[..., int], func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """The formula's FLOPs for the call, from :data:`_FLOPS` when the same formula saw the same argument metadata
    (a formula reads shapes and other argument values; an output's shape follows from its arguments')."""
    key = _metadata_key(func, args, kwargs)
    if key is not None:
        flops = _FLOPS.get((formula, key))
        if flops is not None:
            return flops
    flops = int(formula(*args, **kwargs, out_val=out))
    if key is not None:
        if len(_FLOPS) >= FLOP_CACHE_ENTRIES:
            _FLOPS.clear()
        _FLOPS[(formula, key)] = flops
    return flops


class MetaKernelCache:
    """Runs aten operators on meta tensors, answering a functional operator (no argument it aliases or
    mutates, no random draw) seen before with the same argument metadata from its earlier output's metadata,
    without running its meta kernel again (most are Python code, and the step's cost on the meta device).

    A meta kernel's output is a function of its arguments' shapes, strides, offsets, dtypes and non-tensor
    values; an output is only reused as new tensors of its shapes, strides and dtypes when those tensors are
    indistinguishable from it (each output its own storage, of the size ``empty_strided`` gives, at offset 0).
    An in-place operator (``relu_``, ``hardswish_``: it writes its first argument, returns it and aliases
    nothing else) seen before on the same metadata returns its first argument without its kernel, when the
    kernel returned that argument with its metadata unchanged then (``unsqueeze_`` changes them: it always
    runs). On the meta device a kernel writes no values, and autograd bumps the version counter outside it.

    Nothing in an entry belongs to a model, so one cache may serve every model a process featurises; with
    ``max_entries`` it starts afresh when it holds that many.
    """

    def __init__(self, max_entries: int | None = None) -> None:
        self.outputs: dict[tuple, Any] = {}
        self.kinds: dict[Any, str] = {}
        self.hits = 0
        self.max_entries = max_entries

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> Any:
        key = self._key(func, args, kwargs)
        entry = self.outputs.get(key, _UNSEEN) if key is not None else None
        if entry is _UNSEEN:
            out = func(*args, **kwargs)
            if self.max_entries is not None and len(self.outputs) >= self.max_entries:
                self.outputs.clear()
            if self.kinds[func] == _IN_PLACE:  # key[1][1]: the first argument's metadata before the call
                self.outputs[key] = _SELF if out is args[0] and _argument_key(args[0]) == key[1][1] else None
            else:
                self.outputs[key] = _rebuildable(out, (args, kwargs))
            return out
        if entry is None:
            return func(*args, **kwargs)
        self.hits += 1
        return args[0] if entry is _SELF else _rebuilt(entry)

    def clear(self) -> None:
        """Forget every answer (a cold cache, as in a new process)."""
        self.outputs.clear()
        self.hits = 0

    def _key(self, func: Any, args: tuple, kwargs: dict) -> tuple | None:
        kind = self.kinds.get(func)
        if kind is None:
            kind = self.kinds[func] = _FUNCTIONAL if _is_functional(func) else (
                _IN_PLACE if _is_in_place(func) else "")
        return _metadata_key(func, args, kwargs) if kind else None


def _metadata_key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """What a meta kernel or a decomposition of ``func`` sees of its arguments: their structure, each meta
    tensor's shape, strides, offset and dtype, and the other values; None when an argument is anything else."""
    try:
        return func, _argument_key(args), _argument_key(kwargs)
    except _NotKeyed:
        return None


class _NotKeyed(Exception):
    """An argument that is neither a meta tensor, a plain value nor a tuple, list or dict of them."""


_SEQUENCES = (tuple, list, torch.Size)


def _argument_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if not value.is_meta:
            raise _NotKeyed
        return value.shape, value.stride(), value.storage_offset(), value.dtype
    kind = type(value)
    if kind in _SEQUENCES:
        return kind, *map(_argument_key, value)
    if kind is dict:
        return dict, *((name, _argument_key(item)) for name, item in value.items())
    if kind in _PLAIN_LEAVES:
        return kind, value
    raise _NotKeyed


_UNSEEN = object()
_SELF = object()
"""The cached answer of an in-place operator: its first argument."""
_FUNCTIONAL, _IN_PLACE = "functional", "in place"


@dataclass(frozen=True)
class _TensorMeta:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class _Items:
    kind: type
    items: tuple[Any, ...]


def _rebuilt(described: Any) -> Any:
    """New tensors (and values) of the structure :func:`_described` recorded."""
    if isinstance(described, _TensorMeta):
        return torch.empty_strided(described.shape, described.stride, dtype=described.dtype, device="meta")
    if isinstance(described, _Items):
        return described.kind(map(_rebuilt, described.items))
    return described


def _is_functional(func: Any) -> bool:
    if not isinstance(func, torch._ops.OpOverload) or func.namespace != "aten":
        return False
    schema = func._schema
    return (not schema.is_mutable and torch.Tag.nondeterministic_seeded not in func.tags
            and all(a.alias_info is None for a in (*schema.arguments, *schema.returns)))


def _is_in_place(func: Any) -> bool:
    """An aten operator that writes its first argument and returns it, aliasing no other argument."""
    if not isinstance(func, torch._ops.OpOverload) or func.namespace != "aten":
        return False
    arguments, returns = func._schema.arguments, func._schema.returns
    return (bool(arguments) and torch.Tag.nondeterministic_seeded not in func.tags
            and arguments[0].alias_info is not None and arguments[0].alias_info.is_write
            and len(returns) == 1 and returns[0].alias_info is not None and returns[0].alias_info.is_write
            and all(a.alias_info is None for a in arguments[1:]))


def _rebuildable(out: Any, inputs: Any) -> Any:
    """The output's structure with each tensor's :class:`_TensorMeta`, when new tensors of its shapes, strides
    and dtypes stand in for it exactly (an output sharing storage with an input, as ``_unsafe_view``'s, does
    not); else None."""
    try:
        return _described(out, {t.untyped_storage()._cdata for t in tensors_in(inputs)})
    except _NotKeyed:
        return None


def _described(value: Any, storages: set[int]) -> Any:
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        fresh = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        if (not value.is_meta or type(value) is not torch.Tensor or value.storage_offset() != 0
                or storage.nbytes() != fresh.untyped_storage().nbytes() or storage._cdata in storages
                or value.is_conj() or value.is_neg()):
            raise _NotKeyed
        storages.add(storage._cdata)
        return _TensorMeta(tuple(value.shape), value.stride(), value.dtype)
    if type(value) in (tuple, list):
        return _Items(type(value), tuple(_described(item, storages) for item in value))
    if type(value) in (int, float, bool, type(None)):
        return value
    raise _NotKeyed


def class_targets(output: Any, model_id: str) -> torch.Tensor:
    """Class targets (index 0) for the cross-entropy loss of the profiled training step: one per sample of the
    (batch, classes) or (batch, tokens, vocab) logits (:func:`perfzoo.profiling.core.step_loss`)."""
    logits = tensors_in(output)
    if len(logits) != 1 or logits[0].dim() not in (2, 3):
        shapes = [tuple(t.shape) for t in logits]
        raise OpTraceError(
            f"model {model_id}: training step needs one (batch, classes) or (batch, tokens, vocab) logits "
            f"tensor, got {shapes}"
        )
    return torch.zeros(logits[0].shape[0], dtype=torch.long, device=logits[0].device)


def _training_step(
    model: nn.Module, x: torch.Tensor, optimizer: str, recorder: OpRecorder, model_id: str
) -> None:
    """forward + cross-entropy + backward + optimizer step, each phase under ``recorder``. The optimizer steps
    once untraced first, so the traced step is the steady state the profiler times (optimizer state exists)."""
    opt = make_optimizer(model, optimizer)
    opt.zero_grad(set_to_none=True)
    with recorder.in_phase("forward"):
        output = model(x)
        loss = step_loss(nn.functional.cross_entropy, output, class_targets(output, model_id))
    with recorder.in_phase("backward"):
        loss.backward()
    opt.step()
    with recorder.in_phase("optimizer"):
        opt.step()


def trace_step(model: nn.Module, x: torch.Tensor, mode: str, flop_registry: dict[Any, Callable[..., int]],
               model_id: str = "", optimizer: str = "sgd", cache_bytes: int = CACHE_BYTES) -> pd.DataFrame:
    """Per-operator table (:data:`OP_COLUMNS`) of one step of ``model`` (on the meta device) on input ``x``.

    ``flop_registry`` maps operator packets to FLOP formulas (``FlopCounterMode(...).flop_registry``);
    ``cache_bytes`` is the capacity behind ``bytes_cached``. Raises :class:`OpTraceError` naming the model and
    operator when an operator cannot be followed.
    """
    if optimizer not in OPTIMIZERS:
        raise InputError(f"model {model_id}: unknown optimizer {optimizer!r} (expected one of {OPTIMIZERS})")
    recorder = OpRecorder(model_id, flop_registry)
    try:
        with cpu_kernels():
            if mode == "inference":
                model.eval()
                with torch.no_grad(), recorder.in_phase("forward"):
                    model(x)
            else:
                model.train()
                _training_step(model, x, optimizer, recorder, model_id)
    except OpTraceError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failure between operators names the last one that ran
        raise OpTraceError(f"model {model_id}: {mode} step failed on the meta device after "
                           f"{recorder.last_op or 'no operator'}: {one_line(exc)}") from None
    return _op_table(recorder.rows, model_id, mode, int(x.shape[0]), cached_bytes(recorder.rows, cache_bytes))


_RECORDED_COLUMNS = OP_COLUMNS[OP_COLUMNS.index("op"):OP_COLUMNS.index("bytes_written") + 1]
"""The columns :meth:`OpRecorder._record` writes per operator (the rest: the config's, and computed)."""


def _op_table(rows: list[dict[str, Any]], model_id: str, mode: str, batch: int, cached: np.ndarray
              ) -> pd.DataFrame:
    """The per-operator table (:data:`OP_COLUMNS`) of recorded rows and their :func:`cached_bytes`."""
    table = pd.DataFrame.from_records(rows, columns=_RECORDED_COLUMNS)
    table["bytes_cached"] = cached
    table.insert(0, "op_idx", np.arange(len(table), dtype=np.int64))
    table.insert(0, "batch", batch)
    table.insert(0, "mode", mode)
    table.insert(0, "model_id", model_id)
    table = table.astype({"flops": "int64", "bytes_read": "int64", "bytes_written": "int64", "bytes_cached": "int64"})
    moved = (table["bytes_read"] + table["bytes_written"]).to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        table["intensity"] = np.where(moved > 0, table["flops"].to_numpy(dtype=float) / moved, np.nan)
    return table[OP_COLUMNS]


def op_table(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """The per-operator tables of many configs as one table (:data:`OP_COLUMNS`; empty when there are none)."""
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=OP_COLUMNS)


def op_aggregates(table: pd.DataFrame) -> dict[str, float]:
    """Model-level ``op_<kind>_flops/bytes/count`` (:data:`OP_FEATURES`) of a per-operator table; the bytes
    are those moved to and from memory, ``bytes_read + bytes_written - bytes_cached``."""
    return _aggregates(*(table[column].tolist() for column in ("kind", "flops", "bytes_read", "bytes_written",
                                                                "bytes_cached")))


def _aggregates(kinds: list[str], flops: list[int], read: list[int], written: list[int], cached: list[int]
                ) -> dict[str, float]:
    """:func:`op_aggregates` of the operators' columns, given as lists (free operators left out)."""
    totals: dict[str, dict[str, int]] = {}
    for kind, op_flops, op_read, op_written, op_cached in zip(kinds, flops, read, written, cached, strict=True):
        if kind == FREE_KIND:
            continue
        total = totals.setdefault(kind, {"flops": 0, "bytes": 0, "count": 0})
        total["flops"] += op_flops
        total["bytes"] += op_read + op_written - op_cached
        total["count"] += 1
    uncounted = sorted(k for k, total in totals.items() if total["flops"] and k not in FLOP_KINDS)
    if uncounted:
        raise ValueError(f"FLOPs counted for operator kinds without a flops feature: {uncounted}")
    return {name: float(totals[kind][stat]) if kind in totals else 0.0
            for name, (kind, stat) in OP_FEATURE_KINDS.items()}


def _untraced(error: OpTraceError) -> dict[str, Any]:
    return {**dict.fromkeys(OP_FEATURES, float("nan")), OP_ERROR_COLUMN: str(error)}


def traced_op_features(build: Callable[[], nn.Module], x: torch.Tensor, mode: str,
                       flop_registry: dict[Any, Callable[..., int]], model_id: str = "", optimizer: str = "sgd",
                       cache_bytes: int = CACHE_BYTES) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """(``op_*`` aggregates and ``op_trace_error``, per-operator table) of a freshly built meta model
    (``cache_bytes``: the capacity behind ``bytes_cached``; 0 counts every byte as moved).

    A step the tracer cannot follow gives NaN aggregates, the one-line reason naming the operator in
    ``op_trace_error`` and no table: missing, never zero.
    """
    try:
        table = trace_step(build(), x, mode, flop_registry, model_id, optimizer, cache_bytes)
    except OpTraceError as exc:
        return _untraced(exc), None
    return {**op_aggregates(table), OP_ERROR_COLUMN: ""}, table

