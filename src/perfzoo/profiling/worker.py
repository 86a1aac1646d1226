"""Run one measurement in an isolated process: a crash, an OOM kill or a hang becomes a status.

:func:`run_isolated` measures one window and ends the worker; :func:`start_held` keeps the worker, with its
model built and warm, after its first window, so that :meth:`HeldWorker.again` times the same step in a
second window later (the profile rule's ``windows: 2``, :mod:`perfzoo.profiling.runner`)."""

from __future__ import annotations

import math
import signal
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import psutil

from perfzoo.io import one_line
from perfzoo.profiling.core import main_module_hidden, worker_context
from perfzoo.profiling.interference import observe
from perfzoo.profiling.measure import MEASURE, MEASURE_AGAIN

PROBED_KINDS = ("cpu", "cuda")
"""Kinds whose measurement runs between two calibration probes (perfzoo.profiling.interference)."""


@dataclass
class Outcome:
    """Result of one isolated measurement as the parent saw it."""

    status: str  # ok / oom / error / timeout
    message: str
    measurement: dict[str, Any] | None = None


#: how allocators word a failed allocation (CUDA's "out of memory", the CPU allocator's ENOMEM)
OOM_PHRASES = ("out of memory", "can't allocate memory", "cannot allocate memory", "error code 12")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether a failure was an allocation the memory could not hold (CPU or GPU)."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(phrase in text for phrase in OOM_PHRASES)


def _child(conn: Connection, kind: str, spec: dict[str, Any], settings: dict[str, Any]) -> None:
    try:
        measure = MEASURE[kind]
        result = (observe(kind, settings, lambda: measure(spec, settings)) if kind in PROBED_KINDS
                  else measure(spec, settings))
        conn.send(Outcome("ok", "", asdict(result)))
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a trace status
        conn.send(Outcome("oom" if is_out_of_memory(exc) else "error", one_line(exc, limit=500)))
    finally:
        conn.close()


def _held_child(conn: Connection, kind: str, spec: dict[str, Any], settings: dict[str, Any]) -> None:
    """The first window, as :func:`_child`; then one more window of the same step (between probes too) per
    ``"again"`` from the parent, until anything else or a closed pipe."""
    later: list[Any] = []

    def first() -> Any:
        measurement, again = MEASURE_AGAIN[kind](spec, settings)
        later.append(again)
        return measurement

    try:
        conn.send(Outcome("ok", "", asdict(observe(kind, settings, first))))
        while conn.recv() == "again":
            conn.send(Outcome("ok", "", asdict(observe(kind, settings, later[0]))))
    except EOFError:
        pass  # the parent closed the pipe: no more windows
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a trace status
        conn.send(Outcome("oom" if is_out_of_memory(exc) else "error", one_line(exc, limit=500)))
    finally:
        conn.close()


def _describe_exit(code: int | None) -> Outcome:
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        if -code == signal.SIGKILL:
            return Outcome("oom", f"worker killed by {name} (the kernel's out-of-memory killer, most likely)")
        return Outcome("error", f"worker died from signal {name}")
    return Outcome("error", f"worker exited with code {code} without a result")


def _start(target: Any, kind: str, spec: dict[str, Any], settings: dict[str, Any], duplex: bool
           ) -> tuple[Any, Connection]:
    """A started worker process running ``target`` and the parent's end of its pipe."""
    ctx = worker_context()
    parent, child = ctx.Pipe(duplex=duplex)
    proc = ctx.Process(target=target, args=(child, kind, spec, settings), daemon=True)
    with main_module_hidden():
        proc.start()
    child.close()
    return proc, parent


def _await_outcome(proc: Any, parent: Connection, settings: dict[str, Any]) -> Outcome:
    """The worker's next outcome, or the status of its death, of ``max_rss_mb`` or of ``timeout_s``."""
    deadline = time.monotonic() + settings["timeout_s"]
    limit_bytes = settings["max_rss_mb"] * 1024 * 1024
    while True:
        if parent.poll(0.05):
            try:
                return parent.recv()
            except EOFError:
                proc.join(5)
                return _describe_exit(proc.exitcode)
        if not proc.is_alive():
            proc.join()
            return _describe_exit(proc.exitcode)
        if _rss_bytes(proc.pid) > limit_bytes:
            return Outcome("oom", f"worker exceeded max_rss_mb={settings['max_rss_mb']:g} and was killed")
        if time.monotonic() > deadline:
            return Outcome("timeout", f"no result after timeout_s={settings['timeout_s']:g} s; worker killed")


def _end(proc: Any, parent: Connection) -> None:
    if proc.is_alive():
        proc.kill()
    proc.join(10)
    parent.close()


def run_isolated(kind: str, spec: dict[str, Any], settings: dict[str, Any]) -> Outcome:
    """Measure ``spec`` in a fresh worker, enforcing ``timeout_s`` and ``max_rss_mb``."""
    proc, parent = _start(_child, kind, spec, settings, duplex=False)
    try:
        return _await_outcome(proc, parent, settings)
    finally:
        _end(proc, parent)


@dataclass
class HeldWorker:
    """A worker that measured its first window and waits, model built, to time the same step again; the holder
    ends it with :meth:`close`."""

    proc: Any
    parent: Connection
    settings: dict[str, Any]
    private_mb: float = math.nan
    """The worker's own memory (USS) once its first window was measured: what holding it costs."""

    def again(self) -> Outcome:
        """The outcome of one more window (``timeout_s`` and ``max_rss_mb`` enforced anew); a worker whose
        window failed is ended."""
        try:
            self.parent.send("again")
            outcome = _await_outcome(self.proc, self.parent, self.settings)
        except (BrokenPipeError, ConnectionResetError):
            self.proc.join(5)
            outcome = _describe_exit(self.proc.exitcode)
        if outcome.status != "ok":
            self.close()
        return outcome

    def close(self) -> None:
        """End the worker (no more windows)."""
        _end(self.proc, self.parent)


def start_held(kind: str, spec: dict[str, Any], settings: dict[str, Any]) -> tuple[Outcome, HeldWorker | None]:
    """The first window's outcome of ``spec`` in a fresh worker, and the worker kept for a second window (None
    when the first failed: the worker is ended). Kinds of :data:`perfzoo.profiling.measure.MEASURE_AGAIN`."""
    if kind not in MEASURE_AGAIN:
        raise ValueError(f"kind {kind!r} cannot time a step in a second window")
    proc, parent = _start(_held_child, kind, spec, settings, duplex=True)
    outcome = _await_outcome(proc, parent, settings)
    if outcome.status != "ok":
        _end(proc, parent)
        return outcome, None
    try:
        private_mb = psutil.Process(proc.pid).memory_full_info().uss / 2**20
    except psutil.Error:
        private_mb = math.nan
    return outcome, HeldWorker(proc, parent, settings, private_mb)


def _rss_bytes(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0
