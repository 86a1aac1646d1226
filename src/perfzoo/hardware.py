"""Hardware stage: who the device is, and what it can do (measured microbenchmarks + specs)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

from perfzoo.io import InputError

NO_ENERGY_SENSOR = "no energy sensor read on kind 'cpu' (RAPL is not used)"


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def total_memory_gb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3


def check_device(device: str, device_cfg: dict[str, Any]) -> dict[str, Any]:
    """Identify the hardware this job landed on; fail loudly if it is not what ``device`` declares."""
    kind = device_cfg["kind"]
    if kind == "cpu":
        return {"kind": "cpu", "cpu_model": cpu_model_name(), "logical_cpus": os.cpu_count(),
                "affinity_cpus": len(os.sched_getaffinity(0))}
    raise InputError(f"device {device}: kind {kind!r} is not supported on this node")


def _best_seconds(fn: Any, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_gemm_gflops(threads: int, n: int = 1024, repeats: int = 5) -> float:
    """Float32 matrix-multiply rate with ``threads`` intra-op threads (best of ``repeats``)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _best_seconds(lambda: torch.mm(a, b), repeats) / 1e9


def measure_copy_gbs(threads: int, megabytes: int = 256, repeats: int = 5) -> float:
    """Memory-copy bandwidth (bytes read + written per second) of a large tensor copy."""
    import torch

    torch.set_num_threads(threads)
    src = torch.ones(megabytes * 1024 * 1024 // 4)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src), repeats) / 1e9


def cpu_hardware(device: str, device_cfg: dict[str, Any]) -> dict[str, Any]:
    """Hardware description of a cpu device, with measured GEMM and copy rates."""
    threads = int(device_cfg.get("threads", 1))
    return {
        "device": device,
        "kind": "cpu",
        "name": cpu_model_name(),
        "cores_used": threads,
        "logical_cpus": os.cpu_count(),
        "memory_gb": round(total_memory_gb(), 2),
        "measured_gemm_gflops_fp32": measure_gemm_gflops(threads),
        "measured_copy_gbs": measure_copy_gbs(threads),
        "energy_sensor": None,
        "energy_missing_reason": NO_ENERGY_SENSOR,
    }


def describe_device(device: str, device_cfg: dict[str, Any]) -> dict[str, Any]:
    check_device(device, device_cfg)
    return cpu_hardware(device, device_cfg)


def hardware_features(hw: dict[str, Any]) -> dict[str, float]:
    """The numeric ``hw_*`` feature columns joined onto every dataset row of the device."""
    return {
        "hw_peak_gflops": float(hw["measured_gemm_gflops_fp32"]),
        "hw_mem_bw_gbs": float(hw["measured_copy_gbs"]),
        "hw_cores": float(hw.get("cores_used", 0) or hw.get("sm_count", 0)),
        "hw_mem_gb": float(hw["memory_gb"]),
    }
