"""NVML layer: device identity, a power/sensor sampler thread, the energy counter, the GPU's state before a
window (power-limit sweeps: :mod:`perfzoo.profiling.power_limits`).

Every NVML call goes through one small class, :class:`NvmlLibrary` (the library boundary), so that
tests and machines without a GPU can substitute an object with the same methods. pynvml errors are
translated at that boundary into :class:`NvmlError` and its subclasses :class:`NvmlNotSupported` and
:class:`NvmlNoPermission`; nothing above it sees pynvml types.

Units at the boundary are NVML's own (mW, mJ, MHz, °C, %); the sampler converts power to W and memory
to MiB (reported as ``mem_used_mb``). A sensor value that cannot be read is NaN with the reason
recorded, never 0.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self

import pandas as pd

from perfzoo.io import InputError

log = logging.getLogger(__name__)

SENSOR_COLUMNS: tuple[str, ...] = (
    "t_ns",
    "power_w",
    "gpu_util",
    "mem_util",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temp_c",
    "mem_used_mb",
    "power_limit_w",
)
"""Columns of a sensor-sample table, in order (the ``traces/{device}/{shard}.sensors`` contract)."""

MIB = 1024 * 1024


# --------------------------------------------------------------------------------------------------
# Library boundary
# --------------------------------------------------------------------------------------------------


class NvmlError(RuntimeError):
    """An NVML call failed."""


class NvmlNotSupported(NvmlError):
    """The device or driver does not support this NVML call."""


class NvmlNoPermission(NvmlError):
    """The caller lacks the privilege for this NVML call (e.g. setting a power limit)."""


class NvmlLibrary:
    """The library boundary: the only code that calls pynvml.

    A fake for tests implements the same public methods and raises the :class:`NvmlError` family.
    """

    def __init__(self, module: Any | None = None) -> None:
        if module is None:
            import pynvml as module  # lazy: optional package, absent where there is no NVIDIA driver
        self._nvml = module

    # -- plumbing --------------------------------------------------------------------------------
    def _translate(self, call: str, exc: Exception) -> NvmlError:
        nv = self._nvml
        code = getattr(exc, "value", None)
        message = f"{call}: {exc}"
        if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", object()):
            return NvmlNoPermission(message)
        unsupported = {
            getattr(nv, "NVML_ERROR_NOT_SUPPORTED", None),
            getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", None),
        }
        if code in unsupported - {None}:
            return NvmlNotSupported(message)
        return NvmlError(message)

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, name)(*args)
        except self._nvml.NVMLError as exc:
            raise self._translate(name, exc) from exc

    # -- session ---------------------------------------------------------------------------------
    def init(self) -> None:
        self._call("nvmlInit")

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def handle(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    # -- identity --------------------------------------------------------------------------------
    def name(self, handle: Any) -> str:
        return str(self._call("nvmlDeviceGetName", handle))

    def uuid(self, handle: Any) -> str:
        return str(self._call("nvmlDeviceGetUUID", handle))

    def driver_version(self) -> str:
        return str(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> int:
        """CUDA driver API version as NVML encodes it (1000 * major + 10 * minor)."""
        return int(self._call("nvmlSystemGetCudaDriverVersion"))

    # -- power -----------------------------------------------------------------------------------
    def power_limit_constraints_mw(self, handle: Any) -> tuple[int, int]:
        low, high = self._call("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return int(low), int(high)

    def power_limit_mw(self, handle: Any) -> int:
        return int(self._call("nvmlDeviceGetPowerManagementLimit", handle))

    def set_power_limit_mw(self, handle: Any, limit_mw: int) -> None:
        self._call("nvmlDeviceSetPowerManagementLimit", handle, int(limit_mw))

    def power_average_mw(self, handle: Any) -> float:
        """``nvmlDeviceGetPowerUsage``: 1 s average on Ampere (but GA100) and newer, instantaneous before."""
        return float(self._call("nvmlDeviceGetPowerUsage", handle))

    def power_instant_mw(self, handle: Any) -> float:
        """Instantaneous power from the ``NVML_FI_DEV_POWER_INSTANT`` field (newer drivers)."""
        nv = self._nvml
        field_id = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
        if field_id is None:
            raise NvmlNotSupported("NVML_FI_DEV_POWER_INSTANT: not defined by this pynvml")
        (value,) = self._call("nvmlDeviceGetFieldValues", handle, [field_id])
        if value.nvmlReturn != nv.NVML_SUCCESS:
            raise self._translate(
                "nvmlDeviceGetFieldValues(NVML_FI_DEV_POWER_INSTANT)", nv.NVMLError(value.nvmlReturn)
            )
        return float(self._field_value(value))

    def _field_value(self, value: Any) -> float:
        nv = self._nvml
        member = {
            nv.NVML_VALUE_TYPE_DOUBLE: "dVal",
            nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            nv.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        }.get(value.valueType, "uiVal")
        return float(getattr(value.value, member))

    def total_energy_mj(self, handle: Any) -> int:
        """``nvmlDeviceGetTotalEnergyConsumption``: mJ since the driver was loaded (Volta and newer)."""
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption", handle))

    # -- other sensors ---------------------------------------------------------------------------
    def utilization(self, handle: Any) -> tuple[float, float]:
        rates = self._call("nvmlDeviceGetUtilizationRates", handle)
        return float(rates.gpu), float(rates.memory)

    def clock_mhz(self, handle: Any, which: str) -> float:
        kind = {"sm": self._nvml.NVML_CLOCK_SM, "mem": self._nvml.NVML_CLOCK_MEM}[which]
        return float(self._call("nvmlDeviceGetClockInfo", handle, kind))

    def temperature_c(self, handle: Any) -> float:
        return float(self._call("nvmlDeviceGetTemperature", handle, self._nvml.NVML_TEMPERATURE_GPU))

    def memory_mib(self, handle: Any) -> tuple[float, float]:
        """(total, used) device memory in MiB."""
        info = self._call("nvmlDeviceGetMemoryInfo", handle)
        return info.total / MIB, info.used / MIB

    def compute_pids(self, handle: Any) -> list[int]:
        """Process ids of the compute processes running on the GPU."""
        return [int(p.pid) for p in self._call("nvmlDeviceGetComputeRunningProcesses", handle)]

    def throttle_reasons(self, handle: Any) -> int:
        """Bitmask of the reasons the clocks are held down now (``nvmlClocksThrottleReason*``)."""
        return int(self._call("nvmlDeviceGetCurrentClocksThrottleReasons", handle))

    def mig_mode(self, handle: Any) -> tuple[int, int]:
        """(current, pending) MIG mode: 1 enabled, 0 disabled; NvmlNotSupported on a GPU without MIG."""
        current, pending = self._call("nvmlDeviceGetMigMode", handle)
        return int(current), int(pending)


@dataclass
class GpuHandle:
    """An opened device: the library boundary object, NVML's handle and the device index."""

    lib: Any
    handle: Any
    index: int

    def close(self) -> None:
        """Release this process's NVML session (NVML reference-counts init/shutdown)."""
        try:
            self.lib.shutdown()
        except NvmlError as exc:
            log.warning("NVML shutdown failed: %s", exc)


def open_device(index: int = 0, lib: Any | None = None) -> GpuHandle:
    """Initialise NVML and open device ``index``; ``lib`` substitutes the library boundary."""
    lib = lib if lib is not None else NvmlLibrary()
    lib.init()
    try:
        return GpuHandle(lib=lib, handle=lib.handle(index), index=index)
    except NvmlError:
        lib.shutdown()
        raise


def nvml_available() -> tuple[bool, str]:
    """Whether NVML can be used here; the reason string says why not (empty when available)."""
    try:
        lib = NvmlLibrary()
    except ImportError as exc:
        return False, f"pynvml (nvidia-ml-py) is not installed: {exc}"
    try:
        lib.init()
    except NvmlError as exc:
        return False, f"NVML could not be initialised (no NVIDIA driver?): {exc}"
    try:
        count = lib.device_count()
    except NvmlError as exc:
        return False, f"NVML device count failed: {exc}"
    finally:
        with contextlib.suppress(NvmlError):
            lib.shutdown()
    return (True, "") if count > 0 else (False, "NVML reports no GPU")


# --------------------------------------------------------------------------------------------------
# Identity
# --------------------------------------------------------------------------------------------------


def _cuda_version_string(encoded: int) -> str:
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


MIG_MODES = {0: "disabled", 1: "enabled"}
"""NVML's MIG mode values (``nvmlDeviceGetMigMode``) as the hardware record writes them."""


def _mig_mode_name(lib: Any, handle: Any) -> str:
    """The GPU's current MIG mode by name; NvmlError for a value NVML does not document (a missing fact, named)."""
    current = lib.mig_mode(handle)[0]
    if current not in MIG_MODES:
        raise NvmlError(f"nvmlDeviceGetMigMode: undocumented mode {current}")
    return MIG_MODES[current]


def device_identity(gpu: GpuHandle) -> dict[str, Any]:
    """Name, UUID, driver, CUDA driver version, memory, power-limit facts and MIG mode (``mig_mode``:
    enabled / disabled now; None with its reason on a GPU without MIG) of ``gpu``.

    A fact NVML cannot give is None, with its reason under ``missing``.
    """
    lib, h = gpu.lib, gpu.handle
    readers: dict[str, Callable[[], Any]] = {
        "name": lambda: lib.name(h),
        "uuid": lambda: lib.uuid(h),
        "driver_version": lib.driver_version,
        "cuda_driver_version": lambda: _cuda_version_string(lib.cuda_driver_version()),
        "memory_total_mb": lambda: lib.memory_mib(h)[0],
        "power_limit_min_w": lambda: lib.power_limit_constraints_mw(h)[0] / 1000.0,
        "power_limit_max_w": lambda: lib.power_limit_constraints_mw(h)[1] / 1000.0,
        "power_limit_w": lambda: lib.power_limit_mw(h) / 1000.0,
        "mig_mode": lambda: _mig_mode_name(lib, h),
    }
    identity: dict[str, Any] = {"index": gpu.index}
    missing: dict[str, str] = {}
    for key, read in readers.items():
        try:
            identity[key] = read()
        except NvmlError as exc:
            identity[key] = None
            missing[key] = str(exc)
    identity["missing"] = missing
    return identity


def check_gpu_name(actual: str, pattern: str, device: str) -> None:
    """Fail loudly unless the GPU name ``actual`` matches the configured ``pattern``.

    ``pattern`` is a case-insensitive regular expression, or a plain substring.
    """
    found = pattern.lower() in actual.lower()
    if not found:
        try:
            found = re.search(pattern, actual, flags=re.IGNORECASE) is not None
        except re.error:
            found = False
    if not found:
        raise InputError(
            f"device '{device}': the config expects a GPU matching '{pattern}', but this job got '{actual}'"
        )


# --------------------------------------------------------------------------------------------------
# Sampler
# --------------------------------------------------------------------------------------------------


class PowerSampler:
    """Background thread sampling power and other sensors of one GPU at ``rate_hz``.

    Power comes from the instantaneous field (``power_source == "instant"``) where the device supports
    it, else from ``nvmlDeviceGetPowerUsage`` (``"average"``); the choice is made once at start so a
    series never mixes the two. A failed read gives NaN for that value and is counted and recorded in
    ``errors``; a sensor the device does not support is NaN throughout, its reason in ``unsupported``.
    """

    def __init__(
        self,
        gpu: GpuHandle,
        rate_hz: float = 50.0,
        clock: Callable[[], int] = time.perf_counter_ns,
        max_error_messages: int = 50,
    ) -> None:
        if not (rate_hz > 0 and math.isfinite(rate_hz)):
            raise InputError(f"PowerSampler: rate_hz must be a positive number, got {rate_hz!r}")
        self.gpu = gpu
        self.rate_hz = float(rate_hz)
        self._clock = clock
        self._max_error_messages = max_error_messages
        self._rows: list[tuple[float, ...]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.power_source: str | None = None
        self.power_source_reason = ""
        self.error_count = 0
        self.errors: list[str] = []
        self.unsupported: dict[str, str] = {}

    # -- reading ---------------------------------------------------------------------------------
    def _probe_power_source(self) -> None:
        try:
            self.gpu.lib.power_instant_mw(self.gpu.handle)
        except NvmlError as exc:
            self.power_source, self.power_source_reason = "average", f"instant power unavailable: {exc}"
        else:
            self.power_source, self.power_source_reason = "instant", ""

    def _record_error(self, t_ns: int, what: str, exc: Exception) -> None:
        with self._lock:
            self.error_count += 1
            if len(self.errors) < self._max_error_messages:
                self.errors.append(f"t_ns={t_ns} {what}: {type(exc).__name__}: {exc}")

    def _read(self, t_ns: int, what: str, read: Callable[[], Any]) -> Any:
        if what in self.unsupported:
            return None
        try:
            return read()
        except NvmlNotSupported as exc:  # permanent (e.g. utilization on a MIG slice): say so once
            self.unsupported[what] = str(exc)
        except Exception as exc:  # a sensor failure must never stop the run
            self._record_error(t_ns, what, exc)
        return None

    def sample_once(self) -> dict[str, float]:
        """Read every sensor once and store the row; unreadable values are NaN."""
        if self.power_source is None:
            self._probe_power_source()
        lib, h, nan = self.gpu.lib, self.gpu.handle, float("nan")
        t_ns = self._clock()
        power_read = lib.power_instant_mw if self.power_source == "instant" else lib.power_average_mw
        power_mw = self._read(t_ns, f"power ({self.power_source})", lambda: power_read(h))
        util = self._read(t_ns, "utilization", lambda: lib.utilization(h)) or (nan, nan)
        memory = self._read(t_ns, "memory", lambda: lib.memory_mib(h)) or (nan, nan)
        limit_mw = self._read(t_ns, "power limit", lambda: lib.power_limit_mw(h))
        row = {
            "t_ns": t_ns,
            "power_w": nan if power_mw is None else power_mw / 1000.0,
            "gpu_util": util[0],
            "mem_util": util[1],
            "sm_clock_mhz": _or_nan(self._read(t_ns, "sm clock", lambda: lib.clock_mhz(h, "sm"))),
            "mem_clock_mhz": _or_nan(self._read(t_ns, "mem clock", lambda: lib.clock_mhz(h, "mem"))),
            "temp_c": _or_nan(self._read(t_ns, "temperature", lambda: lib.temperature_c(h))),
            "mem_used_mb": memory[1],
            "power_limit_w": nan if limit_mw is None else limit_mw / 1000.0,
        }
        with self._lock:
            self._rows.append(tuple(row[c] for c in SENSOR_COLUMNS))
        return row

    # -- thread ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        period_ns = int(1e9 / self.rate_hz)
        deadline = self._clock()
        while not self._stop.is_set():
            self.sample_once()
            deadline += period_ns
            now = self._clock()
            deadline = max(deadline, now)  # fell behind: skip missed slots rather than burst
            self._stop.wait((deadline - now) / 1e9)

    def start(self) -> PowerSampler:
        """Start sampling in a daemon thread (the first sample is taken at once)."""
        if self._thread is not None:
            raise RuntimeError("PowerSampler already started")
        self._probe_power_source()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="perfzoo-power-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> pd.DataFrame:
        """Stop the thread, take a closing sample (so the window is bracketed) and return all samples."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample_once()
        return self.samples()

    def samples(self) -> pd.DataFrame:
        """Samples so far, one row each, columns :data:`SENSOR_COLUMNS`."""
        with self._lock:
            rows = list(self._rows)
        frame = pd.DataFrame(rows, columns=list(SENSOR_COLUMNS))
        frame["t_ns"] = frame["t_ns"].astype("int64")
        for column in SENSOR_COLUMNS[1:]:
            frame[column] = frame[column].astype("float64")
        return frame

    def summary(self) -> dict[str, Any]:
        """Power source, sample count, target and achieved rate, and read errors."""
        frame = self.samples()
        span_s = (frame["t_ns"].iloc[-1] - frame["t_ns"].iloc[0]) / 1e9 if len(frame) > 1 else float("nan")
        return {
            "power_source": self.power_source,
            "power_source_reason": self.power_source_reason,
            "n_samples": len(frame),
            "rate_hz_target": self.rate_hz,
            "rate_hz_achieved": (len(frame) - 1) / span_s if span_s and span_s > 0 else float("nan"),
            "error_count": self.error_count,
            "errors": list(self.errors),
            "unsupported": dict(self.unsupported),
        }

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _or_nan(value: Any) -> float:
    return float("nan") if value is None else float(value)


# --------------------------------------------------------------------------------------------------
# Energy counter
# --------------------------------------------------------------------------------------------------


def read_energy_counter_mj(gpu: GpuHandle) -> tuple[float, str]:
    """The total-energy counter in mJ and an empty reason, or (NaN, reason) where unsupported."""
    try:
        return float(gpu.lib.total_energy_mj(gpu.handle)), ""
    except NvmlError as exc:
        return float("nan"), f"energy counter unavailable: {exc}"


# --------------------------------------------------------------------------------------------------
# Cool-down
# --------------------------------------------------------------------------------------------------


def cooldown(
    gpu: GpuHandle | None = None,
    band_c: tuple[float, float] | float | None = None,
    timeout_s: float = 120.0,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Free cached GPU memory and garbage, then optionally wait until the temperature is within a band.

    ``band_c`` is ``(low, high)`` in °C, or a single upper bound. Returns the wait, the last temperature,
    whether it ended within the band (None when no band was asked for) and a reason when it did not.
    """
    torch = sys.modules.get("torch")  # only when the caller already uses torch: importing it is slow
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    gc.collect()
    result: dict[str, Any] = {"waited_s": 0.0, "temp_c": float("nan"), "within_band": None, "reason": ""}
    if band_c is None:
        return result
    if gpu is None:
        result.update(within_band=False, reason="no GPU handle to read the temperature from")
        return result
    low, high = (-math.inf, float(band_c)) if isinstance(band_c, int | float) else map(float, band_c)
    start = clock()
    while True:
        try:
            temp = gpu.lib.temperature_c(gpu.handle)
        except NvmlError as exc:
            result.update(within_band=False, reason=f"temperature unreadable: {exc}")
            break
        result["temp_c"] = temp
        if low <= temp <= high:
            result["within_band"] = True
            break
        if clock() - start >= timeout_s:
            result.update(
                within_band=False, reason=f"{temp:g} °C not within [{low:g}, {high:g}] after {timeout_s:g} s"
            )
            break
        sleep(poll_s)
    result["waited_s"] = clock() - start
    return result


#: throttle reasons that mean someone or something else slows the GPU (NVML's bit values): not idle (0x1),
#: not the application clock setting (0x2), not the software power cap a sweep sets on purpose (0x4)
FOREIGN_THROTTLE_BITS = {0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "power_brake"}


def gpu_state(gpu: GpuHandle, own_pids: Sequence[int] = ()) -> tuple[dict[str, Any], list[str]]:
    """The GPU just before a measurement window: (readings, reasons it is not quiet).

    Other compute processes and throttle reasons that are not the idle or power-cap ones are reasons;
    utilisation and the SM clock are readings only (the utilisation is a trailing average that still
    holds the previous config's own work). A reading that fails is left out, with its error noted.
    """
    state: dict[str, Any] = {}
    reasons: list[str] = []
    reads = {"pids": lambda: gpu.lib.compute_pids(gpu.handle),
             "gpu_util": lambda: gpu.lib.utilization(gpu.handle)[0],
             "sm_clock_mhz": lambda: gpu.lib.clock_mhz(gpu.handle, "sm"),
             "throttle_reasons": lambda: gpu.lib.throttle_reasons(gpu.handle)}
    for key, read in reads.items():
        try:
            state[key] = read()
        except (NvmlError, AttributeError) as exc:
            state.setdefault("unreadable", {})[key] = str(exc)
    others = [pid for pid in state.get("pids", []) if pid not in set(own_pids)]
    if others:
        reasons.append(f"other processes on the GPU: {others}")
    bits = int(state.get("throttle_reasons", 0))
    throttled = [name for bit, name in FOREIGN_THROTTLE_BITS.items() if bits & bit]
    if throttled:
        reasons.append(f"clocks throttled ({', '.join(throttled)})")
    return state, reasons
