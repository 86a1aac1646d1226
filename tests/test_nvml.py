"""NVML layer against a fake library boundary (no GPU needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pytest

from perfzoo.io import InputError
from perfzoo.profiling import nvml
from perfzoo.profiling import power_limits
from perfzoo.profiling.nvml import GpuHandle, NvmlNoPermission, NvmlNotSupported
from perfzoo.profiling.power_limits import PowerLimitSweep

from fakes import ORIGINAL_MW, FakeNvml

#: the scripted GPU of these tests: instant power 210 W, average 180 W, a fixed energy counter, no UUID
NVML_TEST_GPU = {"power_w": 210.0, "average_w": 180.0, "energy_mj": 987_654, "constraints_w": (100, 300),
                 "utilization": (75.0, 40.0), "temperatures": [60.0]}


def _gpu(**kwargs) -> tuple[GpuHandle, FakeNvml]:
    fake = FakeNvml(**{**NVML_TEST_GPU, **kwargs})
    return nvml.open_device(0, lib=fake), fake


# -- identity --------------------------------------------------------------------------------------


def test_device_identity_reports_facts_and_missing_reasons() -> None:
    gpu, _ = _gpu()
    ident = nvml.device_identity(gpu)
    assert ident["name"] == "NVIDIA A100-SXM4-40GB"
    assert ident["cuda_driver_version"] == "12.4"
    assert (ident["power_limit_min_w"], ident["power_limit_max_w"], ident["power_limit_w"]) == (
        100.0,
        300.0,
        250.0,
    )
    assert ident["memory_total_mb"] == 40960.0
    assert ident["uuid"] is None and "Not Supported" in ident["missing"]["uuid"]
    assert ident["mig_mode"] == "disabled"


def test_device_identity_reads_the_mig_mode_or_says_why_not() -> None:
    enabled = nvml.device_identity(_gpu(mig_mode=(1, 1))[0])
    assert enabled["mig_mode"] == "enabled"
    without = nvml.device_identity(_gpu(mig_mode=None)[0])
    assert without["mig_mode"] is None and "nvmlDeviceGetMigMode" in without["missing"]["mig_mode"]
    odd = nvml.device_identity(_gpu(mig_mode=(7, 7))[0])  # a value NVML does not document: missing, named
    assert odd["mig_mode"] is None and "undocumented mode 7" in odd["missing"]["mig_mode"]


def test_check_gpu_name_accepts_regex_and_substring_and_names_both_on_mismatch() -> None:
    nvml.check_gpu_name("NVIDIA A100-SXM4-40GB", "a100.*40GB", "a100-40")
    nvml.check_gpu_name("NVIDIA A100-SXM4-40GB", "A100-SXM4", "a100-40")
    with pytest.raises(InputError, match=r"device 'h100'.*'H100'.*'NVIDIA A100-SXM4-40GB'"):
        nvml.check_gpu_name("NVIDIA A100-SXM4-40GB", "H100", "h100")


def test_energy_counter_value_or_nan_with_reason() -> None:
    gpu, _ = _gpu()
    assert nvml.read_energy_counter_mj(gpu) == (987_654.0, "")
    gpu, _ = _gpu(energy_supported=False)
    value, reason = nvml.read_energy_counter_mj(gpu)
    assert np.isnan(value) and "Not Supported" in reason


# -- sampler ---------------------------------------------------------------------------------------


def test_sampler_collects_at_roughly_the_configured_rate() -> None:
    gpu, _ = _gpu()
    sampler = nvml.PowerSampler(gpu, rate_hz=100.0)
    with sampler:
        time.sleep(0.5)
    frame = sampler.samples()
    assert list(frame.columns) == list(nvml.SENSOR_COLUMNS)
    assert 30 <= len(frame) <= 60  # ~51 + the closing sample
    intervals_ms = np.diff(frame["t_ns"].to_numpy()) / 1e6
    assert 7.0 <= float(np.median(intervals_ms[:-1])) <= 14.0
    assert frame["power_w"].eq(210.0).all() and frame["power_limit_w"].eq(250.0).all()
    assert frame["mem_used_mb"].eq(1234.0).all() and frame["sm_clock_mhz"].eq(1410.0).all()
    assert sampler.summary()["rate_hz_achieved"] == pytest.approx(100.0, rel=0.35)


@pytest.mark.parametrize(
    ("instant", "source", "watts"), [(True, "instant", 210.0), (False, "average", 180.0)]
)
def test_sampler_prefers_instant_power_and_falls_back_to_average(
    instant: bool, source: str, watts: float
) -> None:
    gpu, _ = _gpu(instant=instant)
    sampler = nvml.PowerSampler(gpu)
    for _ in range(3):
        sampler.sample_once()
    assert sampler.power_source == source
    assert sampler.samples()["power_w"].eq(watts).all()
    assert ("instant power unavailable" in sampler.power_source_reason) is (not instant)
    assert sampler.error_count == 0


def test_read_error_mid_run_gives_nan_power_and_recorded_error_never_zero() -> None:
    gpu, _ = _gpu(power_failures=(5, 6))  # read 1 is the source probe, reads 2.. are samples
    sampler = nvml.PowerSampler(gpu)
    for _ in range(8):
        sampler.sample_once()
    power = sampler.samples()["power_w"]
    assert power.isna().tolist() == [False, False, False, True, True, False, False, False]
    assert not power.eq(0.0).any()
    assert sampler.error_count == 2
    assert all("GPU is lost" in message for message in sampler.errors)
    assert sampler.samples()["temp_c"].notna().all()  # other sensors unaffected


def test_unsupported_sensor_is_nan_with_reason_and_not_retried() -> None:
    gpu, fake = _gpu()
    calls = []

    def utilization(handle: str) -> tuple[float, float]:
        calls.append(handle)
        raise NvmlNotSupported("nvmlDeviceGetUtilizationRates: Not Supported")

    fake.utilization = utilization
    sampler = nvml.PowerSampler(gpu)
    for _ in range(4):
        sampler.sample_once()
    frame = sampler.samples()
    assert frame[["gpu_util", "mem_util"]].isna().all().all() and frame["power_w"].eq(210.0).all()
    assert len(calls) == 1 and sampler.error_count == 0
    assert "Not Supported" in sampler.summary()["unsupported"]["utilization"]


# -- power-limit sweep -----------------------------------------------------------------------------


def test_sweep_visits_each_limit_once_per_repetition_in_differing_orders_and_restores() -> None:
    gpu, fake = _gpu()
    limits = [150.0, 200.0, 250.0, 300.0]
    seen: list[list[float]] = [[] for _ in range(5)]
    with PowerLimitSweep(gpu, limits, repetitions=5, seed=7, device="gpu-a") as sweep:
        for repetition, limit_w in sweep:
            assert fake.limit_mw == limit_w * 1000  # the limit is really set while the body runs
            seen[repetition].append(limit_w)
    assert all(sorted(order) == limits for order in seen)
    assert len({tuple(order) for order in seen}) > 1
    assert fake.limit_mw == ORIGINAL_MW and fake.set_calls[-1] == ORIGINAL_MW
    assert power_limits.sweep_orders(limits, 5, seed=7) == seen  # reproducible from the seed


def test_sweep_restores_on_exception() -> None:
    gpu, fake = _gpu()
    with (
        pytest.raises(RuntimeError, match="boom"),
        PowerLimitSweep(gpu, [150.0, 200.0], repetitions=2, device="gpu-a") as sweep,
    ):
        for _, limit_w in sweep:
            assert fake.limit_mw == limit_w * 1000
            raise RuntimeError("boom")
    assert fake.limit_mw == ORIGINAL_MW


def test_sweep_restores_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "limits.log"
    tests_dir = Path(__file__).parent
    src_dir = tests_dir.parent / "src"
    child = textwrap.dedent(
        f"""
        import sys, time
        sys.path[:0] = [{str(src_dir)!r}, {str(tests_dir)!r}]
        from fakes import FakeNvml
        from perfzoo.profiling.nvml import GpuHandle
        from perfzoo.profiling.power_limits import PowerLimitSweep
        fake = FakeNvml(limit_log={str(log)!r})
        with PowerLimitSweep(GpuHandle(fake, "h0", 0), [150, 200], repetitions=2, device="gpu-a") as sweep:
            for _, limit in sweep:
                print("READY", limit, flush=True)
                time.sleep(30)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    written = [int(x) for x in log.read_text().split()]
    assert written[0] == float(line.split()[1]) * 1000  # the sweep limit had been set
    assert written[-1] == ORIGINAL_MW  # and the original was restored before exiting
    assert proc.returncode == 128 + signal.SIGTERM


def test_sigterm_restores_then_hands_on_to_a_previous_python_handler() -> None:
    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        gpu, fake = _gpu()
        with PowerLimitSweep(gpu, [150.0], device="gpu-a") as sweep:
            for _ in sweep:
                assert fake.limit_mw == 150_000
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler runs in the main thread between bytecodes
                assert fake.limit_mw == ORIGINAL_MW  # restored by the handler itself, before exit
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sweep_uninstalls_its_sigterm_handler() -> None:
    before = signal.getsignal(signal.SIGTERM)
    gpu, _ = _gpu()
    with PowerLimitSweep(gpu, [150.0], device="gpu-a") as sweep:
        assert signal.getsignal(signal.SIGTERM) == sweep._on_sigterm
        list(sweep)
    assert signal.getsignal(signal.SIGTERM) == before


def test_permission_error_skips_sweep_with_warning_and_run_goes_on() -> None:
    gpu, fake = _gpu(can_set=False)
    visited = []
    with (
        pytest.warns(RuntimeWarning, match="gpu-a.*sweep skipped.*Insufficient Permissions"),
        PowerLimitSweep(gpu, [150.0, 200.0], repetitions=2, device="gpu-a") as sweep,
    ):
        visited.extend(sweep)
    assert visited == []
    assert "not permitted" in sweep.skipped_reason
    assert fake.limit_mw == ORIGINAL_MW and fake.set_calls == []


def test_out_of_range_limit_names_device_and_range() -> None:
    gpu, fake = _gpu()
    with (
        pytest.raises(InputError, match=r"device 'gpu-a'.*\[350\.0\].*100-300 W"),
        PowerLimitSweep(gpu, [150.0, 350.0], device="gpu-a"),
    ):
        pass
    assert fake.set_calls == []
    with pytest.raises(InputError, match=r"device 'v100'.*150-300 W"):
        power_limits.validate_power_limits("v100", [100.0], 150.0, 300.0)
    assert power_limits.validate_power_limits("v100", [150, 300], 150.0, 300.0) == [150.0, 300.0]


# -- cool-down -------------------------------------------------------------------------------------


def test_cooldown_waits_until_temperature_within_band() -> None:
    gpu, _ = _gpu(temperatures=[80.0, 76.0, 69.0, 60.0])
    now = [0.0]

    def fake_sleep(seconds: float) -> None:
        now[0] += seconds

    result = nvml.cooldown(
        gpu, band_c=(0.0, 70.0), timeout_s=60.0, poll_s=5.0, sleep=fake_sleep, clock=lambda: now[0]
    )
    assert result["within_band"] is True and result["temp_c"] == 69.0 and result["waited_s"] == 10.0

    gpu, _ = _gpu(temperatures=[90.0])
    now[0] = 0.0
    result = nvml.cooldown(
        gpu, band_c=70.0, timeout_s=3.0, poll_s=1.0, sleep=fake_sleep, clock=lambda: now[0]
    )
    assert result["within_band"] is False and "not within" in result["reason"]
    assert nvml.cooldown()["within_band"] is None


# -- the real boundary, on pynvml's own structures -------------------------------------------------


def _stub_pynvml(**overrides):
    import pynvml

    module = types.SimpleNamespace(**{k: v for k, v in vars(pynvml).items() if not k.startswith("__")})
    for key, value in overrides.items():
        setattr(module, key, value)
    return module


def test_boundary_decodes_instant_power_field_and_translates_errors() -> None:
    import pynvml

    def field_values(handle, ids):
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        values[0].fieldId = ids[0]
        values[0].nvmlReturn = pynvml.NVML_SUCCESS
        values[0].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        values[0].value.uiVal = 123_456
        assert ids == [pynvml.NVML_FI_DEV_POWER_INSTANT]
        return values

    def no_permission(handle, limit):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    def not_supported(handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    lib = nvml.NvmlLibrary(
        _stub_pynvml(
            nvmlDeviceGetFieldValues=field_values,
            nvmlDeviceSetPowerManagementLimit=no_permission,
            nvmlDeviceGetTotalEnergyConsumption=not_supported,
            nvmlDeviceGetPowerManagementLimitConstraints=lambda h: [100_000, 400_000],
        )
    )
    assert lib.power_instant_mw("h") == 123_456.0
    assert lib.power_limit_constraints_mw("h") == (100_000, 400_000)
    with pytest.raises(NvmlNoPermission):
        lib.set_power_limit_mw("h", 150_000)
    with pytest.raises(NvmlNotSupported, match="nvmlDeviceGetTotalEnergyConsumption"):
        lib.total_energy_mj("h")


def test_boundary_reads_the_mig_mode_and_names_a_gpu_without_mig() -> None:
    import pynvml

    def no_mig(handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    assert nvml.NvmlLibrary(_stub_pynvml(nvmlDeviceGetMigMode=lambda h: [1, 0])).mig_mode("h") == (1, 0)
    with pytest.raises(NvmlNotSupported, match="nvmlDeviceGetMigMode"):
        nvml.NvmlLibrary(_stub_pynvml(nvmlDeviceGetMigMode=no_mig)).mig_mode("h")


def test_boundary_field_level_failure_is_not_supported() -> None:
    import pynvml

    def field_values(handle, ids):
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        values[0].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    lib = nvml.NvmlLibrary(_stub_pynvml(nvmlDeviceGetFieldValues=field_values))
    with pytest.raises(NvmlNotSupported, match="POWER_INSTANT"):
        lib.power_instant_mw("h")


def test_nvml_available_reports_a_reason_without_a_driver() -> None:
    ok, reason = nvml.nvml_available()
    assert isinstance(ok, bool)
    assert ok or reason  # never "unavailable" without saying why
    if not os.path.exists("/dev/nvidiactl"):
        assert not ok
