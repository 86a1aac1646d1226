"""Peak memory of a config's step, simulated on the meta device (no tensor memory is allocated).

:func:`simulate_peak_memory` runs the step the profiler measures (:func:`perfzoo.profiling.core.make_step`:
inference is one forward under ``no_grad``; training is ``zero_grad(set_to_none=True)``, forward,
cross-entropy loss against class targets, backward and one SGD-momentum or Adam step) on meta tensors,
under a ``TorchDispatchMode`` that registers the storage of every tensor an operator returns (once: views
and in-place results share it) with a finaliser that counts the storage's release, and files it under a
category: weights (parameters and buffers, registered before the first step), input (batch and targets,
idem), gradients (a parameter's accumulated ``.grad``), optimizer state (outputs of ``optimizer.step``) and
activations (every other operator output: forward tensors saved for backward, backward temporaries).
PyTorch's ``torch.distributed._tools.mem_tracker.MemTracker`` works the same way and gives the same peak
on the meta device, but took about ten times as long (10 s for a ResNet-50 training step at batch 16), as
it snapshots every module at every operator; this tracker keeps only the totals.

Two steps are replayed: the optimizer state is created at the end of the first, so in the second (and
every later step the profiler times) it is live during forward and backward while the gradients of the
previous step are gone (``set_to_none``). An inference step that leaves only the model and the input live and
rebinds or changes nothing a module holds is replayed once and counted twice, as the second would repeat it
operator for operator (a step that keeps a cache or updates a counter in place is replayed again). The result
is the peak of the live bytes over both steps, the split of that peak by category, and the bytes both steps
allocate in blocks small enough for a C allocator's heap (:data:`HEAP_MAX_BYTES`): their freed blocks are what
fragments a CPU process's heap; and the peak footprint the storages leave in a model of glibc's heap
(:mod:`perfzoo.features.heap`), where a freed block inside the heap stays resident.

Attention and recurrent layers step as the CPU runs them (:func:`perfzoo.features.attention.cpu_attention`;
:func:`perfzoo.features.recurrent.cpu_recurrent`: a GRU or an RNN holds its sequence's input products as the CPU
does, an LSTM keeps the meta device's generic path, whose gate tensors stand in for the fused layer's workspace).

What it does not see: memory an operator's kernel allocates internally (convolution workspaces, oneDNN
weight reorders, BLAS packing buffers), the allocator's rounding and where its fragmentation leaves the
freed blocks, and the runtime
itself (code pages of the kernels that run, thread stacks). Those are what the per-device calibration of
:class:`perfzoo.regressors.memory.MemorySimRegressor` absorbs. Precision is whatever dtype the model and
input carry; AMP's float16 activations under autocast are not modelled (meta tensors are not autocast).
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from perfzoo.features.heap import Heap
from perfzoo.io import InputError, one_line
from perfzoo.profiling.core import OPTIMIZERS, make_step

if TYPE_CHECKING:
    import torch
    from torch import nn

SIM_STEPS = 2
"""Steps replayed: the first creates the optimizer state, the second runs with it (as every timed step)."""
SIM_COLUMNS = ("sim_peak_bytes", "sim_start_bytes", "sim_weight_bytes", "sim_grad_bytes",
               "sim_optimizer_bytes", "sim_activation_bytes", "sim_heap_churn_bytes", "sim_heap_peak_bytes",
               "sim_op_kinds", "sim_onednn_conv", "sim_cl_depthwise_weight_bytes")
"""Feature columns of :meth:`SimulatedMemory.features`, in order (numeric; ``sim_error`` says why they are
missing in a feature table)."""
CATEGORIES = ("weight", "input", "activation", "grad", "optimizer")
HEAP_MAX_BYTES = 32 * 2**20
"""glibc's largest mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``): a block of this size or more is
always mapped on its own and unmapped when freed; a smaller one may come from the heap once glibc has raised its
threshold (it does so to the size of each mapped block freed, up to this), and a freed heap block stays resident."""


def _unique_storages(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """One tensor per storage (tied weights share one)."""
    seen: dict[int, torch.Tensor] = {}
    for tensor in tensors:
        seen.setdefault(tensor.untyped_storage()._cdata, tensor)
    return list(seen.values())


@dataclass(frozen=True)
class SimulatedMemory:
    """Live tensor bytes of a simulated step: the peak, the start, and the peak split by category."""

    peak_bytes: int
    """Largest sum of live tensor storage bytes at any moment of the replayed steps."""
    start_bytes: int
    """Weights, buffers, input batch and targets before the first step."""
    weight_bytes: int
    """Parameters and buffers, at the peak."""
    grad_bytes: int
    """Parameter gradients live at the peak."""
    optimizer_bytes: int
    """Optimizer state (momentum buffers, Adam moments and step counters) live at the peak."""
    activation_bytes: int
    """Forward outputs saved for backward and backward temporaries live at the peak."""
    heap_churn_bytes: int
    """Bytes of the storages the replayed steps allocated in blocks below :data:`HEAP_MAX_BYTES` (those a C
    allocator may serve from its heap; the first step's include the optimizer state it creates): the traffic whose
    freed blocks leave a CPU process's heap fragmented and resident. Not a term of ``memory_sim``: it explains the
    zoo's labels better than the activation terms but prices a recurrent model's per-time-step allocations, which
    the allocator reuses, as fragmentation (bench/RESULTS.md, "Heap churn")."""
    heap_peak_bytes: int
    """Peak resident bytes of every storage of the simulation (weights and input first, then the replayed steps),
    allocated and freed in order, in a model of glibc's main arena (:mod:`perfzoo.features.heap`): the live peak
    plus what the freed blocks the heap keeps add to it. ``memory_sim``'s peak term (bench/RESULTS.md, "A
    deterministic model of glibc's heap")."""
    input_bytes: int
    """Input batch and targets, at the peak."""
    op_kinds: int
    """Distinct ATen operators (overload packets) the replayed steps ran: a proxy for the kernel code a
    process touches, which counts in a CPU process's resident memory."""
    onednn_conv: int
    """1 when a convolution of the step runs on oneDNN on the CPU (:func:`_runs_on_onednn`), else 0: oneDNN's
    convolution code and its JIT kernels count in a CPU process's resident memory. PyTorch runs a small
    convolution on its own im2col kernel instead (e.g. a ``Conv1d`` over 12 x 256 at batch 1), which
    touches none of that."""
    cl_depthwise_weight_bytes: int
    """Weight bytes of the largest 2-D depthwise convolution whose weight gradient the step computes from a
    channels-last gradient (0 where none does; ConvNeXt's 7 x 7 blocks): on the CPU, oneDNN's backward-weights
    pass of such a layer pads each channel's kernel into a blocked layout and allocates a temporary of about
    257 times the weight bytes on AVX-512 (bench/RESULTS.md, "Memory a CPU convolution allocates inside
    itself"), whatever the batch, which no meta kernel shows. In ConvNeXt's block the gradient's layout on the
    meta device is the CPU's (it comes from the linear layers between the permutes; checked on all 12 depthwise
    layers of timm's ``convnext_atto``), where the saved input's is not (a meta convolution returns a contiguous
    output where the CPU's keeps a channels-last input's layout); a meta kernel elsewhere may return another
    layout than the CPU's (a norm's backward straight after the permute does), so this is a proxy, not the
    CPU's own choice of kernel."""

    def features(self) -> dict[str, int]:
        """The :data:`SIM_COLUMNS` feature values."""
        values = asdict(self)
        return {column: values[column.removeprefix("sim_")] for column in SIM_COLUMNS}


class _LiveBytes:
    """Live tensor storage bytes per category over time, their peak and the split at the peak.

    Every storage an operator returns is registered once (views and in-place results share a registered
    storage) with a finaliser that counts its release; a new peak copies the per-category totals."""

    def __init__(self, keep_first_step: bool = False) -> None:
        self.live: dict[int, tuple[int, str]] = {}
        self.totals: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.peak = 0
        self.at_peak: dict[str, int] = dict(self.totals)
        self.operators: set[str] = set()
        # the _convolution_signature of every forward convolution (its backward runs on the same library); never
        # the tensors themselves, which would stay live
        self.convolutions: set[tuple] = set()
        self.phase = "activation"
        self.paused = False
        self.step = -1  # index of the replayed step (-1: weights and input, registered before the first)
        self.heap_churn = 0
        self.heap = Heap()
        # ("a", key, bytes) / ("f", key) of step 0, in order, where a repeat of it may be counted (keep_first_step)
        self.keep_first_step = keep_first_step
        self.first_step_heap_events: list[tuple] = []
        self.cl_depthwise_weight_bytes = 0

    def add(self, tensor: torch.Tensor, category: str) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.live:
            return
        nbytes = storage.nbytes()
        self.live[key] = (nbytes, category)
        self.totals[category] += nbytes
        self.current += nbytes
        if self.step >= 0 and nbytes < HEAP_MAX_BYTES:
            self.heap_churn += nbytes
        self.heap.malloc(key, nbytes)
        if self.step == 0 and self.keep_first_step:
            self.first_step_heap_events.append(("a", key, nbytes))
        weakref.finalize(storage, self._free, key)
        if self.current > self.peak:
            self.peak, self.at_peak = self.current, dict(self.totals)

    def _free(self, key: int) -> None:
        self.heap.free(key)
        if self.step == 0 and self.keep_first_step:
            self.first_step_heap_events.append(("f", key))
        nbytes, category = self.live.pop(key)
        self.totals[category] -= nbytes
        self.current -= nbytes

    def repeat_first_step_in_heap(self) -> None:
        """Run step 0's allocations and frees through the heap model once more, as a second step that repeats the
        first operator for operator would (under keys of their own; a free of a storage made before step 0 is not
        repeated): the heap's state after the first step decides where the second's blocks go. Needs a tracker
        that kept them (``keep_first_step``)."""
        if not self.keep_first_step:
            raise RuntimeError("this tracker did not keep the first step's heap events (keep_first_step=False)")
        made = {event[1] for event in self.first_step_heap_events if event[0] == "a"}
        for event in self.first_step_heap_events:
            if event[0] == "a":
                self.heap.malloc(("repeat", event[1]), event[2])
            elif event[1] in made:
                self.heap.free(("repeat", event[1]))

    def reclassify(self, tensor: torch.Tensor, category: str) -> None:
        key = tensor.untyped_storage()._cdata
        if key in self.live:
            nbytes, old = self.live[key]
            self.live[key] = (nbytes, category)
            self.totals[old] -= nbytes
            self.totals[category] += nbytes


    @contextlib.contextmanager
    def untracked(self) -> Iterator[None]:
        """Operators run inside are neither counted nor their outputs registered (still passed to a runner)."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False


Runner = Callable[[Any, tuple, dict], Any]
"""Runs one operator ``(func, args, kwargs)`` and returns its output; plainly ``func(*args, **kwargs)``."""
StepRider = Callable[[int, Callable[[], contextlib.AbstractContextManager[None]]],
                     contextlib.AbstractContextManager["Runner | None"]]
"""Called with a replayed step's index and the tracker's :meth:`_LiveBytes.untracked`: a context entered around
that step, giving the :data:`Runner` that runs its operators (None: run them plainly)."""


def _run_plainly(func: Any, args: tuple, kwargs: dict) -> Any:
    return func(*args, **kwargs)


def _dispatch_mode(tracker: _LiveBytes, run: Runner = _run_plainly) -> Any:
    """A ``TorchDispatchMode`` that registers every operator and every tensor it returns with ``tracker``;
    ``run`` runs the operator."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from perfzoo.features.ops import tensors_in  # lazy: the column names are imported by stages without torch

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if tracker.paused:
                return run(func, args, kwargs or {})
            tracker.operators.add(str(func.overloadpacket))
            if func.overloadpacket is torch.ops.aten.convolution:
                tracker.convolutions.add(_convolution_signature(*args))
            elif func.overloadpacket is torch.ops.aten.convolution_backward:
                tracker.cl_depthwise_weight_bytes = max(tracker.cl_depthwise_weight_bytes,
                                                        _channels_last_depthwise_weight_bytes(*args))
            out = run(func, args, kwargs or {})
            for tensor in tensors_in(out):
                tracker.add(tensor, tracker.phase)
            return out

    return Recording()


@contextlib.contextmanager
def _categorised(tracker: _LiveBytes, model: nn.Module) -> Iterator[None]:
    """Optimizer-step outputs count as optimizer state; a parameter's accumulated gradient as gradient (the
    dispatch mode is entered per step, by :func:`_replay`)."""

    def enter_optimizer(*_: Any) -> None:
        tracker.phase = "optimizer"

    def leave_optimizer(*_: Any) -> None:
        tracker.phase = "activation"

    def gradient(parameter: torch.Tensor) -> None:
        tracker.reclassify(parameter.grad, "grad")

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    handles = [register_optimizer_step_pre_hook(enter_optimizer),
               register_optimizer_step_post_hook(leave_optimizer),
               *(p.register_post_accumulate_grad_hook(gradient) for p in model.parameters()
                 if p.requires_grad)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _replay(step: Callable[[], None], tracker: _LiveBytes, rider: StepRider | None,
            repeats_itself: Callable[[], bool] = lambda: False) -> None:
    """The :data:`SIM_STEPS` steps under the tracker's dispatch mode, each inside ``rider``'s context; once the
    first leaves ``repeats_itself()`` true, every later step is counted as a repeat of it instead of run."""
    for index in range(SIM_STEPS):
        tracker.step = index
        with rider(index, tracker.untracked) if rider else contextlib.nullcontext() as run:
            with _dispatch_mode(tracker, run or _run_plainly):
                step()
        if index == 0 and repeats_itself():
            tracker.heap_churn *= SIM_STEPS  # the peak, the operators and the convolutions are the first's
            tracker.repeat_first_step_in_heap()  # SIM_STEPS is 2: one repeat
            return


_HELD_DEPTH = 3
"""How many levels of containers and plain objects under a module attribute :func:`_held` looks into."""
_ATOMS = frozenset({int, float, bool, complex, str, bytes, type(None)})
"""Immutable values that hold nothing: compared by identity alone."""


@functools.cache
def _module_internals() -> frozenset[str]:
    """The attributes every ``nn.Module`` sets up for itself (hooks, parameter, buffer and submodule dicts): the
    featuriser's own hooks change their contents, and their tensors and submodules are compared by identity."""
    from torch import nn  # lazy: the column names are imported by stages that never run a model

    return frozenset(vars(nn.Module()))


@functools.cache
def _opaque() -> tuple[type, ...]:
    """Types compared by identity alone, whatever they hold: tensors, modules (each has its own entry), classes."""
    import torch  # lazy: as above

    return torch.Tensor, torch.nn.Module, type


def _held(value: Any, depth: int = _HELD_DEPTH) -> Any:
    """The identities of what ``value`` holds, ``depth`` levels down: the items of lists, tuples, sets and dicts,
    the attributes of a plain object (a config, a counter object); tensors, modules, classes, callables (a
    callable object's own attributes included) and immutable scalars are compared by identity alone. Mutating a
    held list or object in place leaves its own identity, not this."""
    kind = type(value)
    if kind in _ATOMS or depth == 0 or (kind is tuple and all(type(item) in _ATOMS for item in value)):
        return None
    if isinstance(value, _opaque()) or callable(value):
        return None
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (set, frozenset)):
        items = sorted(((None, item) for item in value), key=lambda pair: id(pair[1]))
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    elif hasattr(value, "__dict__"):
        items = list(vars(value).items())
    else:
        return None
    return tuple((key if isinstance(key, (str, int)) else id(key), id(item), _held(item, depth - 1))
                 for key, item in items)


def _state(modules: list[nn.Module]) -> list[tuple[Any, ...]]:
    """What the modules keep between calls: the names and identities of each module's attributes, parameters,
    buffers and submodules, and what its other attributes hold (:func:`_held`: a list it appends to, a dict or
    an object it updates in place)."""
    internals = _module_internals()
    return [(tuple(vars(module)), *(tuple(map(id, attributes.values())) for attributes in (
        vars(module), module._parameters, module._buffers, module._modules)),
        tuple(_held(value) for name, value in vars(module).items() if name not in internals))
        for module in modules]


def _repeats_itself(tracker: _LiveBytes, model: nn.Module) -> Callable[[], bool]:
    """Whether a step just replayed would be replayed again operator for operator: it found only the model and the
    input live and left only them, and rebound no attribute of any module nor changed what one holds (no cache,
    counter or lazy layer; state outside the modules, such as a global cache of non-tensors, is not seen). The
    meta kernels are functions of their arguments' metadata, so the next step repeats the same operators on the
    same live tensors (an inference step; a training step leaves gradients and optimizer state)."""
    modules = list(model.modules())
    live, state = set(tracker.live), _state(modules)
    return lambda: set(tracker.live) == live and _state(modules) == state


def _check_on_meta(model: nn.Module, x: torch.Tensor, model_id: str) -> None:
    tensors = [x, *model.parameters(), *model.buffers()]
    devices = sorted({t.device.type for t in tensors if t.device.type != "meta"})
    if devices:
        raise InputError(f"model {model_id}: memory simulation needs the model and input on the meta device, "
                         f"found tensors on {', '.join(devices)}")


def simulate_peak_memory(model: nn.Module, x: torch.Tensor, mode: str, optimizer: str = "sgd",
                         model_id: str = "", rider: StepRider | None = None) -> SimulatedMemory:
    """Replay the profiled step of ``mode`` on the meta-device ``model`` and input ``x`` (module docstring).

    ``optimizer`` is the profiled training step's ("sgd": SGD with momentum, "adam"); it does not matter for
    inference. Gradients already held by the model are dropped first. A model whose step fails on the meta
    device (an operator without a meta kernel, a shape error) raises :class:`InputError` naming ``model_id``.
    ``rider`` lets other recordings ride along in the replayed steps (:data:`StepRider`): the featuriser counts
    FLOPs in the first and traces the operators of the second, so the step is not replayed again for them.
    """
    import torch  # lazy: the column names are imported by stages that never run a model

    from perfzoo.features.attention import cpu_attention  # lazy: imports torch, as above
    from perfzoo.features.recurrent import cpu_recurrent

    if optimizer not in OPTIMIZERS:
        raise InputError(f"model {model_id}: unknown optimizer {optimizer!r} (expected one of "
                         f"{', '.join(OPTIMIZERS)})")
    _check_on_meta(model, x, model_id)
    for parameter in model.parameters():
        parameter.grad = None
    targets = torch.zeros(x.shape[0], dtype=torch.int64, device="meta")
    step = make_step(model, x, targets, mode, optimizer)
    tracker = _LiveBytes(keep_first_step=mode == "inference")  # only an inference step is counted as a repeat
    for tensor in _unique_storages([*model.parameters(), *model.buffers()]):
        tracker.add(tensor, "weight")
    for tensor in (x, targets):
        tracker.add(tensor, "input")
    start_bytes = tracker.current
    try:
        with _categorised(tracker, model), cpu_attention(), cpu_recurrent(fused_lstm=False):
            _replay(step, tracker, rider, _repeats_itself(tracker, model) if mode == "inference" else lambda: False)
    except Exception as exc:  # noqa: BLE001 - any operator or model error becomes a one-line InputError
        raise InputError(f"model {model_id}: {mode} step failed in the memory simulation on the meta device: "
                         f"{one_line(exc)}") from None
    if tracker.peak <= 0:
        raise InputError(f"model {model_id}: the memory simulation saw no tensor on the meta device")
    split = tracker.at_peak
    return SimulatedMemory(peak_bytes=tracker.peak, start_bytes=start_bytes, weight_bytes=split["weight"],
                           grad_bytes=split["grad"], optimizer_bytes=split["optimizer"],
                           activation_bytes=split["activation"], input_bytes=split["input"],
                           heap_churn_bytes=tracker.heap_churn, heap_peak_bytes=tracker.heap.peak,
                           op_kinds=len(tracker.operators),
                           onednn_conv=int(_any_on_onednn(tracker.convolutions)),
                           cl_depthwise_weight_bytes=tracker.cl_depthwise_weight_bytes)


ONEDNN_BACKENDS = ("Mkldnn", "MkldnnTranspose")
"""Names of PyTorch's ``_ConvBackend`` values that run on oneDNN (the second is absent from some versions)."""
ONEDNN_THREADS = 1
"""Threads at which :func:`_runs_on_onednn` asks PyTorch (the default CPU device's setting): PyTorch's choice
depends on the thread count for unstrided 1 x 1 convolutions of fewer than 16 samples only."""


TensorSignature = tuple[tuple[int, ...], "torch.dtype"]
"""A tensor's shape and dtype."""


def _convolution_signature(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           *params: Any) -> tuple:
    """``aten.convolution``'s arguments with each tensor as its :data:`TensorSignature` (hashable; holds no
    tensor)."""
    return (*((tuple(t.shape), t.dtype) if t is not None else None for t in (input, weight, bias)),
            *(tuple(p) if isinstance(p, list | tuple) else p for p in params))


def _channels_last_depthwise_weight_bytes(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                                          bias_sizes: Any, stride: Any, padding: Any, dilation: Any, transposed: bool,
                                          output_padding: Any, groups: int, output_mask: Any) -> int:
    """Weight bytes of an ``aten.convolution_backward`` call that computes the weight gradient of a 2-D depthwise
    convolution (one input channel per group, as many groups as channels) from a channels-last gradient, else 0
    (:attr:`SimulatedMemory.cl_depthwise_weight_bytes`)."""
    depthwise = groups > 1 and weight.shape[1] == 1 and weight.shape[0] == groups == input.shape[1]
    if not (output_mask[1] and depthwise and is_channels_last(grad_output) and not transposed):
        return 0
    return weight.numel() * weight.element_size()


def is_channels_last(tensor: torch.Tensor) -> bool:
    """Whether a 4-D tensor is laid out channels last (and not also contiguous, as a tensor of one channel or one
    pixel is)."""
    import torch

    return (tensor.dim() == 4 and not tensor.is_contiguous()
            and tensor.is_contiguous(memory_format=torch.channels_last))


def _any_on_onednn(convolutions: Iterable[tuple]) -> bool:
    """Whether PyTorch runs any of these convolutions (:func:`_convolution_signature`) on oneDNN on the CPU, at
    :data:`ONEDNN_THREADS` threads (:func:`_runs_on_onednn`)."""
    import torch

    convolutions = list(convolutions)
    if not convolutions:
        return False
    threads = torch.get_num_threads()
    torch.set_num_threads(ONEDNN_THREADS)
    try:
        return any(_runs_on_onednn(*signature) for signature in convolutions)
    finally:
        torch.set_num_threads(threads)


def _runs_on_onednn(input: TensorSignature, weight: TensorSignature, bias: TensorSignature | None,
                    stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...], transposed: bool,
                    output_padding: tuple[int, ...], groups: int) -> bool:
    """Whether PyTorch runs ``aten.convolution`` with these arguments (:func:`_convolution_signature`) on oneDNN
    on the CPU at the current thread count: PyTorch's own backend choice (``torch._C._select_conv_backend``),
    asked with CPU stand-ins of the same shapes and dtypes whose strides are all 0 (one element of memory
    each)."""
    import torch

    def stand_in(signature: TensorSignature) -> torch.Tensor:
        # the choice reads shapes and dtypes only; attention's stand-ins (features.attention) keep the strides,
        # which the flash kernel's choice reads, and so allocate (untouched) memory of the tensor's size
        shape, dtype = signature
        return torch.empty(1, dtype=dtype).as_strided(shape, (0,) * len(shape))

    backend = torch._C._select_conv_backend(
        stand_in(input), stand_in(weight), None if bias is None else stand_in(bias), list(stride), list(padding),
        list(dilation), bool(transposed), list(output_padding), int(groups))
    return backend.name in ONEDNN_BACKENDS


def feature_row(simulate: Callable[[], SimulatedMemory]) -> dict[str, Any]:
    """:data:`SIM_COLUMNS` and ``sim_error`` of one simulation, the feature-table form: a step the simulation
    cannot run (an output the profiled cross-entropy loss does not accept, an operator without a meta
    kernel) gives missing values and the one-line reason, as the fx graph columns do, never zeros."""
    try:
        return {**simulate().features(), "sim_error": ""}
    except InputError as exc:
        return {**dict.fromkeys(SIM_COLUMNS, math.nan), "sim_error": str(exc)}


def simulated_memory_features(model: nn.Module, x: torch.Tensor, mode: str, optimizer: str = "sgd",
                              model_id: str = "") -> dict[str, Any]:
    """:func:`feature_row` of :func:`simulate_peak_memory`."""
    return feature_row(lambda: simulate_peak_memory(model, x, mode, optimizer, model_id))
