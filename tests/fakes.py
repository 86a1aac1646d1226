"""A fake NVML library for tests on machines without a GPU.

:class:`FakeNvml` has the public methods of :class:`perfzoo.profiling.nvml.NvmlLibrary` (the boundary to
pynvml) and scripted behaviour: a constant power draw (instant and average readings may differ or be
unsupported), a total-energy counter that either integrates that draw over real time and updates every
``counter_period_s`` (as the driver's does) or stays at a fixed value, reads that fail on given read
numbers or for good after some reads ("GPU is lost"), a settable power limit that may need privileges,
a scripted temperature series and a MIG mode (or none, as on a GPU without MIG).
"""

from __future__ import annotations

import math
import time

from perfzoo.profiling.nvml import NvmlError, NvmlNoPermission, NvmlNotSupported

ORIGINAL_MW = 250_000


class FakeNvml:
    """Same public methods as :class:`perfzoo.profiling.nvml.NvmlLibrary`, scripted."""

    def __init__(
        self,
        name: str = "NVIDIA A100-SXM4-40GB",
        *,
        power_w: float = 200.0,
        average_w: float | None = None,
        instant: bool = True,
        counter_period_s: float = 0.02,
        energy_mj: int | None = None,
        energy_supported: bool = True,
        power_failures: tuple[int, ...] = (),
        lose_after_power_reads: int | None = None,
        can_set: bool = True,
        constraints_w: tuple[int, int] = (100, 400),
        temperatures: list[float] | None = None,
        uuids: dict[str, str] | None = None,
        utilization: tuple[float, float] = (90.0, 40.0),
        limit_log: str | None = None,
        mig_mode: tuple[int, int] | None = (0, 0),
    ) -> None:
        self._name = name
        self.power_w, self.average_w, self.instant = power_w, average_w, instant
        self.period_s, self.energy_mj, self.energy_supported = counter_period_s, energy_mj, energy_supported
        self.power_failures, self.lose_after, self.power_reads = set(power_failures), lose_after_power_reads, 0
        self.can_set, self.constraints_w, self.limit_log = can_set, constraints_w, limit_log
        self.temperatures = list(temperatures or [55.0])
        self.uuids, self._utilization = uuids, utilization
        self.limit_mw = ORIGINAL_MW
        self._mig_mode = mig_mode  # None: a GPU without MIG
        self.set_calls: list[int] = []
        self.t0 = time.perf_counter_ns()

    @property
    def lost(self) -> bool:
        return self.lose_after is not None and self.power_reads >= self.lose_after

    def init(self) -> None: ...
    def shutdown(self) -> None: ...

    def device_count(self) -> int:
        return len(self.uuids) if self.uuids else 1

    def handle(self, index: int) -> str:
        return f"handle-{index}"

    def name(self, handle: str) -> str:
        return self._name

    def uuid(self, handle: str) -> str:
        if self.uuids is None:
            raise NvmlNotSupported("nvmlDeviceGetUUID: Not Supported")
        return self.uuids[handle]

    def driver_version(self) -> str:
        return "550.54.15"

    def cuda_driver_version(self) -> int:
        return 12040

    def memory_mib(self, handle: str) -> tuple[float, float]:
        return 40960.0, 1234.0

    def power_limit_constraints_mw(self, handle: str) -> tuple[int, int]:
        return self.constraints_w[0] * 1000, self.constraints_w[1] * 1000

    def power_limit_mw(self, handle: str) -> int:
        return self.limit_mw

    def set_power_limit_mw(self, handle: str, limit_mw: int) -> None:
        if not self.can_set:
            raise NvmlNoPermission("nvmlDeviceSetPowerManagementLimit: Insufficient Permissions")
        self.limit_mw = limit_mw
        self.set_calls.append(limit_mw)
        if self.limit_log:
            with open(self.limit_log, "a") as log:
                log.write(f"{limit_mw}\n")

    def _power_read(self, watts: float) -> float:
        self.power_reads += 1
        if self.lost or self.power_reads in self.power_failures:
            raise NvmlError("nvmlDeviceGetFieldValues: GPU is lost")
        return watts * 1000.0

    def power_instant_mw(self, handle: str) -> float:
        if not self.instant:
            raise NvmlNotSupported("NVML_FI_DEV_POWER_INSTANT: Not Supported")
        return self._power_read(self.power_w)

    def power_average_mw(self, handle: str) -> float:
        return self._power_read(self.power_w if self.average_w is None else self.average_w)

    def total_energy_mj(self, handle: str) -> int:
        if not self.energy_supported:
            raise NvmlNotSupported("nvmlDeviceGetTotalEnergyConsumption: Not Supported")
        if self.lost:
            raise NvmlError("nvmlDeviceGetTotalEnergyConsumption: GPU is lost")
        if self.energy_mj is not None:
            return self.energy_mj
        elapsed_s = (time.perf_counter_ns() - self.t0) / 1e9
        updated_s = math.floor(elapsed_s / self.period_s) * self.period_s
        return 5_000_000 + int(self.power_w * updated_s * 1000)

    def utilization(self, handle: str) -> tuple[float, float]:
        return self._utilization

    def clock_mhz(self, handle: str, which: str) -> float:
        return {"sm": 1410.0, "mem": 1215.0}[which]

    def compute_pids(self, handle: str) -> list[int]:
        return list(getattr(self, "other_pids", []))

    def throttle_reasons(self, handle: str) -> int:
        return int(getattr(self, "throttle_bits", 0))

    def mig_mode(self, handle: str) -> tuple[int, int]:
        if self._mig_mode is None:
            raise NvmlNotSupported("nvmlDeviceGetMigMode: Not Supported")
        return self._mig_mode

    def temperature_c(self, handle: str) -> float:
        return self.temperatures.pop(0) if len(self.temperatures) > 1 else self.temperatures[0]
