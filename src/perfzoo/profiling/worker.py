"""Run one measurement in an isolated process: a crash, an OOM kill or a hang becomes a status."""

from __future__ import annotations

import signal
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import psutil

from perfzoo.io import one_line
from perfzoo.profiling.core import main_module_hidden, worker_context
from perfzoo.profiling.interference import observe
from perfzoo.profiling.measure import MEASURE

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


def _describe_exit(code: int | None) -> Outcome:
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        if -code == signal.SIGKILL:
            return Outcome("oom", f"worker killed by {name} (the kernel's out-of-memory killer, most likely)")
        return Outcome("error", f"worker died from signal {name}")
    return Outcome("error", f"worker exited with code {code} without a result")


def run_isolated(kind: str, spec: dict[str, Any], settings: dict[str, Any]) -> Outcome:
    """Measure ``spec`` in a fresh worker, enforcing ``timeout_s`` and ``max_rss_mb``."""
    ctx = worker_context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, kind, spec, settings), daemon=True)
    with main_module_hidden():
        proc.start()
    child.close()
    deadline = time.monotonic() + settings["timeout_s"]
    limit_bytes = settings["max_rss_mb"] * 1024 * 1024
    try:
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
                return Outcome("timeout",
                               f"no result after timeout_s={settings['timeout_s']:g} s; worker killed")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        parent.close()


def _rss_bytes(pid: int) -> int:
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0
