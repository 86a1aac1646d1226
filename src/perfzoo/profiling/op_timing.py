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

What times a call is the timer's clock: :class:`HostClock` (``perf_counter_ns`` around it) on the CPU, where an
operator runs synchronously; on CUDA, where kernels run asynchronously, :class:`CudaKernelClock` runs the
steps under ``torch.profiler`` with CUDA activities and takes, per call, the GPU time of the kernels it
launched. ``step_ms`` is the step's wall time under the timer (synchronised with the GPU there), which on a
GPU also holds the timer's and the profiler's host overhead.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from perfzoo.io import one_line
from perfzoo.profiling.core import make_step

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
    """Times each call with ``perf_counter_ns`` around it: an operator on the CPU runs synchronously, so the
    interval is its time."""

    def __init__(self) -> None:
        self._ms: list[float] = []

    def __enter__(self) -> HostClock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        started = time.perf_counter_ns()
        out = func(*args, **kwargs)
        self._ms.append((time.perf_counter_ns() - started) / 1e6)
        return out

    def sync(self) -> None:
        return None

    def times_ms(self) -> list[float]:
        """The time of every call so far, in call order."""
        return list(self._ms)


class CudaKernelClock:
    """Times each call by the GPU time of the kernels it launched, from ``torch.profiler`` with CUDA activities.

    Every call runs inside a ``record_function`` range of its own; the profiler links each kernel (and each
    memcpy/memset) to the operator that launched it, and :func:`range_kernel_ms` sums, per range, the kernels
    linked below it. The durations are the GPU's own: on an H100 each kernel ran as long under the timer as
    without it, while host-side CUDA events around each call (an earlier design) timed the timer's own
    overhead, 19 ms of "operator time" for a 9.6 ms step whose kernels ran 1.9 ms (``bench/RESULTS.md``). A
    call that launched no kernel (a view, a metadata operator) has 0 ms of GPU time. The ranges are read
    when the profiler stops, at the end of all steps.
    """

    PREFIX = "perfzoo_op_"
    ACTIVITIES = ("CPU", "CUDA")

    def __init__(self, device: str) -> None:
        import torch  # lazy: only a worker measuring on a GPU makes one

        self._torch = torch
        self.device = device
        self._calls = 0
        self._profile: Any = None
        self._ms: list[float] | None = None

    def __enter__(self) -> CudaKernelClock:
        from torch.profiler import ProfilerActivity, profile

        self._profile = profile(activities=[getattr(ProfilerActivity, name) for name in self.ACTIVITIES])
        self._profile.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.sync()
        self._profile.__exit__(*exc_info)
        if exc_info[0] is None:
            self._ms = self._read_ranges()

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        with self._torch.profiler.record_function(f"{self.PREFIX}{self._calls}"):
            self._calls += 1
            return func(*args, **kwargs)

    def sync(self) -> None:
        self._torch.cuda.synchronize(self.device)

    def _read_ranges(self) -> list[float]:
        return range_kernel_ms(self._profile.events(), self.PREFIX, self._calls)

    def times_ms(self) -> list[float]:
        """The GPU time of every call, in call order (after the profiler has stopped)."""
        if self._ms is None:
            raise RuntimeError("CudaKernelClock: the kernel times are read when its 'with' block ends")
        return self._ms


ATTRIBUTION_TOLERANCE = 0.05
"""Largest relative difference allowed between the kernel time attributed to the operator calls and all the
kernel time of the same profile; past it the per-op times are not kept (:func:`range_kernel_ms`)."""


def _is_range(event: Any, prefix: str) -> bool:
    return event.name.startswith(prefix)


def _on_host(event: Any) -> bool:
    return "CPU" in str(event.device_type)


def _kernel_ms(kernels: Any, prefix: str) -> float:
    """Summed duration (ms) of real kernels; the GPU-side copies of ``record_function`` ranges that the
    profiler lists beside them (same name as the range) are not kernels."""
    return sum(k.duration for k in kernels if not k.name.startswith(prefix)) / 1e3


def _subtree_kernel_ms(event: Any, prefix: str) -> float:
    total, stack = 0.0, [event]
    while stack:
        node = stack.pop()
        total += _kernel_ms(node.kernels, prefix)
        stack.extend(node.cpu_children)
    return total


def range_kernel_ms(events: Any, prefix: str, calls: int) -> list[float]:
    """GPU time (ms) of the kernels launched inside each host-side range ``{prefix}{i}``, i < ``calls``.

    A range's kernels are those the profiler linked to it or to any operator below it on the host; the
    GPU-side events named like the ranges (the profiler's copies of ``record_function`` ranges on the device
    timeline) are not kernels. Two checks guard against a wrong attribution, each raising with what it found:
    every range must be there, and the attributed kernel time must be the whole time of the profile's device
    events (kernels, memcpy, memset) within :data:`ATTRIBUTION_TOLERANCE`: a kernel launched outside any
    range, or counted twice, breaks it.
    """
    events = list(events)
    found: dict[int, float] = {}
    for event in events:
        if _on_host(event) and _is_range(event, prefix):
            found[int(event.name[len(prefix):])] = _subtree_kernel_ms(event, prefix)
    missing = [i for i in range(calls) if i not in found]
    if missing:
        raise RuntimeError(f"torch.profiler recorded {len(found)} of {calls} operator ranges "
                           f"(first missing: call {missing[0]})")
    every_kernel = sum(e.time_range.elapsed_us() for e in events
                       if not _on_host(e) and not _is_range(e, prefix)) / 1e3  # kernels, memcpy, memset
    attributed = sum(found.values())
    if abs(attributed - every_kernel) > ATTRIBUTION_TOLERANCE * max(every_kernel, 1e-9):
        raise RuntimeError(f"torch.profiler linked {attributed:.3f} ms of kernels to the operator calls but "
                           f"{every_kernel:.3f} ms in all: the per-op attribution does not add up")
    return [found[i] for i in range(calls)]


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
        """Dispatch mode running every aten operator call through ``clock.call``, which times it
        (:class:`HostClock`, :class:`CudaKernelClock`)."""

        def __init__(self, times: OpTimes, clock: Any) -> None:
            super().__init__()
            self.times = times
            self.clock = clock
            self.phase = "forward"
            self.step = 0
            self.order = 0
            self._groups: dict[Any, int | None] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func.namespace in _UNTIMED_NAMESPACES or not hasattr(func, "_schema"):
                return func(*args, **kwargs)
            out = self.clock.call(func, args, kwargs)
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

        @contextmanager
        def in_phase(self, phase: str) -> Iterator[None]:
            """Calls inside are recorded under ``phase`` (the step's closure marks its phases with this)."""
            self.phase = phase
            yield

    return OpTimer


def op_timer(times: OpTimes, clock: Any | None = None) -> Any:
    """A fresh :class:`OpTimer` dispatch mode recording into ``times``, each call timed by ``clock``
    (default :class:`HostClock`)."""
    return _timer_class()(times, clock if clock is not None else HostClock())


def time_operators(make_phased_step: Callable[[Callable[[str], Any]], Callable[[], None]],
                   settings: dict[str, Any], clock: Any | None = None) -> OpTimes:
    """Per-operator times of ``warmup + steps`` steps (the warm-up ones are not kept), each call timed by
    ``clock`` (default :class:`HostClock`; :class:`CudaKernelClock` on a GPU). ``step_ms`` is each step's wall
    time under the timer, synchronised with the device.

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
        with clock:
            for i in range(warmup + steps):
                timer.step, timer.order = i - warmup, 0
                clock.sync()
                begun = time.perf_counter_ns()
                with timer:
                    step()
                clock.sync()
                if i >= warmup:
                    times.step_ms.append((time.perf_counter_ns() - begun) / 1e6)
        times.time_ms = clock.times_ms()
    except Exception as exc:  # noqa: BLE001 - the end-to-end measurement stands; the reason is recorded
        times = OpTimes(message=f"per-op timing failed: {one_line(exc, limit=300)}", failed=True)
    kept = [i for i, s in enumerate(times.step) if s >= 0]
    for name in OP_TIMING_COLUMNS:
        column = getattr(times, name)
        setattr(times, name, [column[i] for i in kept])
    times.seconds = time.perf_counter() - started
    return times


def step_op_times(model: Any, x: Any, y: Any, mode: str, optimizer: Any, forward_context: Any,
                  settings: dict[str, Any], clock: Any | None = None) -> dict[str, Any] | None:
    """Per-operator times of a config's step as a worker reports them (:meth:`OpTimes.as_dict`), with the model,
    batch and optimizer the end-to-end iterations used; None where this measurement takes none (``time_ops``
    false: the noise floor's repeats, the memory reference)."""
    if not settings.get("time_ops", True):
        return None
    return time_operators(lambda phase: make_step(model, x, y, mode, optimizer, forward_context, phase),
                          settings, clock).as_dict()
