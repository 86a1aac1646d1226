"""The measurement core shared by every device kind: what a worker reports (:class:`Measurement`), peak
RSS, the synthetic batch, precision setup, one step, and the adaptive stopping rule; plus the start of
isolated worker processes. perfzoo.profiling.measure (cpu), cuda and layers import this, never the other
way round."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import multiprocessing.util
import os
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfzoo.io import InputError, one_line
from perfzoo.models.builders import VOCAB_SIZE
from perfzoo.hardware import BUILD_DTYPES
from perfzoo.stats import relative_ci_halfwidth

PRELOAD = ["torch", "torchvision", "timm", "perfzoo.profiling.measure", "perfzoo.profiling.frozen_heap"]
"""Modules the forkserver imports once, so each worker starts in a fraction of a second; the last freezes what the
others made for the garbage collector (:mod:`perfzoo.profiling.frozen_heap`)."""
_CONTEXT: Any = None


def worker_context() -> Any:
    """A forkserver context with torch preloaded, so each worker starts in a fraction of a second."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def worker_server_pid() -> int | None:
    """Process id of the running worker server (the forkserver every worker is forked from); None before the
    first worker of this process."""
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def restart_worker_server() -> bool:
    """Stop the worker server, so the next worker starts a new one (or forks from the spare that
    :func:`start_worker_servers` started, which becomes the worker server); whether one was stopped.

    Workers forked from one server inherit its memory layout, and a CPU memory label depends on it: 20 configs
    measured twice from one server gave labels 0.8-1.6 % apart (MAPE), from two servers 2.1-3.3 %
    (``bench/RESULTS.md``, "The memory label between worker servers"). A server is a new process, with its own
    imports and address-space layout. The standard library stops one only through ``ForkServer._stop`` (what
    its own tests use), which waits until every worker the server forked has ended; workers still held for a
    later window (:class:`perfzoo.profiling.worker.HeldWorker`) would make it wait for ever, so with held
    workers alive the server is told to stop and left to end with its last worker
    (:func:`reap_worker_servers` collects it). Without ``_stop`` nothing is stopped and False is returned."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if getattr(server, "_stop", None) is None or worker_server_pid() is None:
        return False
    if not mp.active_children():
        server._stop()
        _take_spare(server)
        return True
    with server._lock:  # ForkServer._stop_unlocked without its wait
        os.close(server._forkserver_alive_fd)
        _LINGERING_SERVERS.append(server._forkserver_pid)
        server._forkserver_alive_fd = server._forkserver_pid = None
        if not mp.util.is_abstract_socket_namespace(server._forkserver_address):
            os.unlink(server._forkserver_address)
        server._forkserver_address = None
    _take_spare(server)
    return True


_LINGERING_SERVERS: list[int] = []
"""Worker servers told to stop while workers they forked were still held."""

READY_ENV = "PERFZOO_WORKER_SERVER_READY"
"""Environment variable naming the file a starting worker server creates once its imports are made
(:mod:`perfzoo.profiling.frozen_heap`, the last of :data:`PRELOAD`)."""
READY_TIMEOUT_S = 300.0
_SPARE: Any = None
"""The next worker server, started beside the current one by :func:`start_worker_servers`; the next
:func:`restart_worker_server` makes it the current one."""


def start_worker_servers(spare: bool) -> list[str]:
    """Start the worker server (unless one runs) and, with ``spare``, the next one beside it, and return once
    both have made their imports (or ended, or after :data:`READY_TIMEOUT_S`): one line for each server still
    importing then (empty when every server was ready), for the shard's metadata, as its imports may overlap
    the first measurements (whose interference checks see the load).

    A server's imports (torch, torchvision, timm) take seconds of one core. Started together before anything
    is measured, two servers import side by side on two cores, and the second is ready when
    :func:`restart_worker_server` needs it, instead of importing then, while the shard waits. It is a process
    of its own, started apart from the first, as a restarted one is. Each server signals that its imports are made
    by creating the file :data:`READY_ENV` names, so neither server's imports overlap a measurement."""
    from multiprocessing import forkserver

    global _SPARE
    worker_context()
    starting = [] if worker_server_pid() is not None else [forkserver._forkserver]
    if spare and _SPARE is None:
        _SPARE = forkserver.ForkServer()
        _SPARE.set_forkserver_preload(PRELOAD)
        starting.append(_SPARE)
    if not starting:
        return []
    with tempfile.TemporaryDirectory(prefix="perfzoo-servers-") as folder:
        marks = [Path(folder) / f"ready-{i}" for i in range(len(starting))]
        for server, mark in zip(starting, marks, strict=True):
            os.environ[READY_ENV] = str(mark)
            try:
                with main_module_hidden():
                    server.ensure_running()
            finally:
                del os.environ[READY_ENV]
        deadline = time.monotonic() + READY_TIMEOUT_S
        ready = [_await_ready(server, mark, deadline) for server, mark in zip(starting, marks, strict=True)]
    return [f"worker server {server._forkserver_pid} still importing after {READY_TIMEOUT_S:.0f} s"
            for server, ok in zip(starting, ready, strict=True) if not ok]


def _await_ready(server: Any, mark: Path, deadline: float) -> bool:
    """Wait until ``server`` created ``mark`` or ended (True), or until ``deadline`` passed (False). An ended
    server is left unreaped (``WNOWAIT``): the standard library's ``ensure_running`` (or ``_stop``) collects it
    as usual."""
    while not mark.exists():
        if os.waitid(os.P_PID, server._forkserver_pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True  # ended (its imports failed): nothing of it can overlap a measurement
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _take_spare(server: Any) -> None:
    """Make the spare server (if one runs) the standard library's worker server ``server``."""
    global _SPARE
    spare, _SPARE = _SPARE, None
    if spare is not None and spare._forkserver_pid is not None:
        server._forkserver_address = spare._forkserver_address
        server._forkserver_alive_fd = spare._forkserver_alive_fd
        server._forkserver_pid = spare._forkserver_pid


def stop_spare_worker_server() -> None:
    """Stop a spare server that no restart took (it forked no worker, so it ends at once)."""
    global _SPARE
    spare, _SPARE = _SPARE, None
    if spare is not None and spare._forkserver_pid is not None:
        spare._stop()


def reap_worker_servers(wait_s: float = 0.0) -> None:
    """Collect the stopped worker servers that have ended (their last held worker ended), waiting up to
    ``wait_s`` for the others (a server ends shortly after its last worker; one not collected stays a zombie
    until this process ends)."""
    deadline = time.monotonic() + wait_s
    while True:
        for pid in list(_LINGERING_SERVERS):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                _LINGERING_SERVERS.remove(pid)
        if not _LINGERING_SERVERS or time.monotonic() >= deadline:
            return
        time.sleep(0.05)


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start workers without multiprocessing re-running the calling script (e.g. a Snakemake script)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


@dataclass
class Measurement:
    """Everything one worker reports for one config."""

    times_ms: list[float] = field(default_factory=list)
    peak_mem_mb: float = float("nan")
    n_warmup: int = 0
    stop_reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _status_kib() -> dict[str, int]:
    """The ``kB`` fields of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ``RssAnon`` …)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[name] = int(value.split()[0])
    return fields


def _reset_high_water_mark() -> None:
    """Reset the kernel's peak-RSS watermark (``VmHWM``) to the current resident set."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # older kernels: the watermark keeps the process's earlier peak, the baseline is still subtracted


RSS_COMPONENTS = {"anon": "RssAnon", "file": "RssFile", "shmem": "RssShmem"}
"""The resident set's parts as ``/proc/self/status`` names them: anonymous memory (tensors, the heap),
file-backed pages (library code and data mapped from disk), shared memory."""


def _parts_mb(fields: dict[str, int]) -> dict[str, float]:
    return {part: fields[name] / 1024 for part, name in RSS_COMPONENTS.items()}


def rss_components_mb() -> dict[str, float]:
    """The current resident set by part (:data:`RSS_COMPONENTS`), in MB."""
    return _parts_mb(_status_kib())


@dataclass
class ResidentPeak:
    """The CPU's peak-memory label: the worker's peak resident set **without file-backed pages**, above its
    baseline.

    The kernel keeps one high-water mark for the whole resident set (``VmHWM``), and that includes the
    pages of library code a step maps on first use. How many it maps depends on the page cache's state,
    not on the step: the memory reference measured 20.8 MB of file-backed growth (22.5 MB of it
    ``libtorch_cpu.so``) at one moment and 48.9-81.8 MB at another on the same VM and code, while its
    anonymous growth stayed 45.5-47.2 MB (``bench/RESULTS.md``, "What the CPU memory label's shift is made
    of"). So the measurement is cut into phases (:meth:`close_phase`); in each, the high-water mark less the
    file-backed pages mapped at the phase's end is the anonymous (and shared) peak. That is exact where no
    file page is mapped after the phase's peak (every phase after the first step: its code is already
    mapped) and a lower bound otherwise; the label is the largest phase's, above the baseline's anonymous
    part. ``total_mb`` is the former label (the whole resident set's peak above the baseline), kept in the
    trace (``peak_rss_total_mb``).
    """

    baseline: dict[str, float]
    """The resident set's parts (:data:`RSS_COMPONENTS`) when the watch started, MB."""
    phase_peaks_mb: list[float] = field(default_factory=list)
    """Per closed phase: the high-water mark less the file-backed pages at its end, MB."""
    total_peaks_mb: list[float] = field(default_factory=list)
    """Per closed phase: the whole resident set's high-water mark, MB."""
    closed_parts: dict[str, float] = field(default_factory=dict)
    """The resident set's parts at the end of the last closed phase, MB."""

    @classmethod
    def start(cls) -> ResidentPeak:
        """Reset the high-water mark and record the baseline (call after ``gc``, before the model exists)."""
        _reset_high_water_mark()
        return cls(rss_components_mb())

    def close_phase(self) -> None:
        """End a phase: record its peaks and parts (one read of ``/proc/self/status``), and reset the high-water
        mark for the next."""
        fields = _status_kib()
        self.total_peaks_mb.append(fields["VmHWM"] / 1024)
        self.phase_peaks_mb.append((fields["VmHWM"] - fields[RSS_COMPONENTS["file"]]) / 1024)
        self.closed_parts = _parts_mb(fields)
        _reset_high_water_mark()

    @property
    def label_mb(self) -> float:
        """Peak of the resident set without file-backed pages, above the baseline's."""
        return max(self.phase_peaks_mb) - (sum(self.baseline.values()) - self.baseline["file"])

    @property
    def total_mb(self) -> float:
        """Peak of the whole resident set above the baseline's (file-backed pages included)."""
        return max(self.total_peaks_mb) - sum(self.baseline.values())

    def growth_mb(self) -> dict[str, float]:
        """How much each part of the resident set grew between the baseline and the last closed phase's end."""
        return {part: round(mb - self.baseline[part], 3) for part, mb in self.closed_parts.items()}


def synthetic_batch(spec: dict[str, Any], num_classes: int, device: str) -> tuple[Any, Any]:
    """Seeded random inputs and class targets of the config's shape (no data set needed)."""
    import torch  # lazy: ~3 s import; the parent process never measures

    gen = torch.Generator().manual_seed(0)
    shape = (int(spec["batch"]), *json.loads(spec["input_shape"]))
    if spec["dtype"] == "int64":
        x = torch.randint(0, VOCAB_SIZE, shape, generator=gen)
    else:
        x = torch.randn(shape, generator=gen)
    y = torch.randint(0, num_classes, (shape[0],), generator=gen)
    return x.to(device), y.to(device)


def set_precision(model: Any, x: Any, precision: str, device_type: str) -> tuple[Any, Any, Callable[[], Any]]:
    """(model, input, context of each forward) running at ``precision`` (see ``perfzoo.hardware.precision``).

    fp16/bf16 convert the model and floating-point inputs; amp keeps float32 weights and runs the forward
    under float16 ``torch.autocast``; tf32 allows TF32 in matmuls and cuDNN convolutions, and every other
    precision forbids it (PyTorch lets cuDNN use TF32 by default, which would make fp32 not fp32).
    """
    import torch  # lazy: ~3 s import; the parent process never measures

    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    if precision in ("fp16", "bf16"):
        dtype = getattr(torch, BUILD_DTYPES[precision])
        model = model.to(dtype)
        x = x.to(dtype) if x.is_floating_point() else x
    if precision == "amp":
        return model, x, lambda: torch.autocast(device_type, dtype=torch.float16)
    return model, x, contextlib.nullcontext


OPTIMIZERS = ("sgd", "adam")
"""The profiled training step's optimizers (config ``profiling.optimizer``)."""


def make_optimizer(model: Any, optimizer: str) -> Any:
    """The profiled training step's optimizer: SGD with momentum (``sgd``) or Adam."""
    import torch  # lazy: ~3 s import; the parent process never measures

    if optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=1e-4)


def class_targets_message(classes: int, top_target: int) -> str:
    """Why a training step cannot score its targets: the logits have fewer classes than the targets need."""
    return (f"the model's logits have {classes} classes and the training targets go up to {top_target} "
            f"(zoo.num_classes of the config): give the model a head of zoo.num_classes outputs "
            f"or set zoo.num_classes to at most {classes}")


def check_target_classes(classes: int, top_target: int) -> None:
    """InputError unless every target is a class of the logits (plain ints: no tensor operation, no sync). On
    CUDA an out-of-range target is a device-side assert that ends the worker's CUDA context without naming the
    cause, so the step checks before its loss sees one."""
    if top_target >= classes:
        raise InputError(class_targets_message(classes, top_target))


def with_target_classes(logits: Any, top_target: int | None) -> Any:
    """``logits``, after :func:`check_target_classes` (skipped where the targets hold no values: None)."""
    if top_target is not None:
        check_target_classes(logits.shape[-1], top_target)
    return logits


def step_loss(loss_fn: Any, logits: Any, y: Any) -> Any:
    """Cross-entropy of class logits ``(batch, classes)``; per-token logits ``(batch, tokens, vocab)`` (a
    language model) are scored token by token against the sample's class repeated over its tokens, which
    costs what a next-token loss costs.

    The targets are drawn below the config's ``zoo.num_classes``; a model whose logits have fewer classes (a
    user's model file with its own head) fails on the CPU with an error saying so, not PyTorch's bare
    "Target 76 is out of bounds" (:func:`make_step` checks before the loss, on every device)."""
    try:
        if logits.dim() == 3:
            return loss_fn(logits.flatten(0, 1), y.repeat_interleave(logits.shape[1]))
        return loss_fn(logits, y)
    except IndexError as exc:
        raise InputError(f"{class_targets_message(logits.shape[-1], int(y.max()))} ({one_line(exc)})") from None


def make_step(model: Any, x: Any, y: Any, mode: str, optimizer: Any,
              forward_context: Callable[[], Any] | None = None,
              phase: Callable[[str], Any] | None = None) -> Callable[[], None]:
    """One inference forward (no_grad) or one training step (forward, loss, backward, optimizer);
    ``forward_context`` (e.g. autocast from :func:`set_precision`) wraps each forward and loss.

    ``phase(name)``, a context manager factory, marks the training step's ``forward`` (model and loss),
    ``backward`` and ``optimizer`` phases (the per-operator timer's, :mod:`perfzoo.profiling.op_timing`); an
    inference step is one forward. Without it the phases mark nothing: the plain step the end-to-end
    window times.
    ``optimizer`` is a name of :data:`OPTIMIZERS` or an optimizer already made for ``model`` (so two steps
    can share its state)."""
    import torch  # lazy: ~3 s import; the parent process never measures

    context = forward_context or contextlib.nullcontext
    if mode == "inference":
        model.eval()

        def infer() -> None:
            with torch.no_grad(), context():
                model(x)

        return infer
    model.train()
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = make_optimizer(model, optimizer) if isinstance(optimizer, str) else optimizer
    in_phase = phase or _unmarked_phase
    # once, before any step and outside any per-operator timer; the meta device's targets hold no values
    top_target = None if y.device.type == "meta" else int(y.max())

    def train() -> None:
        opt.zero_grad(set_to_none=True)
        with in_phase("forward"), context():
            # no name holds the logits: they are freed with the loss's graph, as in any plain training loop
            loss = step_loss(loss_fn, with_target_classes(model(x), top_target), y)
        with in_phase("backward"):
            loss.backward()
        with in_phase("optimizer"):
            opt.step()

    return train


_UNMARKED = contextlib.nullcontext()


def _unmarked_phase(name: str) -> contextlib.nullcontext[None]:
    """The phase marker of the plain step the end-to-end window times: marks nothing (one shared no-op
    context; a 0.23 ms training step timed within 0.1 µs of the unmarked one, ``bench/RESULTS.md``)."""
    return _UNMARKED


def should_stop(times_ms: list[float], started_ns: int, settings: dict[str, Any]) -> str:
    """The reason to stop measuring, or '' to go on."""
    n = len(times_ms)
    if n < settings["min_iters"]:
        return ""
    if relative_ci_halfwidth(times_ms) <= settings["ci_target"]:
        return "ci_target"
    if n >= settings["max_iters"]:
        return "max_iters"
    if (time.perf_counter_ns() - started_ns) / 1e9 >= settings["max_time_s"]:
        return "max_time"
    return ""


def time_iterations(timed_step: Callable[[], float], settings: dict[str, Any]) -> tuple[list[float], str]:
    """Call ``timed_step`` (one iteration, returning its time in ms) until should_stop says so."""
    times: list[float] = []
    started = time.perf_counter_ns()
    while not (reason := should_stop(times, started, settings)):
        times.append(float(timed_step()))
    return times, reason


def time_cpu_iterations(step: Callable[[], None], settings: dict[str, Any]) -> tuple[list[float], str]:
    """Wall-clock (perf_counter_ns) per iteration until should_stop says so."""

    def timed() -> float:
        t0 = time.perf_counter_ns()
        step()
        return (time.perf_counter_ns() - t0) / 1e6

    return time_iterations(timed, settings)
