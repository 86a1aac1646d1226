"""Measured per-operator times of a config's step on the CPU, taken after its end-to-end timed window.

:func:`time_operators` runs ``profiling.op_timing.warmup_steps`` then ``steps`` more steps of the model the
worker has just measured, under an ``OpTimer`` (:func:`op_timer`): a ``TorchDispatchMode`` that wraps every aten operator call
in ``perf_counter_ns`` on the real CPU (synchronous, so the interval is the kernel's time plus the dispatch
from Python). It sees the operators at the level of the meta-device trace of :mod:`perfzoo.features.ops`
(below autograd, after composite operators decomposed), so the features layer classifies the measured
operators into the same kinds; profiling itself never imports the features (import layers).

Per recorded call: ``step`` (0-based among the timed steps), ``order`` (call index within the step), ``op``
(the aten overload, e.g. ``aten.addmm.default``), ``phase`` (``forward`` for the model and loss, ``backward``,
``optimizer``, as in the meta trace), ``grouped`` (a ``groups`` argument above 1: depthwise or grouped
convolution) and ``time_ms``. ``step_ms`` is the step's wall time under the timer, to compare with the
end-to-end median (the timer's own overhead is the difference between them).

The end-to-end labels never see the timer: the worker runs it after the timed iterations and after reading
its peak memory. A failure of these extra steps leaves the end-to-end measurement intact and records the
reason.

What marks an operator's start and end is the timer's clock: :class:`HostClock` (``perf_counter_ns``) on the
CPU, where an operator runs synchronously; on CUDA, where kernels run asynchronously, :class:`CudaEventClock`
records a CUDA event on the current stream before and after each operator call and reads the intervals once
the step has synchronised. There an operator's interval runs from the stream reaching its start event to the
end of its kernels: its kernels' time where the GPU is ahead of the host, plus its launch from the host where
the GPU waits for it (a view or metadata operator with no kernel then shows its dispatch time). ``step_ms`` is
measured with the same clock.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from perfzoo.io import one_line

OP_TIMING_COLUMNS = ("step", "order", "op", "phase", "grouped", "time_ms")
"""The per-call lists a worker reports (one entry per aten operator call of a timed step)."""
OP_TIME_COLUMNS = [
    "model_id", "config_id", "mode", "batch", "power_limit_w", *OP_TIMING_COLUMNS, "step_ms", "status", "message",
]  # fmt: skip
"""Columns of ``traces/{device}/{shard}.ops.parquet``: one row per operator call of a config's timed per-op
steps; ``status`` is ``ok``, or the config's failure status, or ``not_measured`` / ``error`` with the reason
in ``message`` (one row, no times)."""
DISABLED_REASON = "per-op times not measured: profiling.op_timing.steps is 0"
DEFAULT_WARMUP_STEPS = 0
DEFAULT_STEPS = 2
# operators that only query metadata or mark profiler ranges: not timed (as in the meta trace)
_UNTIMED_NAMESPACES = frozenset({"profiler"})


@dataclass
class OpTimes:
    """What one worker measured per operator (column lists of :data:`OP_TIMING_COLUMNS`), the wall time of
    each timed step under the timer, the seconds the op timing took in all, and why there are no times ('' if
    there are; ``failed`` when a step raised, rather than op timing being off)."""

    step: list[int] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    op: list[str] = field(default_factory=list)
    phase: list[str] = field(default_factory=list)
    grouped: list[bool] = field(default_factory=list)
    time_ms: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    message: str = ""
    failed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class HostClock:
    """Marks from ``perf_counter_ns``: an operator on the CPU runs synchronously, so its interval is its time."""

    def mark(self) -> int:
        return time.perf_counter_ns()

    def intervals_ms(self, starts: list[Any], ends: list[Any]) -> list[float]:
        return [(end - start) / 1e6 for start, end in zip(starts, ends, strict=True)]


class CudaEventClock:
    """Marks from CUDA events recorded on the current stream of ``device``; the intervals are read after a
    synchronisation (:meth:`intervals_ms`), so marking never waits for the GPU."""

    def __init__(self, device: str) -> None:
        import torch  # lazy: only a worker measuring on a GPU makes one

        self._torch = torch
        self.device = device

    def mark(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def intervals_ms(self, starts: list[Any], ends: list[Any]) -> list[float]:
        self._torch.cuda.synchronize(self.device)
        return [float(start.elapsed_time(end)) for start, end in zip(starts, ends, strict=True)]


def op_timing_settings(settings: dict[str, Any]) -> tuple[int, int]:
    """(warm-up steps, timed steps) of ``settings["op_timing"]`` (profiling settings; defaults 0 and 2: the
    model, its caches and its optimizer state are warm from the end-to-end iterations just before)."""
    chosen = settings.get("op_timing") or {}
    return (int(chosen.get("warmup_steps", DEFAULT_WARMUP_STEPS)), int(chosen.get("steps", DEFAULT_STEPS)))


def _groups_position(func: Any) -> int | None:
    """Index of an operator's ``groups`` argument (convolutions), or None."""
    for i, argument in enumerate(func._schema.arguments):
        if argument.name == "groups":
            return i
    return None


@functools.cache
def _timer_class() -> type:
    """:class:`OpTimer`'s class, built on first use (torch is imported inside a worker only)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpTimer(TorchDispatchMode):
        """Dispatch mode marking the start and end of every aten operator call with ``clock``; the intervals
        of a step's calls are read by :meth:`close_step` (on CUDA only after the step has synchronised)."""

        def __init__(self, times: OpTimes, clock: Any) -> None:
            super().__init__()
            self.times = times
            self.clock = clock
            self.phase = "forward"
            self.step = 0
            self.order = 0
            self._groups: dict[Any, int | None] = {}
            self._starts: list[Any] = []
            self._ends: list[Any] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func.namespace in _UNTIMED_NAMESPACES or not hasattr(func, "_schema"):
                return func(*args, **kwargs)
            self._starts.append(self.clock.mark())
            out = func(*args, **kwargs)
            self._ends.append(self.clock.mark())
            if func not in self._groups:
                self._groups[func] = _groups_position(func)
            position = self._groups[func]
            t = self.times
            t.step.append(self.step)
            t.order.append(self.order)
            t.op.append(str(func))
            t.phase.append(self.phase)
            t.grouped.append(position is not None and len(args) > position and int(args[position]) > 1)
            self.order += 1
            return out

        def close_step(self) -> None:
            """Append the intervals of the calls marked since the last close to ``times.time_ms``."""
            self.times.time_ms.extend(self.clock.intervals_ms(self._starts, self._ends))
            self._starts, self._ends = [], []

        @contextmanager
        def in_phase(self, phase: str) -> Iterator[None]:
            """Calls inside are recorded under ``phase`` (the step's closure marks its phases with this)."""
            self.phase = phase
            yield

    return OpTimer


def op_timer(times: OpTimes, clock: Any | None = None) -> Any:
    """A fresh :class:`OpTimer` dispatch mode recording into ``times`` with ``clock`` (default
    :class:`HostClock`)."""
    return _timer_class()(times, clock if clock is not None else HostClock())


def time_operators(make_phased_step: Callable[[Callable[[str], Any]], Callable[[], None]],
                   settings: dict[str, Any], clock: Any | None = None) -> OpTimes:
    """Per-operator times of ``warmup + steps`` steps (the warm-up ones are not kept), marked by ``clock``
    (default :class:`HostClock`; :class:`CudaEventClock` on a GPU).

    ``make_phased_step(in_phase)`` builds the step with its phases marked by ``in_phase(name)``
    (:func:`perfzoo.profiling.core.make_step` with ``phase=``). A failure is returned as the message.
    """
    warmup, steps = op_timing_settings(settings)
    times = OpTimes()
    if steps <= 0:
        times.message = DISABLED_REASON
        return times
    started = time.perf_counter()
    clock = clock if clock is not None else HostClock()
    timer = op_timer(times, clock)
    try:
        step = make_phased_step(timer.in_phase)
        for i in range(warmup + steps):
            timer.step, timer.order = i - warmup, 0
            begun = clock.mark()
            with timer:
                step()
            ended = clock.mark()
            timer.close_step()
            if i >= warmup:
                times.step_ms.extend(clock.intervals_ms([begun], [ended]))
    except Exception as exc:  # noqa: BLE001 - the end-to-end measurement stands; the reason is recorded
        times = OpTimes(message=f"per-op timing failed: {one_line(exc, limit=300)}", failed=True)
    kept = [i for i, s in enumerate(times.step) if s >= 0]
    for name in OP_TIMING_COLUMNS:
        column = getattr(times, name)
        setattr(times, name, [column[i] for i in kept])
    times.seconds = time.perf_counter() - started
    return times
