"""The hardware rule's measurements: check that a job landed on the device its entry declares (cpu, or a
cuda GPU seen by NVML and CUDA with the configured name), measure its GEMM and copy rates, and assemble
the ``results/hardware/<device>.json`` record around perfzoo.hardware's description."""

from __future__ import annotations

import math
import os
import platform
import socket
import sys
import time
from typing import Any

from perfzoo.hardware import (
    NO_ENERGY_SENSOR,
    MeasurementSetting,
    cost_fields,
    cpu_model_name,
    mig_profile_rows,
    spec_row,
    total_memory_gb,
)
from perfzoo.io import InputError
from perfzoo.profiling import cuda, nvml
from perfzoo.profiling.call_costs import call_costs
from perfzoo.profiling.interference import probe_baseline
from perfzoo.profiling.reference import memory_reference
from perfzoo.profiling.temporaries import depthwise_temporary


def check_device(
    device: str, device_cfg: dict[str, Any], *, nvml_lib: Any | None = None, backend: Any | None = None,
) -> dict[str, Any]:
    """Identify the hardware this job landed on; fail loudly if it is not what ``device`` declares, or if the
    machine is not Linux (the measurement reads Linux's process interfaces).

    ``nvml_lib`` and ``backend`` substitute the NVML and CUDA boundaries (kind cuda; tests).
    """
    kind = device_cfg["kind"]
    if not sys.platform.startswith("linux"):
        raise InputError(f"device {device}: measuring needs Linux (the worker's memory from /proc/self/status, its "
                         f"CPUs from sched_getaffinity) and this machine runs {platform.system()}; profile on a Linux "
                         "machine, or import measurements (the config's external: key)")
    if kind == "cpu":
        return {"kind": "cpu", "cpu_model": cpu_model_name(), "logical_cpus": os.cpu_count(),
                "affinity_cpus": len(os.sched_getaffinity(0))}
    if kind == "cuda":
        return check_cuda_device(device, device_cfg, nvml_lib=nvml_lib, backend=backend)
    raise InputError(f"device {device}: kind {kind!r} is not supported on this node")


def check_cuda_device(
    device: str, device_cfg: dict[str, Any], *, nvml_lib: Any | None = None, backend: Any | None = None,
) -> dict[str, Any]:
    """Identity of the GPU of a cuda device, after checking that NVML and CUDA see it and its name matches.

    Raises InputError (one line naming the device, its configured gpu_name and the host) when NVML or
    CUDA is unavailable, and naming both names when the GPU is not the configured one. The returned
    identity (GPU name, UUID, driver, CUDA and torch versions, power-limit range, the NVML index matched
    to the CUDA device by UUID) goes into the run metadata.
    """
    host = socket.gethostname()
    gpu_name = device_cfg.get("gpu_name") or ""
    index = int(device_cfg.get("gpu_index", 0))

    def unavailable(reason: str) -> InputError:
        text = " ".join(reason.split())
        return InputError(f"device '{device}' (kind cuda, gpu_name '{gpu_name}', gpu_index {index}) "
                          f"cannot be profiled on host '{host}': {text}")

    if not gpu_name:
        raise InputError(f"device '{device}': kind cuda needs 'gpu_name' in its config entry")
    if nvml_lib is None:
        ok, reason = nvml.nvml_available()
        if not ok:
            raise unavailable(reason)
    facts = cuda.cuda_facts(index, backend)
    if not facts.get("available"):
        raise unavailable(f"CUDA is unavailable: {facts.get('reason', 'unknown reason')}")
    try:
        probe = nvml.open_device(0, lib=nvml_lib)
    except (ImportError, nvml.NvmlError) as exc:
        raise unavailable(f"NVML could not be opened: {exc}") from None
    try:
        nvml_index, how = cuda.nvml_index_for(probe.lib, facts.get("uuid"), index)
        gpu = nvml.GpuHandle(lib=probe.lib, handle=probe.lib.handle(nvml_index), index=nvml_index)
        identity = nvml.device_identity(gpu)
        counter_mj, counter_reason = nvml.read_energy_counter_mj(gpu)
        identity["energy_counter_supported"] = math.isfinite(counter_mj)
        if counter_reason:
            identity["missing"]["energy_counter"] = counter_reason
    except nvml.NvmlError as exc:
        raise unavailable(f"NVML could not read GPU {index}: {exc}") from None
    finally:
        probe.close()
    names = [n for n in (facts.get("name"), identity.get("name")) if n]  # what runs the model, what is read
    if not names:
        raise unavailable("neither NVML nor CUDA reports the GPU's name")
    for actual in names:
        nvml.check_gpu_name(str(actual), gpu_name, device)
    identity.update(
        kind="cuda", host=host, gpu_index=index, nvml_index=nvml_index, nvml_index_source=how,
        gpu_name_pattern=gpu_name, cuda_device_name=facts.get("name"), cuda_uuid=facts.get("uuid"),
        compute_capability=facts.get("compute_capability"), sm_count=facts.get("sm_count"),
        cuda_total_memory_mb=facts.get("total_memory_mb"), torch_version=facts.get("torch_version"),
        torch_cuda_version=facts.get("torch_cuda_version"), cudnn_version=facts.get("cudnn_version"),
        cuda_visible_devices=facts.get("cuda_visible_devices"),
    )
    return identity


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
    import torch  # lazy: ~3 s import; the profiling parent only checks the device

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _best_seconds(lambda: torch.mm(a, b), repeats) / 1e9


def measure_copy_gbs(threads: int, megabytes: int = 256, repeats: int = 5) -> float:
    """Memory-copy bandwidth (bytes read + written per second) of a large tensor copy."""
    import torch  # lazy: ~3 s import; the profiling parent only checks the device

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
        "probe_baseline": probe_baseline("cpu", threads),
        "memory_reference": memory_reference("cpu", threads),
        "depthwise_temporary": depthwise_temporary("cpu", threads),
        "call_costs": call_costs("cpu", threads),
        "measurement_setting": MeasurementSetting.of(device_cfg).as_dict(),
        "energy_sensor": None,
        "energy_missing_reason": NO_ENERGY_SENSOR,
    }




def cuda_hardware(
    device: str, device_cfg: dict[str, Any], *, nvml_lib: Any | None = None, backend: Any | None = None,
    gemm_n: int = 8192, copy_mb: int = 1024, repeats: int = 10,
) -> dict[str, Any]:
    """Hardware description of a cuda device: spec-table row, measured GEMM TFLOP/s per dtype (CUDA events),
    device-to-device copy GB/s, memory, SM count, MIG profiles, identity."""
    identity = check_device(device, device_cfg, nvml_lib=nvml_lib, backend=backend)
    index = int(device_cfg.get("gpu_index", 0))
    if backend is not None:
        backend.set_device(index)
    else:
        import torch  # lazy: ~3 s import; the profiling parent only checks the device

        torch.cuda.set_device(index)
    name = identity.get("name") or identity.get("cuda_device_name") or ""
    spec, spec_reason = spec_row(device, device_cfg, name)
    support = cuda.gemm_support(identity)
    tflops = {dt: None if why else cuda.measure_gemm_tflops(dt, index, backend, n=gemm_n, repeats=repeats)
              for dt, why in support.items()}
    memory_mb = identity.get("memory_total_mb") or identity.get("cuda_total_memory_mb")
    mig, mig_reason = mig_profile_rows(name)
    if not mig and spec:
        mig, mig_reason = mig_profile_rows(spec["name"])
    return {
        "device": device,
        "kind": "cuda",
        "name": name,
        "identity": identity,
        "memory_gb": round(float(memory_mb) / 1024, 2) if memory_mb else None,
        "sm_count": identity.get("sm_count"),
        "compute_capability": identity.get("compute_capability"),
        "measured_gemm_tflops": tflops,
        "gemm_unsupported": {dt: why for dt, why in support.items() if why},
        "gemm_n": gemm_n,
        "measured_gemm_gflops_fp32": tflops["fp32"] * 1000.0,
        "measured_copy_gbs": cuda.measure_copy_gbs(index, backend, megabytes=copy_mb, repeats=repeats),
        "probe_baseline": (probe_baseline("cuda", int(device_cfg.get("threads", 1)), index) if backend is None
                           else {"missing": "the CUDA boundary is substituted: no probe on a real GPU"}),
        "memory_reference": memory_reference("cuda", int(device_cfg.get("threads", 1))),
        "depthwise_temporary": depthwise_temporary("cuda", int(device_cfg.get("threads", 1))),
        "call_costs": call_costs("cuda", int(device_cfg.get("threads", 1))),
        "measurement_setting": MeasurementSetting.of(device_cfg).as_dict(),
        "spec": spec,
        "spec_missing_reason": spec_reason,
        "mig_profiles": mig,
        "mig_missing_reason": mig_reason,
        "mig_mode": identity.get("mig_mode"),
        "power_limit_min_w": identity.get("power_limit_min_w"),
        "power_limit_max_w": identity.get("power_limit_max_w"),
        "power_limit_w": identity.get("power_limit_w"),
        "energy_sensor": "nvml",
        "energy_counter_supported": identity.get("energy_counter_supported", False),
        "energy_missing_reason": None,
        **cost_fields(device_cfg),
    }


def describe_device(
    device: str, device_cfg: dict[str, Any], *, nvml_lib: Any | None = None, backend: Any | None = None,
) -> dict[str, Any]:
    """The ``hardware/{device}.json`` record (cpu: measured GEMM and copy; cuda: :func:`cuda_hardware`)."""
    if device_cfg["kind"] == "cuda":
        return cuda_hardware(device, device_cfg, nvml_lib=nvml_lib, backend=backend)
    check_device(device, device_cfg)
    return {**cpu_hardware(device, device_cfg), **cost_fields(device_cfg)}
