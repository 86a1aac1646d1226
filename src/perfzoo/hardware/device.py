"""Device description without measuring: host facts, spec-table row, MIG profiles, cost fields, and the
``hw_*`` feature columns and measured calibration columns read from a device's hardware record (measurements:
perfzoo.profiling.microbench)."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from perfzoo.hardware.mig import mig_profiles
from perfzoo.hardware.specs import lookup_gpu
from perfzoo.io import InputError

DEPTHWISE_TEMPORARY_FACTOR = "device_cl_depthwise_temporary_factor"
CALL_COST_KINDS = ("elementwise", "matmul", "conv", "conv_grouped", "norm", "pool", "softmax", "reduction", "copy",
                   "embedding", "attention", "optimizer")
"""Operator kinds (of :data:`perfzoo.features.op_kinds.COSTED_KINDS`) whose tiny call the hardware rule times
(:mod:`perfzoo.profiling.call_costs`): the device's price of a call when its bytes and FLOPs are next to nothing."""
CALL_COST_COLUMNS = {kind: f"device_call_us_{kind}" for kind in CALL_COST_KINDS}
"""Per kind of :data:`CALL_COST_KINDS`, the column of a device's rows holding its measured tiny call (µs)."""
CALIBRATION_COLUMNS = (DEPTHWISE_TEMPORARY_FACTOR, *CALL_COST_COLUMNS.values())
"""Device constants measured by the hardware rule that a regressor applies as they are (not features every
regressor sees): :func:`hardware_calibration`."""
NO_ENERGY_SENSOR = "no energy sensor read on kind 'cpu' (RAPL is not used)"
DEFAULT_CARBON_INTENSITY_G_PER_KWH = 400.0


@dataclass(frozen=True)
class MeasurementSetting:
    """The settings that change what is measured on a device: part of the device's identity, recorded in
    its hardware record and its traces' metadata. One device is measured with one setting."""

    threads: int

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> MeasurementSetting:
        """The setting of a device entry or of profiling settings (``threads``, default 1)."""
        return cls(threads=int(settings.get("threads", 1)))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check_same(self, device: str, recorded: Mapping[str, Any] | None, where: str) -> None:
        """Raise a one-line InputError when ``recorded`` (the setting ``where`` was measured with) differs."""
        if recorded is None:
            raise InputError(f"device '{device}': {where} records no measurement setting (made by an older "
                             f"perfzoo); measure the device's hardware again")
        for key, value in self.as_dict().items():
            if recorded.get(key) != value:
                raise InputError(f"device '{device}': {key} is {value} in this run but {recorded.get(key)} "
                                 f"in {where}; measure with {key}={recorded.get(key)}, or afresh (hardware "
                                 f"included), or as a separate device")


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


def cost_fields(device_cfg: dict[str, Any]) -> dict[str, Any]:
    """Carbon intensity (configured or the default) and price per hour of a device entry."""
    return {
        "carbon_intensity_g_per_kwh": float(device_cfg.get("carbon_intensity_g_per_kwh",
                                                           DEFAULT_CARBON_INTENSITY_G_PER_KWH)),
        "price_per_hour": device_cfg.get("price_per_hour"),
    }


def spec_row(device: str, device_cfg: dict[str, Any], nvml_name: str) -> tuple[dict[str, Any] | None, str]:
    """Spec-table row from the configured ``spec`` (must exist) or the NVML name (missing with a reason)."""
    configured = device_cfg.get("spec")
    try:
        return lookup_gpu(configured or nvml_name), ""
    except InputError as exc:
        if configured:
            raise InputError(f"device '{device}': spec '{configured}': {exc}") from None
        return None, str(exc)


def mig_profile_rows(name: str) -> tuple[list[dict[str, Any]], str]:
    """MIG profiles of a GPU as plain dicts, or ([], why there are none)."""
    try:
        return [asdict(p) for p in mig_profiles(name)], ""
    except InputError as exc:
        return [], str(exc)


def hardware_features(hw: dict[str, Any]) -> dict[str, float]:
    """The numeric ``hw_*`` feature columns joined onto every dataset row of the device.

    cpu: measured fp32 GEMM, measured copy, cores used, memory; cuda: measured fp32 GEMM (CUDA events),
    measured device-to-device copy, SM count, GPU memory.
    """
    cores = hw.get("cores_used") if hw.get("kind", "cpu") == "cpu" else hw.get("sm_count")
    return {
        "hw_peak_gflops": float(hw["measured_gemm_gflops_fp32"]),
        "hw_mem_bw_gbs": float(hw["measured_copy_gbs"]),
        "hw_cores": float(cores or hw.get("cores_used", 0) or hw.get("sm_count", 0) or 0),
        "hw_mem_gb": float(hw["memory_gb"]),
    }


def hardware_calibration(hw: Mapping[str, Any]) -> dict[str, float]:
    """The :data:`CALIBRATION_COLUMNS` of a device's rows: the bytes oneDNN's backward-weights pass of a
    channels-last depthwise convolution allocates per weight byte (``depthwise_temporary.factor`` of the record,
    :mod:`perfzoo.profiling.temporaries`) and the µs of a tiny call of each kind of :data:`CALL_COST_KINDS`
    (``call_costs.us``, :mod:`perfzoo.profiling.call_costs`); NaN where the record has no measurement (a GPU, an
    imported row, a record written before the measurement existed)."""
    factor = (hw.get("depthwise_temporary") or {}).get("factor")
    calls = (hw.get("call_costs") or {}).get("us") or {}
    return {DEPTHWISE_TEMPORARY_FACTOR: _measured(factor),
            **{column: _measured(calls.get(kind)) for kind, column in CALL_COST_COLUMNS.items()}}


def _measured(value: Any) -> float:
    """A measured number as a float; NaN for anything else (not measured)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
