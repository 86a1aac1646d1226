"""CUDA profiling without a GPU: fakes at the NVML and CUDA boundaries drive the real measurement code.

The fake NVML has physics: a constant power draw, and a total-energy counter that integrates it over real
time and updates only every ``counter_period_s`` (like the driver's). The fake CUDA backend runs the model
on the CPU and times it with the wall clock in place of CUDA events.
"""

from __future__ import annotations

import json
import math
import socket
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import FAULTY
from fakes import ORIGINAL_MW
from fakes import FakeNvml as _ScriptedNvml

from perfzoo import energy
from perfzoo.hardware import hardware_features
from perfzoo.io import InputError
from perfzoo.profiling import cuda, measure, microbench, nvml, runner
from perfzoo.profiling.cuda import measure_on_cuda, window_energy_from_samples
from perfzoo.profiling.microbench import check_device, describe_device
from perfzoo.profiling.nvml import NvmlError
from perfzoo.profiling.op_timing import HostClock
from perfzoo.profiling.worker import Outcome
from perfzoo.models.zoo import expand_zoo, manifest_frame

MIB = 1024 * 1024
#: two GPUs with UUIDs; the counter integrates a constant 200 W over real time
TWO_GPUS = {"handle-0": "GPU-0000aaaa-0000", "handle-1": "GPU-1111bbbb-1111"}


class FakeNvml(_ScriptedNvml):
    """The scripted NVML with two GPUs that have UUIDs."""

    def __init__(self, name: str = "NVIDIA A100-SXM4-40GB", **kwargs: Any) -> None:
        super().__init__(name, **{"uuids": TWO_GPUS, **kwargs})


SETTINGS = {"warmup_iters": 1, "min_iters": 3, "max_iters": 6, "max_time_s": 0.3, "ci_target": 0.02,
            "timeout_s": 60, "max_rss_mb": 8000, "repeat_every": 0, "cooldown_s": 0, "optimizer": "sgd",
            "threads": 1, "num_classes": 10}


class FakeCuda:
    """The CUDA boundary on the CPU: real model, wall-clock 'events', scripted allocator statistics."""

    def __init__(self, name: str = "NVIDIA A100-SXM4-40GB", uuid: str = "1111bbbb-1111",
                 capability: str = "8.0") -> None:
        self.name, self.uuid, self.capability = name, uuid, capability
        self.calls: list[str] = []

    def facts(self, index: int) -> dict[str, Any]:
        return {"available": True, "reason": "", "name": self.name, "uuid": self.uuid, "device_count": 1,
                "total_memory_mb": 40960.0, "sm_count": 108, "compute_capability": self.capability,
                "torch_version": "2.x", "torch_cuda_version": "12.4", "cuda_visible_devices": "0"}

    def device(self, index: int) -> str:
        return "cpu"

    def set_device(self, index: int) -> None:
        self.calls.append(f"set_device {index}")

    def synchronize(self, device: str) -> None:
        self.calls.append("synchronize")

    def time_ms(self, fn, device: str) -> float:
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / 1e6

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def reset_peak_memory_stats(self, device: str) -> None:
        self.calls.append("reset_peak_memory_stats")

    def max_memory_allocated(self, device: str) -> int:
        return 100 * MIB

    def max_memory_reserved(self, device: str) -> int:
        return 128 * MIB

    def op_clock(self, device: str) -> HostClock:
        self.calls.append("op_clock")
        return HostClock()


def tiny_spec(config_id: str = "0" * 12, mode: str = "training") -> dict[str, Any]:
    return {"config_id": config_id, "model_id": "m" + config_id, "builder": "python",
            "name": f"{FAULTY}:build_tiny", "builder_kwargs": "{}", "input_shape": "[4]", "dtype": "float32",
            "batch": 2, "mode": mode}


def cuda_settings(**overrides: Any) -> dict[str, Any]:
    return {**SETTINGS, "num_classes": 2, "gpu_index": 0, "nvml_index": 1, "sample_hz": 50.0, "min_window_s": 0.3,
            **overrides}


# -- measure_on_cuda ---------------------------------------------------------------------------------


def test_cuda_kind_is_registered() -> None:
    assert measure.MEASURE["cuda"] is measure_on_cuda and measure.MEASURE["cpu"] is measure.measure_on_cpu


def test_measure_on_cuda_end_to_end_with_fakes() -> None:
    fake, backend = FakeNvml(), FakeCuda()
    m = measure_on_cuda(tiny_spec(), cuda_settings(), backend=backend, nvml_lib=fake)
    assert 3 <= len(m.times_ms) <= 6 and all(t > 0 for t in m.times_ms)
    assert m.stop_reason in {"ci_target", "max_iters", "max_time"}
    # allocator peaks were reset before the model was built; peak_mem_mb is the reserved peak
    assert backend.calls.index("reset_peak_memory_stats") < backend.calls.index("synchronize")
    assert m.peak_mem_mb == 128.0 and m.extra["mem_allocated_mb"] == 100.0 and m.extra["mem_reserved_mb"] == 128.0
    assert m.extra["nvml_mem_used_mb"] == 1234.0
    x = m.extra
    # the window lasts at least min_window_s and the counter's update period (probed: 0.02 s)
    assert x["window_s"] >= 0.3 and x["window_iters"] >= 1
    assert x["counter_period_s"] == pytest.approx(0.02, rel=0.5)
    # both energies kept, both close to 200 W x window, and their disagreement computed
    assert x["window_energy_samples_j"] == pytest.approx(200.0 * x["window_s"], rel=1e-6)
    assert x["window_energy_counter_j"] == pytest.approx(200.0 * x["window_s"], abs=200.0 * 0.02 + 1e-9)
    assert x["energy_disagreement"] == energy.compare_counter(x["window_energy_counter_j"],
                                                              x["window_energy_samples_j"])
    assert math.isfinite(x["energy_disagreement"]) and x["energy_message"] == ""
    assert x["power_source"] == "instant" and x["sensor_errors"] == 0
    assert x["power_limit_w"] == 250.0 and x["power_limit_swept"] is False  # the limit in force, read back
    # the sensor samples of the window: contract columns, the closing sample after the window end
    sensors = pd.DataFrame(x["sensors"])
    assert list(sensors.columns) == list(nvml.SENSOR_COLUMNS) and len(sensors) >= 10
    assert (sensors["power_w"] == 200.0).all() and (sensors["power_limit_w"] == 250.0).all()
    span = (sensors["t_ns"].max() - sensors["t_ns"].min()) / 1e9
    assert span >= x["window_s"]
    json.dumps(asdict(m))  # what the journal stores


def test_per_op_times_on_cuda_come_from_the_backends_clock_after_every_label() -> None:
    backend = FakeCuda()
    m = measure_on_cuda(tiny_spec(), cuda_settings(), backend=backend, nvml_lib=FakeNvml())
    ops = m.extra["op_times"]
    assert ops["message"] == "" and len(ops["step_ms"]) == 2  # profiling.op_timing.steps defaults to 2
    assert {"forward", "backward", "optimizer"} <= set(ops["phase"]) and all(t >= 0 for t in ops["time_ms"])
    assert len(ops["time_ms"]) == len(ops["op"]) and "aten.addmm.default" in ops["op"]
    # asked for after the timed iterations, the allocator's peaks and the energy window's last synchronisation,
    # with only the cool-down after it: no label saw the timer
    assert backend.calls[-2:] == ["op_clock", "empty_cache"] and backend.calls.count("synchronize") >= 2
    repeat = measure_on_cuda(tiny_spec(), cuda_settings(time_ops=False), backend=FakeCuda(), nvml_lib=FakeNvml())
    assert "op_times" not in repeat.extra  # the noise floor's repeats are not op-timed


def test_window_is_at_least_the_counter_period() -> None:
    m = measure_on_cuda(tiny_spec(mode="inference"), cuda_settings(min_window_s=0.05, counter_period_s=0.4),
                        backend=FakeCuda(), nvml_lib=FakeNvml())
    assert m.extra["window_target_s"] == 0.4 and m.extra["window_s"] >= 0.4


@pytest.mark.parametrize("underestimate", [1, 10])
def test_window_does_not_overshoot_when_event_times_underestimate_the_step(underestimate: int) -> None:
    gpu = nvml.open_device(0, lib=FakeNvml())
    result = cuda.energy_window(lambda: time.sleep(0.002), gpu, FakeCuda(), "cpu", window_s=0.3, sample_hz=50.0,
                                iteration_ms=2.0 / underestimate)
    assert 0.3 <= result["window_s"] < 0.3 * 1.5
    assert result["window_iters"] * 0.002 <= result["window_s"]


def test_nvml_error_mid_run_gives_nan_energy_and_records_the_error() -> None:
    fake = FakeNvml(lose_after_power_reads=8)  # the GPU falls off the bus during the energy window
    m = measure_on_cuda(tiny_spec(), cuda_settings(counter_period_s=0.02), backend=FakeCuda(), nvml_lib=fake)
    x = m.extra
    assert math.isnan(x["window_energy_counter_j"]) and math.isnan(x["window_energy_samples_j"])
    assert math.isnan(x["energy_disagreement"])
    assert x["sensor_errors"] > 0
    assert "GPU is lost" in x["energy_message"] and "window end" in x["energy_message"]
    assert any(math.isnan(s["power_w"]) for s in x["sensors"])  # failed reads are NaN, never 0
    assert not any(s["power_w"] == 0 for s in x["sensors"])
    assert len(m.times_ms) >= 3  # the timing is still valid


def test_nvml_unavailable_in_worker_keeps_timing_and_says_why() -> None:
    class Broken(FakeNvml):
        def init(self) -> None:
            raise NvmlError("nvmlInit: Driver Not Loaded")

    m = measure_on_cuda(tiny_spec(), cuda_settings(min_window_s=0.05), backend=FakeCuda(), nvml_lib=Broken())
    assert len(m.times_ms) >= 3 and math.isnan(m.extra["window_energy_counter_j"])
    assert "Driver Not Loaded" in m.extra["energy_message"] and m.extra["sensors"] == []


def test_constant_200_w_for_3_s_is_600_j() -> None:
    rng = np.random.default_rng(0)
    t_s = np.cumsum(rng.normal(0.02, 0.002, 200))  # ~50 Hz with jitter, past 3 s
    t_s = np.concatenate([[0.0], t_s])
    t0, t1 = 0.01, 3.01
    samples = pd.DataFrame({"t_ns": (t_s * 1e9).astype("int64"), "power_w": 200.0})
    e, why = window_energy_from_samples(samples, int(t0 * 1e9), int(t1 * 1e9))
    assert why == "" and e == pytest.approx(600.0, rel=0.005)
    assert energy.energy_from_samples(samples["t_ns"][t_s <= 3.0], samples["power_w"][t_s <= 3.0]) == \
        pytest.approx(600.0, rel=0.005 + 0.02 / 3)


def test_window_energy_nan_when_a_reading_in_the_window_failed() -> None:
    t_ns = np.arange(0, 11) * 100_000_000
    p = np.full(11, 150.0)
    p[5] = np.nan
    e, why = window_energy_from_samples(pd.DataFrame({"t_ns": t_ns, "power_w": p}), 0, 1_000_000_000)
    assert math.isnan(e) and "1 of" in why
    e, why = window_energy_from_samples(pd.DataFrame({"t_ns": t_ns + 10, "power_w": 150.0}), 0, 10**9)
    assert math.isnan(e) and "before the window start" in why


def test_nvml_index_matched_by_uuid() -> None:
    fake = FakeNvml()
    assert cuda.nvml_index_for(fake, "1111bbbb-1111", 0) == (1, "uuid")
    assert cuda.nvml_index_for(fake, "GPU-0000AAAA-0000", 1) == (0, "uuid")
    index, how = cuda.nvml_index_for(fake, None, 1)
    assert index == 1 and "same index" in how


# -- device identity ---------------------------------------------------------------------------------


CUDA_DEVICE = {"kind": "cuda", "gpu_name": "A100", "gpu_index": 0, "threads": 1, "sample_hz": 50.0,
               "min_window_s": 0.05, "power_limits_w": [], "sweep_repetitions": 1}


@pytest.mark.skipif(nvml.nvml_available()[0], reason="this machine has an NVIDIA driver")
def test_cuda_device_on_this_machine_fails_before_profiling(config, tmp_path, monkeypatch) -> None:
    def never(*args: Any) -> Outcome:
        raise AssertionError("nothing may be measured")

    monkeypatch.setattr(runner, "run_isolated", never)
    configs = manifest_frame(expand_zoo(config))
    journal = tmp_path / "s.journal.jsonl"
    with pytest.raises(InputError) as info:
        runner.profile_shard_with_ops(configs, "a100", CUDA_DEVICE, SETTINGS, journal, progress=False)
    message = str(info.value)
    assert "'a100'" in message and "'A100'" in message and socket.gethostname() in message
    assert "\n" not in message and not journal.exists()


def test_cuda_unavailable_is_named_even_when_nvml_works() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(InputError, match=r"'a100'.*'A100'.*host.*CUDA is unavailable"):
        check_device("a100", CUDA_DEVICE, nvml_lib=FakeNvml())  # the real CUDA probe, in a worker process


def test_gpu_name_mismatch_names_both() -> None:
    with pytest.raises(InputError) as info:
        check_device("a100", CUDA_DEVICE, nvml_lib=FakeNvml(name="NVIDIA H100 80GB HBM3"),
                     backend=FakeCuda(name="NVIDIA H100 80GB HBM3"))
    assert "A100" in str(info.value) and "NVIDIA H100 80GB HBM3" in str(info.value)


def test_cuda_device_name_is_checked_too() -> None:
    with pytest.raises(InputError, match=r"'A100'.*'Tesla V100-SXM2-32GB'"):
        check_device("a100", CUDA_DEVICE, nvml_lib=FakeNvml(), backend=FakeCuda(name="Tesla V100-SXM2-32GB"))


def test_identity_has_versions_and_the_uuid_matched_nvml_index() -> None:
    ident = check_device("a100", CUDA_DEVICE, nvml_lib=FakeNvml(), backend=FakeCuda())
    assert ident["name"] == "NVIDIA A100-SXM4-40GB" and ident["uuid"] == "GPU-1111bbbb-1111"
    assert ident["nvml_index"] == 1 and ident["nvml_index_source"] == "uuid"
    assert ident["driver_version"] == "550.54.15" and ident["cuda_driver_version"] == "12.4"
    assert ident["torch_version"] and ident["torch_cuda_version"] == "12.4"
    assert ident["power_limit_min_w"] == 100.0 and ident["power_limit_max_w"] == 400.0
    assert ident["energy_counter_supported"] is True and ident["host"] == socket.gethostname()


def test_describe_cuda_device_with_fakes(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(microbench, "cuda_hardware", lambda *a, **k: calls.append((a, k)) or {"kind": "cuda"})
    assert describe_device("a100", CUDA_DEVICE, nvml_lib="lib", backend="be") == {"kind": "cuda"}
    assert calls == [(("a100", CUDA_DEVICE), {"nvml_lib": "lib", "backend": "be"})]
    monkeypatch.undo()
    hw = microbench.cuda_hardware("a100", {**CUDA_DEVICE, "carbon_intensity_g_per_kwh": 300.0},
                                  nvml_lib=FakeNvml(), backend=FakeCuda(), gemm_n=64, copy_mb=4, repeats=2)
    assert set(hw["measured_gemm_tflops"]) == {"fp32", "tf32", "fp16", "bf16"}
    assert all(v > 0 for v in hw["measured_gemm_tflops"].values())
    assert hw["measured_copy_gbs"] > 0 and hw["sm_count"] == 108 and hw["memory_gb"] == 40.0
    assert hw["spec"]["name"].startswith("A100") and hw["mig_profiles"][0]["name"] == "1g.5gb"
    assert hw["mig_mode"] == "disabled"  # read from NVML, so MIG advice can say what using a profile takes
    assert hw["carbon_intensity_g_per_kwh"] == 300.0 and hw["energy_sensor"] == "nvml"
    assert set(hw["depthwise_temporary"]) == {"missing"}  # a oneDNN (CPU) temporary: never a number on a GPU
    assert set(hw["call_costs"]) == {"missing"}  # a CPU loop's timing: never a number for a GPU's launch
    feats = hardware_features(hw)
    assert feats == {"hw_peak_gflops": hw["measured_gemm_tflops"]["fp32"] * 1000,
                     "hw_mem_bw_gbs": hw["measured_copy_gbs"], "hw_cores": 108.0, "hw_mem_gb": 40.0}


def test_tf32_and_bf16_unsupported_before_ampere() -> None:
    support = cuda.gemm_support({"compute_capability": "7.0"})
    assert support["fp32"] == support["fp16"] == "" and "8.0" in support["tf32"] and "7.0" in support["bf16"]


# -- power-limit sweep in the runner -----------------------------------------------------------------


@pytest.fixture
def in_process_worker(monkeypatch):
    """Replace the isolated worker by an in-process measurement against the fakes; log the limit in force."""
    state: dict[str, Any] = {"fake": FakeNvml(), "measured": []}

    def run(kind: str, spec: dict[str, Any], settings: dict[str, Any]) -> Outcome:
        assert kind == "cuda"
        fake = state["fake"]
        state["measured"].append((spec["config_id"], settings.get("power_limit_w"), fake.limit_mw / 1000))
        m = measure_on_cuda(spec, {**settings, "min_window_s": 0.02}, backend=FakeCuda(), nvml_lib=fake)
        return Outcome("ok", "", asdict(m))

    monkeypatch.setattr(runner, "run_isolated", run)
    monkeypatch.setattr("gc.collect", lambda *a: 0)  # ~0.2 s each in a test process full of objects
    return state


def two_configs(config) -> pd.DataFrame:
    return manifest_frame(expand_zoo(config)).head(2).reset_index(drop=True)


def sweep_device(**overrides: Any) -> dict[str, Any]:
    return {**CUDA_DEVICE, "power_limits_w": [150, 200, 250, 300], "sweep_repetitions": 3, **overrides}


def test_sweep_visits_each_limit_once_per_repetition_and_restores(config, tmp_path, in_process_worker) -> None:
    fake = in_process_worker["fake"]
    configs = two_configs(config)
    journal = tmp_path / "s.journal.jsonl"
    result = runner.profile_shard_with_ops(configs, "a100", sweep_device(), SETTINGS, journal, progress=False,
                                           nvml_lib=fake, cuda_backend=FakeCuda())
    traces, sensors, meta = result.traces, result.sensors, result.meta
    sweep = meta["power_limit_sweep"]
    by_rep: dict[int, list[float]] = {}
    for rep, limit in sweep["visited"]:
        by_rep.setdefault(rep, []).append(limit)
    assert sorted(by_rep) == [0, 1, 2]
    assert all(sorted(v) == [150, 200, 250, 300] for v in by_rep.values())
    assert len({tuple(v) for v in by_rep.values()}) > 1  # a fresh order per repetition
    assert [list(map(float, o)) for o in sweep["orders"]] == [list(map(float, by_rep[r])) for r in range(3)]
    assert fake.limit_mw == ORIGINAL_MW and sweep["limit_after_w"] == 250.0 and sweep["skipped_reason"] == ""
    # every config measured once per (repetition, limit), with that limit in force
    assert len(in_process_worker["measured"]) == 2 * 4 * 3
    assert all(nominal == in_force for _, nominal, in_force in in_process_worker["measured"])
    runs = traces.drop_duplicates(["config_id", "repeat", "power_limit_w"])
    assert len(runs) == 24 and runs["power_limit_swept"].all() and (runs["status"] == "ok").all()
    assert set(sensors["power_limit_w"]) == {150.0, 200.0, 250.0, 300.0}
    assert sensors.groupby(["model_id", "mode", "batch", "repeat", "power_limit_w"]).ngroups == 24
    assert meta["identity"]["nvml_index"] == 1 and meta["counter_period_s"] > 0

    # journal keys include the limit; a killed job resumes without losing or duplicating rows
    lines = journal.read_text().splitlines()
    keys = [json.loads(line)["key"] for line in lines[1:]]
    assert len(keys) == 24 and all(k.count("/") == 2 and k.endswith("W") for k in keys)
    journal.write_text("\n".join(lines[:6]) + "\n" + lines[6][:40])
    in_process_worker["measured"].clear()
    resumed = runner.profile_shard_with_ops(configs, "a100", sweep_device(), SETTINGS, journal,
                                            progress=False, nvml_lib=fake, cuda_backend=FakeCuda())
    again, meta2 = resumed.traces, resumed.meta
    assert meta2["tasks_resumed_from_journal"] == 5 and meta2["tasks_measured_now"] == 19
    assert len(in_process_worker["measured"]) == 19 and fake.limit_mw == ORIGINAL_MW
    assert not again.duplicated(["config_id", "repeat", "power_limit_w", "iter"]).any()
    assert again.drop_duplicates(["config_id", "repeat", "power_limit_w"]).shape[0] == 24


def test_out_of_range_limit_fails_before_profiling(config, tmp_path, in_process_worker) -> None:
    with pytest.raises(InputError, match=r"'a100'.*\[50\.0\].*100-400 W"):
        runner.profile_shard_with_ops(two_configs(config), "a100", sweep_device(power_limits_w=[50, 200]),
                                      SETTINGS, tmp_path / "j.jsonl", progress=False,
                                      nvml_lib=in_process_worker["fake"], cuda_backend=FakeCuda())
    assert in_process_worker["measured"] == [] and in_process_worker["fake"].set_calls == []


def test_sweep_not_permitted_is_skipped_and_configs_measured_at_the_limit_in_force(
    config, tmp_path, in_process_worker
) -> None:
    fake = in_process_worker["fake"] = FakeNvml(can_set=False)
    with pytest.warns(RuntimeWarning, match="not permitted"):
        result = runner.profile_shard_with_ops(
            two_configs(config), "a100", sweep_device(), SETTINGS, tmp_path / "j.jsonl", progress=False,
            nvml_lib=fake, cuda_backend=FakeCuda())
    traces, meta = result.traces, result.meta
    assert "Insufficient Permissions" in meta["power_limit_sweep"]["skipped_reason"]
    runs = traces.drop_duplicates(["config_id", "repeat"])
    assert len(runs) == 2 and (runs["power_limit_w"] == 250.0).all() and not runs["power_limit_swept"].any()
    assert fake.limit_mw == ORIGINAL_MW


def test_no_sweep_keeps_the_noise_floor_repeat(config, tmp_path, in_process_worker) -> None:
    configs = manifest_frame(expand_zoo(config))
    result = runner.profile_shard_with_ops(
        configs, "a100", CUDA_DEVICE, {**SETTINGS, "repeat_every": 1}, tmp_path / "j.jsonl", progress=False,
        nvml_lib=in_process_worker["fake"], cuda_backend=FakeCuda())
    traces, sensors, meta = result.traces, result.sensors, result.meta
    assert "power_limit_sweep" not in meta
    assert traces.groupby(["config_id", "repeat"]).ngroups == 2 * len(configs)
    assert (traces["power_limit_w"] == 250.0).all() and not traces["power_limit_swept"].any()
    ok = traces.drop_duplicates(["config_id", "repeat"])
    assert ok["window_energy_counter_j"].notna().all() and ok["window_energy_samples_j"].notna().all()
    assert ok["energy_disagreement"].notna().all() and (ok["power_source"] == "instant").all()
    assert set(sensors.columns) == set(runner.SENSOR_COLUMNS) and len(sensors) > 0


def test_cpu_traces_have_nan_power_limit(tmp_path, config) -> None:
    from perfzoo.profiling.runner import plan_tasks, traces_frame

    configs = manifest_frame(expand_zoo(config)).head(1)
    tasks = plan_tasks(configs, 0)
    m = {"times_ms": [1.0, 2.0], "peak_mem_mb": 3.0, "n_warmup": 1, "stop_reason": "max_iters",
         "extra": {"threads": 1}}
    df = traces_frame(tasks, {tasks[0].key: {"status": "ok", "message": "", "measurement": m}})
    assert df["power_limit_w"].isna().all() and not df["power_limit_swept"].any()
    assert df["window_energy_counter_j"].isna().all() and (df["energy_message"] == "").all()
    df.to_parquet(tmp_path / "t.parquet")  # the mixed-type columns survive Parquet
