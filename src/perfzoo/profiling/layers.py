"""Per-layer forward and backward timing on the CPU, for the per-layer models of
Gianniti, Zhang and Ardagna, "Performance Prediction of GPU-based Deep Learning Applications".

:func:`measure_layers_on_cpu` runs inside an isolated worker (registered as ``MEASURE["cpu_layers"]``)
and times every *layer call* of one config. A layer call is defined exactly as in
:mod:`perfzoo.features.meta`: a call of a module during which no other module of the model is called, in
execution order, named by the module's first name in ``model.named_modules()`` (``"<root>"`` for the
model itself); ``occurrence`` counts the calls of that name (a reused ``BasicBlock.relu`` gives
occurrences 0 and 1). In training mode the loss (``nn.CrossEntropyLoss`` on the logits) is timed as one
more call named ``"loss"``, type ``"Loss"``, matching the ``Loss`` row of the features' layer table.

Protocol, in one process pinned to ``settings["threads"]`` intra-op threads:

1. build the model on the CPU and set every module's ``inplace`` attribute to ``False`` (an in-place
   layer would overwrite the tensor the backward markers below hand it);
2. ``warmup_iters`` plain steps, then ``layer_iters`` plain steps timed end to end
   (``extra["unhooked_step_ms"]``, the reference for the hook overhead);
3. attach the hooks; one discovery step finds which calls are layer calls; then ``layer_iters`` hooked
   steps: ``times_ms`` are their end-to-end times, and every layer gets the median of its per-step
   forward and backward times.

Forward time of a call: ``perf_counter_ns`` at the end of the module's forward pre-hook to the start of
its forward hook (CPU execution is synchronous). Backward time: in training mode each layer call's
inputs pass through an identity autograd function whose backward marks the *end* of the layer's
backward (the gradient with respect to its inputs is complete), and its outputs through one that clones
them and whose backward marks the *start* (the gradient with respect to its outputs has arrived). This is
what ``register_full_backward_pre_hook`` / ``register_full_backward_hook`` do internally, but per call
(so a reused module's calls are told apart) and with the outputs cloned: torch's full backward hooks
return the outputs as views, which tensor-level in-place code after the layer (torchvision ResNet's
``out += identity``) rejects. On the CPU the autograd engine runs in the calling thread and picks ready
nodes by decreasing sequence number, so the nodes of one layer (and its parameters' gradient
accumulation) run between its two markers. A layer whose inputs need no gradient (the first layer: its
input is data) has no end marker; its backward ends at the next marker or, for the last one, when
``backward()`` returns. A layer whose outputs need no gradient does no backward work: ``bw_ms = 0``.
A layer whose output gradient never arrives (an unused output) gets ``bw_ms = NaN``; inference gives
``bw_ms = NaN`` throughout. Calls made during backward (activation checkpointing recomputes forwards)
are not timed.

Overhead: each hooked call adds two Python hooks (a few microseconds, partly inside the timed window),
and in training an output clone (outside the forward window, one extra activation copy) and two small
autograd nodes. So per-layer times carry a small constant bias, which the per-layer intercepts absorb,
and the hooked step (``times_ms``) is slower than the plain one (``extra["unhooked_step_ms"]``).
Work done by non-layer modules outside their children (a container's residual add, the matmuls of a
timm ``Attention`` block) and the optimizer step belong to no layer.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from perfzoo.models.builders import build_model
from perfzoo.io import InputError
from perfzoo.profiling.core import (
    Measurement,
    ResidentPeak,
    make_optimizer,
    step_loss,
    synthetic_batch,
)

LAYER_ITERS = 10
LOSS_NAME = "loss"
LAYER_TIMING_COLUMNS = [
    "device", "config_id", "model_id", "family", "mode", "batch", "name", "occurrence", "type",
    "fw_ms", "bw_ms", "step_ms", "unhooked_step_ms", "n_iters", "status", "message",
]  # fmt: skip
"""Columns of ``results/layers/<device>.parquet``: one row per layer call of a profiled config; a config
that failed keeps one row with ``name == ""``, NaN times and its status/message."""


# --------------------------------------------------------------------------- autograd markers


@functools.cache
def _marker_class() -> type:
    """An identity autograd function that calls back when its backward runs (created lazily: torch)."""
    import torch  # lazy: ~3 s import; the parent process never measures

    class _Marker(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, callback: Any, clone: bool, *tensors: Any) -> tuple[Any, ...]:
            ctx.callback = callback
            ctx.set_materialize_grads(False)
            return tuple(t.clone() if clone else t.view_as(t) for t in tensors)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
            ctx.callback()
            return (None, None, *grads)

    return _Marker


def _mark(tensors_in: Any, callback: Any, clone: bool) -> tuple[Any, bool]:
    """(``tensors_in`` with every tensor that requires grad passed through one marker, whether any did)."""
    import torch  # lazy: ~3 s import; the parent process never measures
    from torch.utils._pytree import tree_flatten, tree_unflatten  # lazy: as torch above

    leaves, spec = tree_flatten(tensors_in)
    where = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor) and v.requires_grad]
    if not where:
        return tensors_in, False
    marked = _marker_class().apply(callback, clone, *(leaves[i] for i in where))
    for i, t in zip(where, marked, strict=True):
        leaves[i] = t
    return tree_unflatten(leaves, spec), True


# --------------------------------------------------------------------------- the timer


@dataclass
class _Frame:
    module_id: int
    index: int  # call index of this module in the step
    key: tuple[str, int] | None  # (name, occurrence) when the plan says this call is a layer call
    t0: int = 0
    called_child: bool = False


@dataclass
class _LayerTimer:
    """Forward pre/post hooks on every module, timing the layer calls of each step."""

    names: dict[int, str]
    types: dict[int, str]
    training: bool
    phase: str = "off"  # off / discover / forward / backward
    plan: dict[int, list[bool]] = field(default_factory=dict)
    order: list[tuple[str, int, str]] = field(default_factory=list)  # (name, occurrence, type) per layer call
    fw: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    bw: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    stack: list[_Frame] = field(default_factory=list)
    calls: dict[int, int] = field(default_factory=dict)
    occurrences: dict[str, int] = field(default_factory=dict)
    n_layer_calls: int = 0
    starts: dict[tuple[str, int], int] = field(default_factory=dict)
    no_backward: set[tuple[str, int]] = field(default_factory=set)
    events: list[tuple[int, str, tuple[str, int]]] = field(default_factory=list)

    def attach(self, modules: list[Any]) -> list[Any]:
        handles = []
        for module in modules:
            handles.append(module.register_forward_pre_hook(self._enter))
            handles.append(module.register_forward_hook(self._leave))
        return handles

    # -- per step

    def begin_step(self, phase: str) -> None:
        self.phase = phase
        self.stack.clear()
        self.calls.clear()
        self.occurrences.clear()
        self.n_layer_calls = 0
        self.starts.clear()
        self.no_backward.clear()
        self.events.clear()

    def end_forward(self) -> None:
        if self.phase == "forward" and self.n_layer_calls != len(self.order):
            raise RuntimeError(
                f"layer calls changed between steps ({self.n_layer_calls} vs {len(self.order)} in discovery)"
            )
        self.phase = "backward" if self.phase == "forward" and self.training else "off"

    def end_backward(self, t_done: int) -> None:
        """Turn the backward markers of this step into one backward time per layer call."""
        self.phase = "off"
        self.events.sort()
        ends = {key: t for t, kind, key in self.events if kind == "end"}
        times = [t for t, _, _ in self.events]
        for key, start in self.starts.items():
            end = ends.get(key)
            if end is None:  # no input needs a gradient: the layer's backward ends at the next marker
                later = [t for t in times if t > start]
                end = min(later) if later else t_done
            self.bw.setdefault(key, []).append((end - start) / 1e6)
        for key in self.no_backward:
            self.bw.setdefault(key, []).append(0.0)

    # -- hooks

    def _event(self, kind: str, key: tuple[str, int]) -> Any:
        def record() -> None:
            t = time.perf_counter_ns()
            if kind == "start":
                self.starts[key] = t
            self.events.append((t, kind, key))

        return record

    def _enter(self, module: Any, args: tuple) -> Any:
        if self.phase not in ("discover", "forward"):
            return None
        mid = id(module)
        index = self.calls.get(mid, 0)
        self.calls[mid] = index + 1
        if self.stack:
            self.stack[-1].called_child = True
        key = None
        result = None
        if self.phase == "discover":
            self.plan.setdefault(mid, []).append(False)
        elif index < len(self.plan.get(mid, ())) and self.plan[mid][index]:
            name = self.names[mid]
            key = (name, self.occurrences.get(name, 0))
            self.occurrences[name] = key[1] + 1
            if self.training:
                marked, changed = _mark(args, self._event("end", key), clone=False)
                result = marked if changed else None
        frame = _Frame(mid, index, key)
        self.stack.append(frame)
        frame.t0 = time.perf_counter_ns()
        return result

    def _leave(self, module: Any, args: tuple, output: Any) -> Any:
        t1 = time.perf_counter_ns()
        if self.phase not in ("discover", "forward") or not self.stack:
            return None
        frame = self.stack.pop()
        if self.phase == "discover":
            if not frame.called_child:
                self.plan[frame.module_id][frame.index] = True
                name = self.names[frame.module_id]
                occurrence = self.occurrences.get(name, 0)
                self.occurrences[name] = occurrence + 1
                self.order.append((name, occurrence, self.types[frame.module_id]))
            return None
        if frame.key is None:
            return None
        if frame.called_child:
            raise RuntimeError(f"layer {frame.key[0]!r} called another module in a later step")
        self.n_layer_calls += 1
        self.fw.setdefault(frame.key, []).append((t1 - frame.t0) / 1e6)
        if not self.training:
            return None
        marked, changed = _mark(output, self._event("start", frame.key), clone=True)
        if not changed:
            self.no_backward.add(frame.key)
            return None
        return marked

    # -- result

    def summary(self) -> list[dict[str, Any]]:
        rows = []
        for name, occurrence, type_name in self.order:
            key = (name, occurrence)
            fw, bw = self.fw.get(key, []), self.bw.get(key, [])
            rows.append({
                "name": name, "occurrence": occurrence, "type": type_name,
                "fw_ms": statistics.median(fw) if fw else math.nan,
                "bw_ms": statistics.median(bw) if (bw and self.training) else math.nan,
            })  # fmt: skip
        return rows


# --------------------------------------------------------------------------- the measurement


def disable_inplace(model: Any) -> int:
    """Set every module's boolean ``inplace`` attribute to False; return how many were changed."""
    changed = 0
    for module in model.modules():
        if isinstance(getattr(module, "inplace", None), bool) and module.inplace:
            module.inplace = False
            changed += 1
    return changed


def _timed_step(model: Any, x: Any, y: Any, loss_fn: Any, timer: _LayerTimer, training: bool,
                optimizer: str) -> Callable[[str], float]:
    """One step in a timer phase ("off", "discover", "forward"), returning its wall time in ms."""
    import torch  # lazy: ~3 s import; the parent process never measures

    if training:
        model.train()
        opt = make_optimizer(model, optimizer)

    def step(phase: str) -> float:
        t0 = time.perf_counter_ns()
        timer.begin_step(phase)
        if training:
            opt.zero_grad(set_to_none=True)
            loss = step_loss(loss_fn, model(x), y)
            timer.end_forward()
            loss.backward()
            if phase == "forward":
                timer.end_backward(time.perf_counter_ns())
            timer.phase = "off"
            opt.step()
        else:
            model.eval()
            with torch.no_grad():
                model(x)
            timer.end_forward()
        return (time.perf_counter_ns() - t0) / 1e6

    return step


def measure_layers_on_cpu(spec: dict[str, Any], settings: dict[str, Any]) -> Measurement:
    """Time every layer call of one config on the CPU (forward, and backward in training).

    ``spec`` is a manifest row (builder, name, builder_kwargs, input_shape, dtype, batch, mode);
    ``settings`` needs ``threads`` and ``num_classes`` and may set ``warmup_iters`` (3),
    ``layer_iters`` (10) and ``optimizer`` ("sgd"). Returns a :class:`Measurement` whose ``times_ms``
    are the hooked steps' end-to-end times and whose ``extra["layers"]`` lists one
    ``{name, occurrence, type, fw_ms, bw_ms}`` per layer call in execution order (medians over the
    steps); ``extra`` also holds ``unhooked_step_ms``, ``threads`` and ``inplace_disabled``.
    """
    import torch  # lazy: ~3 s import; the parent process never measures

    torch.set_num_threads(int(settings["threads"]))
    torch.manual_seed(0)
    gc.collect()
    resident = ResidentPeak.start()
    mode = spec["mode"]
    training = mode == "training"
    model = build_model(
        spec["builder"],
        spec["name"],
        json.loads(spec["builder_kwargs"]),
        settings["num_classes"],
        tuple(json.loads(spec["input_shape"])),
    )
    n_inplace = disable_inplace(model)
    x, y = synthetic_batch(spec, settings["num_classes"], "cpu")
    loss_fn = torch.nn.CrossEntropyLoss()
    names = {id(m): (name or "<root>") for name, m in model.named_modules()}
    types = {id(m): type(m).__name__ for m in model.modules()}
    names[id(loss_fn)], types[id(loss_fn)] = LOSS_NAME, "Loss"
    timer = _LayerTimer(names, types, training)
    step = _timed_step(model, x, y, loss_fn, timer, training, settings.get("optimizer", "sgd"))
    n_warmup = int(settings.get("warmup_iters", 3))
    iters = max(int(settings.get("layer_iters", LAYER_ITERS)), 1)
    for _ in range(n_warmup):
        step("off")
        resident.close_phase()
    unhooked = [step("off") for _ in range(iters)]
    handles = timer.attach([*model.modules(), loss_fn])
    try:
        step("discover")
        times = [step("forward") for _ in range(iters)]
    finally:
        for handle in handles:
            handle.remove()
    resident.close_phase()
    return Measurement(times, resident.label_mb, n_warmup + 1, "layer_iters", {
        "threads": torch.get_num_threads(), "layers": timer.summary(), "unhooked_step_ms": unhooked,
        "inplace_disabled": n_inplace,
    })  # fmt: skip


# --------------------------------------------------------------------------- configs and the rule's loop


def default_layer_families(manifest: pd.DataFrame) -> list[str]:
    """The image-CNN families: those built by torchvision."""
    return sorted(manifest.loc[manifest["builder"] == "torchvision", "family"].unique())


def _spread(n: int, k: int, offset: float = 0.5) -> list[int]:
    """``k`` indices evenly spread over ``range(n)``, ``offset`` (0-1) of a step into each stride
    (all of them when ``k >= n``)."""
    if k >= n:
        return list(range(n))
    return sorted({min(math.floor((i + offset) * n / k), n - 1) for i in range(k)})


def select_layer_configs(
    manifest: pd.DataFrame, families: list[str] | None = None, max_configs: int | None = 24
) -> pd.DataFrame:
    """The manifest configs whose layers are timed: ``families`` (default: the torchvision ones),
    at most ``max_configs`` (None or 0: no cap) evenly spread in manifest order, the cap shared
    equally between the modes present (so both forward-only and training timings are sampled) and
    the modes' samples staggered (so they cover different models)."""
    if not families:
        families = default_layer_families(manifest)
    unknown = sorted(set(families) - set(manifest["family"]))
    if unknown:
        raise InputError(
            f"fit.gianniti_families: unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)} "
            f"(zoo families: {', '.join(sorted(manifest['family'].unique()))})"
        )
    rows = manifest[manifest["family"].isin(families)].drop_duplicates("config_id").reset_index(drop=True)
    if not max_configs or len(rows) <= max_configs:
        return rows
    modes = list(dict.fromkeys(rows["mode"]))
    sizes = {m: int((rows["mode"] == m).sum()) for m in modes}
    quota = {m: 0 for m in modes}
    left = int(max_configs)
    while left > 0:  # equal shares, a mode with fewer configs hands its rest to the others
        open_modes = [m for m in modes if quota[m] < sizes[m]]
        for m in open_modes[:left]:
            quota[m] += 1
            left -= 1
    keep = []
    for j, m in enumerate(modes):  # modes sample staggered positions, so they cover different models
        index = rows.index[rows["mode"] == m]
        keep += [index[i] for i in _spread(len(index), quota[m], (j + 0.5) / len(modes))]
    return rows.loc[sorted(keep)].reset_index(drop=True)


def failed_layer_row(config: dict[str, Any], device: str, status: str, message: str) -> dict[str, Any]:
    return {
        "device": device, "config_id": config["config_id"], "model_id": config["model_id"],
        "family": config["family"], "mode": config["mode"], "batch": int(config["batch"]), "name": "",
        "occurrence": -1, "type": "", "fw_ms": math.nan, "bw_ms": math.nan, "step_ms": math.nan,
        "unhooked_step_ms": math.nan, "n_iters": 0, "status": status, "message": message,
    }  # fmt: skip
