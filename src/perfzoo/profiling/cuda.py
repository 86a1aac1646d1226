"""CUDA measurement: one config on one GPU, timed with CUDA events, with an NVML energy window.

Protocol (README, "GPUs: time, memory, power and energy"), inside one isolated worker:

1. free the cache, gc, reset the allocator's peak statistics; build the model and the synthetic batch on
   ``cuda:{gpu_index}``; warm up;
2. time iterations with CUDA events, one pair per iteration, every iteration kept, until
   :func:`perfzoo.profiling.core.should_stop` says so (the same adaptive rule as on the CPU);
3. read ``max_memory_allocated`` / ``max_memory_reserved`` (``peak_mem_mb`` is the reserved peak, what
   the job needs from the GPU);
4. energy window: a :class:`~perfzoo.profiling.nvml.PowerSampler` at ``sample_hz`` runs while the step is
   repeated until the window lasts at least ``max(min_window_s, counter_period_s)``; the total-energy
   counter is read at the window's start and end. Both energies are kept (counter and E = Δtᵀ·P of the
   samples over exactly the same window, :func:`perfzoo.energy.energy_from_samples`) with their relative
   disagreement (:func:`perfzoo.energy.compare_counter`). A failed read makes that energy NaN, never 0,
   and the reason goes to ``energy_message``;
5. per-operator times of ``profiling.op_timing.steps`` more steps (first measurements only): the GPU time
   of the kernels each aten operator call launched, from ``torch.profiler``
   (:class:`~perfzoo.profiling.op_timing.CudaKernelClock`), after every label has been read.

Every GPU-specific call goes through :class:`TorchCuda` (the CUDA boundary) and every NVML call through
:class:`~perfzoo.profiling.nvml.NvmlLibrary`, so tests substitute both with fakes and run this module
end to end without a GPU.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.models.builders import build_model
from perfzoo.energy import compare_counter, energy_from_samples
from perfzoo.profiling import nvml
from perfzoo.profiling.core import (
    Measurement,
    main_module_hidden,
    make_optimizer,
    make_step,
    set_precision,
    synthetic_batch,
    time_iterations,
    worker_context,
)
from perfzoo.profiling.op_timing import CudaKernelClock, step_op_times

MIB = 1024 * 1024
DEFAULT_SAMPLE_HZ = 50.0
DEFAULT_MIN_WINDOW_S = 4.0  # from meter-checked traces: README, "Energy on GPUs: what the numbers show"
GEMM_DTYPES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16")


# --------------------------------------------------------------------------------------------------
# CUDA boundary
# --------------------------------------------------------------------------------------------------


class TorchCuda:
    """The CUDA boundary: the only code here that calls ``torch.cuda``.

    A fake for tests implements the same methods (``device`` may then return ``"cpu"`` so that the real
    model runs on the CPU while timing and memory statistics come from the fake).
    """

    def facts(self, index: int) -> dict[str, Any]:
        """Availability of CUDA device ``index`` and its facts; ``available`` False with ``reason`` if not."""
        import torch  # lazy: ~3 s import; the parent process never measures

        facts: dict[str, Any] = {
            "torch_version": torch.__version__,
            "torch_cuda_version": torch.version.cuda,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
        if not torch.cuda.is_available():
            built = (f"torch {torch.__version__} built for CUDA {torch.version.cuda}" if torch.version.cuda
                     else f"torch {torch.__version__} built without CUDA")
            return {**facts, "available": False, "reason": f"torch.cuda.is_available() is False ({built})"}
        count = torch.cuda.device_count()
        if index >= count:
            return {**facts, "available": False,
                    "reason": f"gpu_index {index} requested but only {count} CUDA device(s) are visible"}
        props = torch.cuda.get_device_properties(index)
        with contextlib.suppress(Exception):
            facts["cudnn_version"] = torch.backends.cudnn.version()
        uuid = getattr(props, "uuid", None)
        return {
            **facts,
            "available": True,
            "reason": "",
            "device_count": count,
            "name": props.name,
            "uuid": None if uuid is None else str(uuid),
            "total_memory_mb": props.total_memory / MIB,
            "sm_count": int(props.multi_processor_count),
            "compute_capability": f"{props.major}.{props.minor}",
        }

    def device(self, index: int) -> str:
        return f"cuda:{index}"

    def set_device(self, index: int) -> None:
        import torch  # lazy: ~3 s import; the parent process never measures

        torch.cuda.set_device(index)

    def synchronize(self, device: str) -> None:
        import torch  # lazy: ~3 s import; the parent process never measures

        torch.cuda.synchronize(device)

    def time_ms(self, fn: Callable[[], Any], device: str) -> float:
        """Milliseconds of GPU time of ``fn`` between two CUDA events on the current stream."""
        import torch  # lazy: ~3 s import; the parent process never measures

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def empty_cache(self) -> None:
        import torch  # lazy: ~3 s import; the parent process never measures

        torch.cuda.empty_cache()

    def op_clock(self, device: str) -> CudaKernelClock:
        """The per-operator timer's clock: the kernels' GPU time per operator call, from torch.profiler."""
        return CudaKernelClock(device)

    def reset_peak_memory_stats(self, device: str) -> None:
        import torch  # lazy: ~3 s import; the parent process never measures

        torch.cuda.reset_peak_memory_stats(device)

    def max_memory_allocated(self, device: str) -> int:
        import torch  # lazy: ~3 s import; the parent process never measures

        return int(torch.cuda.max_memory_allocated(device))

    def max_memory_reserved(self, device: str) -> int:
        import torch  # lazy: ~3 s import; the parent process never measures

        return int(torch.cuda.max_memory_reserved(device))


def _backend(backend: Any | None) -> Any:
    return backend if backend is not None else TorchCuda()


# --------------------------------------------------------------------------------------------------
# Facts from a separate process (the profiling parent must not hold a CUDA context)
# --------------------------------------------------------------------------------------------------


def _facts_child(conn: Any, index: int) -> None:
    try:
        conn.send(TorchCuda().facts(index))
    except BaseException as exc:  # noqa: BLE001 - any failure is an answer
        conn.send({"available": False, "reason": f"CUDA probe failed: {type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def cuda_facts(index: int, backend: Any | None = None, timeout_s: float = 120.0) -> dict[str, Any]:
    """Facts of CUDA device ``index``: from ``backend`` in-process, else from a short-lived worker.

    The parent of a profiling job only talks to NVML; initialising CUDA there would hold a context (and
    GPU memory) during every measurement, so the real probe runs in a worker process.
    """
    if backend is not None:
        return backend.facts(index)
    ctx = worker_context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_facts_child, args=(child, index), daemon=True)
    with main_module_hidden():
        proc.start()
    child.close()
    try:
        if parent.poll(timeout_s):
            return parent.recv()
        return {"available": False, "reason": f"CUDA probe gave no answer within {timeout_s:g} s"}
    except EOFError:
        return {"available": False, "reason": f"CUDA probe process died (exit code {proc.exitcode})"}
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        parent.close()


def _normalise_uuid(uuid: str) -> str:
    text = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        text = text.removeprefix(prefix)
    return text


def nvml_index_for(lib: Any, cuda_uuid: str | None, cuda_index: int) -> tuple[int, str]:
    """NVML index of the GPU CUDA calls ``cuda:{cuda_index}``, matched by UUID.

    NVML enumerates in PCI bus order and ignores ``CUDA_VISIBLE_DEVICES``; CUDA does neither, so the two
    indices differ on multi-GPU nodes. Returns (index, how it was found).
    """
    try:
        count = lib.device_count()
    except nvml.NvmlError as exc:
        return cuda_index, f"same index as CUDA (NVML device count failed: {exc})"
    if cuda_uuid:
        want = _normalise_uuid(cuda_uuid)
        for i in range(count):
            try:
                if _normalise_uuid(lib.uuid(lib.handle(i))) == want:
                    return i, "uuid"
            except nvml.NvmlError:
                continue
    if count == 1:
        return 0, "only NVML device"
    return cuda_index, "same index as CUDA (no NVML device with the CUDA UUID)"


# --------------------------------------------------------------------------------------------------
# Energy counter update period
# --------------------------------------------------------------------------------------------------


def probe_counter_period_s(
    gpu: nvml.GpuHandle,
    timeout_s: float = 1.5,
    poll_s: float = 0.001,
    clock: Callable[[], int] = time.perf_counter_ns,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[float, str]:
    """Update period of the total-energy counter (median time between changes), or (NaN, reason)."""
    first, reason = nvml.read_energy_counter_mj(gpu)
    if not math.isfinite(first):
        return float("nan"), reason
    changes: list[int] = []
    last, start = first, clock()
    while len(changes) < 4 and clock() - start < timeout_s * 1e9:
        value, reason = nvml.read_energy_counter_mj(gpu)
        if not math.isfinite(value):
            return float("nan"), reason
        if value != last:
            changes.append(clock())
            last = value
        sleep(poll_s)
    if len(changes) < 2:
        return float("nan"), f"energy counter changed {len(changes)} time(s) in {timeout_s:g} s"
    return float(np.median(np.diff(changes))) / 1e9, ""


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def time_cuda_iterations(
    step: Callable[[], None], settings: dict[str, Any], backend: Any, device: str
) -> tuple[list[float], str]:
    """CUDA-event time of every iteration until ``should_stop`` (same adaptive rule as on the CPU)."""
    return time_iterations(lambda: backend.time_ms(step, device), settings)


# --------------------------------------------------------------------------------------------------
# Energy window
# --------------------------------------------------------------------------------------------------


def window_energy_from_samples(samples: pd.DataFrame, t0_ns: int, t1_ns: int) -> tuple[float, str]:
    """E = Δtᵀ·P of the samples over exactly [t0, t1] (each reading held until the next), or (NaN, why).

    The reading in force at t0 is the last sample at or before t0; a NaN reading anywhere in the window
    (a failed read) makes the energy NaN: the power during that gap is unknown.
    """
    frame = samples.sort_values("t_ns", kind="stable")
    t = frame["t_ns"].to_numpy(dtype="int64")
    p = frame["power_w"].to_numpy(dtype="float64")
    before = np.flatnonzero(t <= t0_ns)
    if before.size == 0:
        return float("nan"), "no power sample at or before the window start"
    inside = (t > t0_ns) & (t < t1_ns)
    powers = np.concatenate([[p[before[-1]]], p[inside]])
    missing = int(np.isnan(powers).sum())
    if missing:
        return float("nan"), f"{missing} of {powers.size} power readings in the window failed"
    times = np.concatenate([[t0_ns], t[inside], [t1_ns]]).astype("float64")
    return energy_from_samples(times, np.append(powers, powers[-1]), method="rectangle"), ""


def energy_window(
    step: Callable[[], None],
    gpu: nvml.GpuHandle | None,
    backend: Any,
    device: str,
    window_s: float,
    sample_hz: float,
    iteration_ms: float,
    gpu_reason: str = "",
    clock: Callable[[], int] = time.perf_counter_ns,
) -> dict[str, Any]:
    """Repeat ``step`` until at least ``window_s`` have passed, sampling power and reading the counter.

    Steps run in chunks with one synchronisation per chunk, so the GPU stays busy: the first chunk lasts
    about a tenth of the window by ``iteration_ms`` (the median timed iteration), later ones are sized
    from the wall time per step observed so far. The window is closed only after a synchronisation.
    """
    nan = float("nan")
    sampler = nvml.PowerSampler(gpu, rate_hz=sample_hz, clock=clock) if gpu is not None else None
    problems: list[str] = [gpu_reason] if gpu is None and gpu_reason else []
    backend.synchronize(device)
    if sampler is not None:
        sampler.start()
        sampler.sample_once()  # a reading at or before t0, so the whole window is covered
    c0, c0_reason = nvml.read_energy_counter_mj(gpu) if gpu is not None else (nan, "")
    t0 = clock()
    try:
        iterations = _repeat_in_chunks(step, backend, device, window_s * 1e9, iteration_ms, clock, t0)
    finally:
        t1 = clock()
        c1, c1_reason = nvml.read_energy_counter_mj(gpu) if gpu is not None else (nan, "")
        samples = sampler.stop() if sampler is not None else pd.DataFrame(columns=list(nvml.SENSOR_COLUMNS))
    summary = sampler.summary() if sampler is not None else {}
    counter_j = _counter_energy_j(c0, c0_reason, c1, c1_reason, problems)
    samples_j = _samples_energy_j(samples, summary, t0, t1, problems) if sampler is not None else nan
    mem_used = samples["mem_used_mb"].to_numpy(dtype="float64") if len(samples) else np.empty(0)
    return {
        "window_s": (t1 - t0) / 1e9,
        "window_iters": iterations,
        "window_energy_counter_j": counter_j,
        "window_energy_samples_j": samples_j,
        "energy_disagreement": compare_counter(counter_j, samples_j),
        "power_source": summary.get("power_source"),
        "sensor_errors": int(summary.get("error_count", 0)),
        "sample_rate_hz": summary.get("rate_hz_achieved", nan),
        "nvml_mem_used_mb": float(np.nanmax(mem_used)) if np.isfinite(mem_used).any() else nan,
        "energy_message": " | ".join(p for p in problems if p)[:2000],
        "sensors": _sensor_records(samples),
    }


def _repeat_in_chunks(step: Callable[[], None], backend: Any, device: str, target_ns: float,
                      iteration_ms: float, clock: Callable[[], int], t0: int) -> int:
    """Run ``step`` in synchronised chunks until ``target_ns`` have passed since ``t0``; the steps run."""
    iterations = 0
    per_iter_ns = max(iteration_ms, 1e-3) * 1e6 if math.isfinite(iteration_ms) else 1e6
    while True:
        elapsed = clock() - t0
        remaining = target_ns - elapsed
        if remaining <= 0 and iterations > 0:
            return iterations
        if iterations:  # calibrated on the wall clock (launch overhead included)
            per_iter_ns = max(elapsed / iterations, 1.0)
            chunk = math.ceil(remaining / per_iter_ns)
        else:  # the event time may underestimate the wall time per step: start with a tenth
            chunk = math.ceil(0.1 * target_ns / per_iter_ns)
        chunk = max(1, min(chunk, 100_000))
        for _ in range(chunk):
            step()
        iterations += chunk
        backend.synchronize(device)


def _counter_energy_j(c0: float, c0_reason: str, c1: float, c1_reason: str, problems: list[str]) -> float:
    """Energy between two counter readings (mJ) in J, NaN with the reason appended to ``problems``."""
    counter_j = (c1 - c0) / 1000.0
    if c0_reason:
        problems.append(f"energy counter at window start: {c0_reason}")
    if c1_reason:
        problems.append(f"energy counter at window end: {c1_reason}")
    if math.isfinite(counter_j) and counter_j < 0:
        problems.append(f"energy counter went backwards ({c0:.0f} -> {c1:.0f} mJ; driver reloaded?)")
        counter_j = float("nan")
    return counter_j


def _samples_energy_j(samples: pd.DataFrame, summary: dict[str, Any], t0: int, t1: int,
                      problems: list[str]) -> float:
    """Energy of the power samples over [t0, t1]; the sampler's problems are appended to ``problems``."""
    samples_j, why = window_energy_from_samples(samples, t0, t1)
    if why:
        problems.append(f"samples: {why}")
    if summary["errors"]:
        problems.append("sensor errors: " + "; ".join(summary["errors"][:3]))
    if "power (instant)" in summary["unsupported"] or "power (average)" in summary["unsupported"]:
        problems.append(f"power unsupported: {summary['unsupported']}")
    return samples_j


def _sensor_records(samples: pd.DataFrame) -> list[dict[str, Any]]:
    records = []
    for row in samples.reindex(columns=list(nvml.SENSOR_COLUMNS)).itertuples(index=False):
        record = dict(zip(nvml.SENSOR_COLUMNS, row, strict=True))
        record["t_ns"] = int(record["t_ns"])
        records.append({k: (v if k == "t_ns" else float(v)) for k, v in record.items()})
    return records


# --------------------------------------------------------------------------------------------------
# One config
# --------------------------------------------------------------------------------------------------


def _open_gpu(index: int, lib: Any | None) -> tuple[nvml.GpuHandle | None, str]:
    try:
        return nvml.open_device(index, lib=lib), ""
    except ImportError as exc:
        return None, f"pynvml is not installed: {exc}"
    except nvml.NvmlError as exc:
        return None, f"NVML device {index} could not be opened: {exc}"


def _power_limit_w(settings: dict[str, Any], gpu: nvml.GpuHandle | None) -> tuple[float | None, bool]:
    """(the limit a sweep set, True), else (the limit in force read from NVML, or None, False)."""
    limit_w = settings.get("power_limit_w")
    swept = limit_w is not None
    if not swept and gpu is not None:
        with contextlib.suppress(nvml.NvmlError):
            limit_w = gpu.lib.power_limit_mw(gpu.handle) / 1000.0
    return limit_w, swept


def _window_target_s(settings: dict[str, Any], gpu: nvml.GpuHandle | None) -> tuple[float, float]:
    """(energy counter update period, or NaN; the energy window's length: at least one period)."""
    period = settings.get("counter_period_s")
    if period is None and gpu is not None:
        period, _ = probe_counter_period_s(gpu)
    period = float("nan") if period is None else float(period)
    return period, max(float(settings.get("min_window_s", DEFAULT_MIN_WINDOW_S)),
                       period if math.isfinite(period) else 0.0)


def measure_on_cuda(
    spec: dict[str, Any], settings: dict[str, Any], backend: Any | None = None, nvml_lib: Any | None = None
) -> Measurement:
    """Measure one config on ``cuda:{gpu_index}``: CUDA-event times, allocator peaks, an energy window.

    ``settings`` holds the profiling settings plus, from the device entry, ``gpu_index``, ``nvml_index``
    (default: ``gpu_index``), ``sample_hz``, ``min_window_s``, ``counter_period_s`` and the power limit
    ``power_limit_w`` set by a sweep (None: the limit in force, read here). ``backend`` and ``nvml_lib``
    substitute the CUDA and NVML boundaries.
    """
    import torch  # lazy: ~3 s import; the parent process never measures

    cuda = _backend(backend)
    index = int(settings.get("gpu_index", 0))
    device = cuda.device(index)
    cuda.set_device(index)
    torch.set_num_threads(int(settings.get("threads", 1)))
    torch.manual_seed(0)
    gc.collect()
    cuda.empty_cache()
    cuda.reset_peak_memory_stats(device)
    model = build_model(spec["builder"], spec["name"], json.loads(spec["builder_kwargs"]),
                        settings["num_classes"], tuple(json.loads(spec["input_shape"]))).to(device)
    x, y = synthetic_batch(spec, settings["num_classes"], device)
    model, x, context = set_precision(model, x, spec.get("precision", "fp32"), "cuda")
    # one optimizer for the timed steps and the per-op ones after them, so these find its state made
    optimizer = make_optimizer(model, settings["optimizer"]) if spec["mode"] == "training" else None
    step = make_step(model, x, y, spec["mode"], optimizer, context)
    for _ in range(settings["warmup_iters"]):
        step()
    cuda.synchronize(device)
    times, reason = time_cuda_iterations(step, settings, cuda, device)
    allocated_mb = cuda.max_memory_allocated(device) / MIB
    reserved_mb = cuda.max_memory_reserved(device) / MIB

    gpu, gpu_reason = _open_gpu(int(settings.get("nvml_index", index)), nvml_lib)
    try:
        limit_w, swept = _power_limit_w(settings, gpu)
        period, window_s = _window_target_s(settings, gpu)
        window = energy_window(step, gpu, cuda, device, window_s,
                               float(settings.get("sample_hz", DEFAULT_SAMPLE_HZ)),
                               float(np.median(times)) if times else float("nan"), gpu_reason)
    finally:
        if gpu is not None:
            gpu.close()
    # after every label has been read: they never see the timer
    op_times = step_op_times(model, x, y, spec["mode"], optimizer, context, settings, cuda.op_clock(device))
    del step, model, x, y, optimizer
    gc.collect()
    cuda.empty_cache()  # cool-down, part 1: free the cache (the worker exits right after anyway)
    extra = {
        "threads": torch.get_num_threads(),
        "device": device,
        "power_limit_w": float("nan") if limit_w is None else float(limit_w),
        "power_limit_swept": swept,
        "mem_allocated_mb": allocated_mb,
        "mem_reserved_mb": reserved_mb,
        "counter_period_s": period,
        "window_target_s": window_s,
        **window,
    }
    if op_times is not None:
        extra["op_times"] = op_times
    return Measurement(times, reserved_mb, settings["warmup_iters"], reason, extra)


# --------------------------------------------------------------------------------------------------
# Microbenchmarks (hardware stage)
# --------------------------------------------------------------------------------------------------


def gemm_support(facts: dict[str, Any]) -> dict[str, str]:
    """dtype -> '' where supported, else the reason (TF32 and BF16 need compute capability >= 8.0)."""
    major = int(str(facts.get("compute_capability") or "0.0").split(".")[0])
    has = facts.get("compute_capability")
    needs_ampere = "" if major >= 8 else f"needs compute capability >= 8.0, device has {has}"
    return {"fp32": "", "tf32": needs_ampere, "fp16": "", "bf16": needs_ampere}


def measure_gemm_tflops(
    dtype: str, index: int = 0, backend: Any | None = None, n: int = 8192, repeats: int = 10, warmup: int = 3
) -> float:
    """Best-of-``repeats`` rate of an n×n ``torch.mm`` in ``dtype`` timed with CUDA events (TFLOP/s).

    fp32 runs at full IEEE precision (``set_float32_matmul_precision('highest')``), tf32 with TF32
    tensor cores allowed ('high'); the global setting is restored afterwards.
    """
    import torch  # lazy: ~3 s import; the parent process never measures

    cuda = _backend(backend)
    device = cuda.device(index)
    torch_dtype = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
                   "bf16": torch.bfloat16}[dtype]
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=torch_dtype)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=torch_dtype)
        out = torch.empty(n, n, device=device, dtype=torch_dtype)
        for _ in range(warmup):
            torch.mm(a, b, out=out)
        cuda.synchronize(device)
        best_ms = min(cuda.time_ms(lambda: torch.mm(a, b, out=out), device) for _ in range(repeats))
    finally:
        torch.set_float32_matmul_precision(previous)
    del a, b, out
    cuda.empty_cache()
    return 2 * n**3 / (best_ms / 1e3) / 1e12


def measure_copy_gbs(
    index: int = 0, backend: Any | None = None, megabytes: int = 1024, repeats: int = 10, warmup: int = 3
) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second, GB/s), best of ``repeats``."""
    import torch  # lazy: ~3 s import; the parent process never measures

    cuda = _backend(backend)
    device = cuda.device(index)
    src = torch.ones(megabytes * MIB // 4, device=device)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    cuda.synchronize(device)
    best_ms = min(cuda.time_ms(lambda: dst.copy_(src), device) for _ in range(repeats))
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    cuda.empty_cache()
    return nbytes / (best_ms / 1e3) / 1e9
