"""Checks that need a real NVIDIA GPU, beside the workflow's own profiling of ``config/gpu-local.yaml``.

Each subcommand writes ``OUT/<name>.json`` (and prints it), measured with perfzoo's own code on
``cuda:0``:

* ``env``: GPU, driver, CUDA, torch; MIG mode; power-limit range; NVML fields the sampler reads.
* ``overhead``: the power sampler's cost on latency — the same configs timed with CUDA events with and
  without a running :class:`~perfzoo.profiling.nvml.PowerSampler`, alternating (ABAB…), medians; and
  CUDA-event time against the wall clock (synchronise, ``perf_counter``) of the same iterations.
* ``optimer``: the per-operator timer on the GPU (:class:`~perfzoo.profiling.op_timing.CudaKernelClock`, kernel
  time per aten call) against a plain ``torch.profiler`` run of the same steps (CUDA activities): kernel time
  per step in all, and per operator phase; plus CUDA events around each call, the design it replaced.
* ``powerlimit``: a real :class:`~perfzoo.profiling.power_limits.PowerLimitSweep` over two limits on one
  config (energy window per limit), and whether the original limit was restored.
* ``interference RESULTS``: one shard of three configs profiled by the workflow's runner while a second
  process keeps the GPU busy for part of it; which measurements were flagged and re-measured.

Usage (on the GPU machine, perfzoo importable): ``python bench/gpu_checks.py OUT env overhead optimer
powerlimit`` then, after the workflow, ``python bench/gpu_checks.py OUT interference results``. The workflow
config and its cuda device are ``PERFZOO_GPU_CONFIG`` and ``PERFZOO_GPU_DEVICE`` (default
``config/gpu-local.yaml`` and ``h100``).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from perfzoo.models.builders import build_model
from perfzoo.profiling import nvml
from perfzoo.profiling.core import make_optimizer, make_step, set_precision, synthetic_batch
from perfzoo.profiling.cuda import energy_window
from perfzoo.profiling.op_timing import CudaKernelClock, time_operators
from perfzoo.profiling.power_limits import PowerLimitSweep

DEVICE = "cuda:0"
GPU_CONFIG = os.environ.get("PERFZOO_GPU_CONFIG", "config/gpu-local.yaml")
"""The workflow config whose cuda device the ``interference`` check profiles (``bench/gpu_run.sh`` sets it)."""
GPU_DEVICE = os.environ.get("PERFZOO_GPU_DEVICE", "h100")
"""That device's name in the config (its ``results/hardware/<name>.json`` gives the probe baseline)."""
CONFIGS = [  # (builder, name, input shape, batch, mode, precision)
    ("torchvision", "resnet50", [3, 128, 128], 32, "inference", "amp"),
    ("torchvision", "resnet18", [3, 128, 128], 32, "training", "fp32"),
    ("timm", "vit_tiny_patch16_224", [3, 224, 224], 32, "training", "amp"),
    ("mlp", "mlp_big", [784], 256, "inference", "fp32"),
]


def spec_of(builder: str, name: str, shape: list[int], batch: int, mode: str, precision: str) -> dict[str, Any]:
    kwargs = {"hidden": [8192, 8192]} if builder == "mlp" else {}
    return {"builder": builder, "name": name, "builder_kwargs": json.dumps(kwargs), "input_shape": json.dumps(shape),
            "batch": batch, "mode": mode, "precision": precision, "dtype": "float32"}


def build(spec: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any]:
    """(model, x, y, autocast context, optimizer) of ``spec`` on the GPU, as the CUDA measurer builds them."""
    torch.manual_seed(0)
    model = build_model(spec["builder"], spec["name"], json.loads(spec["builder_kwargs"]), 100,
                        tuple(json.loads(spec["input_shape"]))).to(DEVICE)
    x, y = synthetic_batch(spec, 100, DEVICE)
    model, x, context = set_precision(model, x, spec["precision"], "cuda")
    optimizer = make_optimizer(model, "sgd") if spec["mode"] == "training" else None
    return model, x, y, context, optimizer


def warm(spec: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(model, x, y, context, optimizer, step) of ``spec`` after 10 warm-up steps, synchronised."""
    model, x, y, context, optimizer = build(spec)
    step = make_step(model, x, y, spec["mode"], optimizer, context)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    return model, x, y, context, optimizer, step


def label(spec: dict[str, Any]) -> str:
    return f"{spec['name']} {spec['mode']} b{spec['batch']} {spec['precision']}"


def event_ms(step: Any) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def check_env(out: Path) -> dict[str, Any]:
    gpu = nvml.open_device(0)
    lib, h = gpu.lib, gpu.handle
    facts: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                             "cudnn": torch.backends.cudnn.version(), "python": sys.version.split()[0]}
    try:
        facts.update(nvml.device_identity(gpu))
        low, high = lib.power_limit_constraints_mw(h)
        facts.update(power_limit_w=lib.power_limit_mw(h) / 1e3, power_limit_range_w=[low / 1e3, high / 1e3])
        try:
            current, pending = lib.mig_mode(h)
            facts["mig_mode"] = {"current": current, "pending": pending}
        except nvml.NvmlError as exc:  # a GPU without MIG: reported as it is
            facts["mig_mode"] = f"unreadable: {exc}"
        facts["power_instant_w"] = lib.power_instant_mw(h) / 1e3
        facts["power_average_w"] = lib.power_average_mw(h) / 1e3
        facts["compute_pids"] = lib.compute_pids(h)
        facts["throttle_reasons"] = lib.throttle_reasons(h)
        props = torch.cuda.get_device_properties(0)
        facts.update(sm_count=props.multi_processor_count, total_memory_mib=props.total_memory / 2**20)
    finally:
        gpu.close()
    return facts


def check_overhead(out: Path, rounds: int = 3, iterations: int = 60) -> dict[str, Any]:
    """Median CUDA-event ms with and without the sampler (alternating rounds), and event vs wall time."""
    rows = []
    gpu = nvml.open_device(0)
    try:
        for cfg in CONFIGS:
            spec = spec_of(*cfg)
            model, x, y, context, optimizer, step = warm(spec)
            times: dict[str, list[float]] = {"without": [], "with_50hz": [], "with_1000hz": []}
            for _ in range(rounds):
                for arm in times:
                    sampler = None
                    if arm != "without":
                        sampler = nvml.PowerSampler(gpu, rate_hz=50.0 if arm == "with_50hz" else 1000.0)
                        sampler.start()
                    times[arm] += [event_ms(step) for _ in range(iterations)]
                    if sampler is not None:
                        sampler.stop()
            wall, events = [], []
            for _ in range(iterations):
                torch.cuda.synchronize()
                t0 = time.perf_counter_ns()
                events.append(event_ms(step))
                torch.cuda.synchronize()
                wall.append((time.perf_counter_ns() - t0) / 1e6)
            medians = {arm: statistics.median(v) for arm, v in times.items()}
            rows.append({"config": label(spec), **{f"median_ms_{k}": v for k, v in medians.items()},
                         "sampler_50hz_ratio": medians["with_50hz"] / medians["without"],
                         "sampler_1000hz_ratio": medians["with_1000hz"] / medians["without"],
                         "event_median_ms": statistics.median(events), "wall_median_ms": statistics.median(wall),
                         "wall_over_event": statistics.median(wall) / statistics.median(events)})
            del model, x, y, optimizer, step
            torch.cuda.empty_cache()
    finally:
        gpu.close()
    return {"rounds": rounds, "iterations_per_round": iterations, "configs": rows}


def _event_timed_ops(model: Any, x: Any, y: Any, spec: dict[str, Any], optimizer: Any, context: Any) -> float:
    """Sum over a step's aten calls of CUDA-event intervals around each call (the replaced design), ms."""
    from torch.utils._python_dispatch import TorchDispatchMode

    total = [0.0]

    class Events(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = func(*args, **(kwargs or {}))
            end.record()
            end.synchronize()
            total[0] += start.elapsed_time(end)
            return out

    step = make_step(model, x, y, spec["mode"], optimizer, context)
    with Events():
        step()
    torch.cuda.synchronize()
    return total[0]


def _kernels_by_name(prof: Any, steps: int) -> dict[str, float]:
    """GPU time per kernel name (ms per step) of a profile: its device events (kernels, memcpy, memset)."""
    out: dict[str, float] = {}
    for event in prof.key_averages():
        if "CUDA" in str(event.device_type):
            out[event.key] = out.get(event.key, 0.0) + event.self_device_time_total / 1e3 / steps
    return out


def check_optimer(out: Path) -> dict[str, Any]:
    """Kernel time per step from the per-op timer against a plain torch.profiler run of the same steps."""
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for cfg in CONFIGS:
        spec = spec_of(*cfg)
        model, x, y, context, optimizer, step = warm(spec)
        e2e = statistics.median(event_ms(step) for _ in range(20))
        steps = 3
        times = time_operators(lambda phase: make_step(model, x, y, spec["mode"], optimizer, context, phase),
                               {"op_timing": {"warmup_steps": 1, "steps": steps}}, CudaKernelClock(DEVICE))
        by_phase: dict[str, float] = {}
        for phase, ms in zip(times.phase, times.time_ms, strict=True):
            by_phase[phase] = by_phase.get(phase, 0.0) + ms / steps
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        kernel_total = sum(_kernels_by_name(prof, steps).values())  # every kernel, memcpy and memset, per step
        timer_total = sum(times.time_ms) / steps
        rows.append({
            "config": label(spec), "e2e_event_median_ms": e2e, "timer_step_ms": times.step_ms,
            "timer_calls_per_step": len(times.op) // steps, "timer_kernel_ms_per_step": timer_total,
            "profiler_kernel_ms_per_step": kernel_total, "timer_over_profiler": timer_total / kernel_total,
            "timer_kernel_ms_by_phase": by_phase, "calls_without_kernel_share":
                sum(1 for t in times.time_ms if t == 0) / max(len(times.time_ms), 1),
            "event_timed_ops_ms_per_step": _event_timed_ops(model, x, y, spec, optimizer, context),
            "message": times.message,
        })
        del model, x, y, optimizer, step
        torch.cuda.empty_cache()
    return {"configs": rows}


def check_kernels(out: Path) -> dict[str, Any]:
    """Inside the per-op timer's own profile: its per-call ranges against every kernel of that profile
    (attribution), and each kernel's time there against a plain profile of the same steps (slowdown)."""
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for cfg in CONFIGS[:2]:
        spec = spec_of(*cfg)
        model, x, y, context, optimizer, step = warm(spec)
        steps = 3
        clock = CudaKernelClock(DEVICE)
        times = time_operators(lambda phase: make_step(model, x, y, spec["mode"], optimizer, context, phase),
                               {"op_timing": {"warmup_steps": 0, "steps": steps}}, clock)
        timed = _kernels_by_name(clock._profile, steps)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        plain = _kernels_by_name(prof, steps)
        names = sorted(set(timed) | set(plain), key=lambda k: -max(timed.get(k, 0), plain.get(k, 0)))
        rows.append({"config": label(spec), "ranges_ms_per_step": sum(times.time_ms) / steps,
                     "timer_profile_kernels_ms_per_step": sum(timed.values()),
                     "plain_profile_kernels_ms_per_step": sum(plain.values()),
                     "kernel_count": [len(timed), len(plain)],
                     "top": [{"kernel": k[:90], "timer_ms": round(timed.get(k, 0), 4), "plain_ms": round(plain.get(k, 0), 4)}
                             for k in names[:12]]})
        del model, x, y, optimizer, step
        torch.cuda.empty_cache()
    return {"configs": rows}


def check_powerlimit(out: Path) -> dict[str, Any]:
    spec = spec_of("torchvision", "resnet50", [3, 128, 128], 64, "training", "amp")
    model, x, y, context, optimizer, step = warm(spec)
    gpu = nvml.open_device(0)
    result: dict[str, Any] = {"config": label(spec)}
    try:
        low, high = gpu.lib.power_limit_constraints_mw(gpu.handle)
        original = gpu.lib.power_limit_mw(gpu.handle)
        limits = sorted({max(low / 1e3, 300.0), high / 1e3})
        result.update(original_w=original / 1e3, range_w=[low / 1e3, high / 1e3], limits_w=limits, windows=[])
        from perfzoo.profiling.cuda import TorchCuda

        with PowerLimitSweep(gpu, limits, repetitions=1, seed=1, device=GPU_DEVICE) as sweep:
            for _, limit_w in sweep:
                read_back = gpu.lib.power_limit_mw(gpu.handle) / 1e3
                iteration = statistics.median(event_ms(step) for _ in range(10))
                window = energy_window(step, gpu, TorchCuda(), DEVICE, 2.0, 50.0, iteration)
                window.pop("sensors")
                result["windows"].append({"limit_w": limit_w, "read_back_w": read_back,
                                          "median_step_ms": iteration, **window})
        result["skipped_reason"] = sweep.skipped_reason
        result["restored_w"] = gpu.lib.power_limit_mw(gpu.handle) / 1e3
        result["restored"] = result["restored_w"] == original / 1e3
    finally:
        gpu.close()
    return result


def check_interference(out: Path, results: Path) -> dict[str, Any]:
    """Three configs profiled by the runner while another process keeps the GPU busy for part of the run."""
    from perfzoo.config import load_config
    from perfzoo.io import read_json
    from perfzoo.models.zoo import expand_zoo, manifest_frame
    from perfzoo.profiling.runner import profile_shard_with_ops, worker_settings

    config = load_config(GPU_CONFIG)  # schema defaults filled in, as the workflow has them
    device_cfg = config["devices"][GPU_DEVICE]
    configs = manifest_frame(expand_zoo(config))
    configs = configs[configs["precision"] == "amp"].head(3).reset_index(drop=True)
    settings = {**worker_settings(config["profiling"], device_cfg, config["zoo"]["num_classes"]), "repeat_every": 1000,
                "interference": {**config["profiling"]["interference"], "retries": 1, "wait_s": 1.0},
                "op_timing": {"steps": 0}}
    hog = subprocess.Popen([sys.executable, "-c", (
        "import torch, time\n"
        "a = torch.randn(8192, 8192, device='cuda')\n"
        "t = time.time()\n"
        "while time.time() - t < 14:\n"
        "    a @ a; torch.cuda.synchronize()\n")])
    time.sleep(4)  # the competitor holds its context before the first config is measured
    journal = out / "interference.journal.jsonl"
    journal.unlink(missing_ok=True)
    try:
        result = profile_shard_with_ops(configs, GPU_DEVICE, device_cfg, settings, journal, progress=False,
                                        hardware=read_json(results / "hardware" / f"{GPU_DEVICE}.json"))
    finally:
        hog.kill()
        hog.wait()
    traces = result.traces
    per_config = (traces.groupby(["config_id", "repeat"], sort=False)
                  .agg(mode=("mode", "first"), median_ms=("time_ms", "median"), interference=("interference", "first"),
                       attempts=("attempts", "first"), probe_ratio=("probe_ratio", "first")).reset_index())
    entries = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()] if journal.exists() else []
    return {"competitor_pid": hog.pid, "configs": per_config.to_dict("records"),
            "journal_entries": [{k: e.get(k) for k in ("key", "status", "assessment", "attempts", "gpu_reasons")}
                                for e in entries],
            "meta_interference": result.meta.get("interference")}


CHECKS = {"env": check_env, "overhead": check_overhead, "optimer": check_optimer, "kernels": check_kernels,
          "powerlimit": check_powerlimit}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    names = argv[1:]
    failed = 0
    while names:
        name = names.pop(0)
        started = time.time()
        try:
            if name == "interference":
                result = check_interference(out, Path(names.pop(0)))
            else:
                result = CHECKS[name](out)
            result = {"ok": True, **result}
        except Exception:  # noqa: BLE001 - one check's failure must not lose the others
            failed += 1
            result = {"ok": False, "error": traceback.format_exc()}
        result["seconds"] = round(time.time() - started, 1)
        text = json.dumps(result, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v)
                          else str(v))
        (out / f"{name}.json").write_text(text)
        print(f"== {name} ({result['seconds']} s)\n{text[:6000]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
