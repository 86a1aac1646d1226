"""Energy labels in the dataset and the energy analysis rule, from synthetic trace and sensor rows."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT, snakemake, tiny_config

from perfzoo.dataset.build import ENERGY_LABELS, aggregate_runs, build_dataset, energy_labels, noise_floor
from perfzoo.hardware import NO_ENERGY_SENSOR
from perfzoo.io import write_json
from perfzoo.profiling.runner import ENERGY_TRACE_COLUMNS, TRACE_COLUMNS, Task, sensors_frame, traces_frame
from perfzoo.models.zoo import expand_zoo, manifest_frame

GPU_HW = {"kind": "cuda", "energy_sensor": "nvml", "energy_missing_reason": None, "carbon_intensity_g_per_kwh": 300.0,
          "measured_gemm_gflops_fp32": 19500.0, "measured_copy_gbs": 1300.0, "sm_count": 108, "memory_gb": 40.0}
CPU_HW = {"kind": "cpu", "energy_sensor": None, "energy_missing_reason": NO_ENERGY_SENSOR,
          "measured_gemm_gflops_fp32": 50.0, "measured_copy_gbs": 10.0, "cores_used": 1, "memory_gb": 16.0}


def window(counter_j: float, samples_j: float, iters: int = 50, window_s: float = 2.5, message: str = "") -> dict:
    return {"window_energy_counter_j": counter_j, "window_energy_samples_j": samples_j, "window_iters": iters,
            "window_s": window_s, "energy_message": message, "power_source": "instant", "sensor_errors": 0}


def run_rows(config_id: str, device: str, times: list[float], batch: int = 8, repeat: int = 0,
             limit: float = math.nan, swept: bool = False, **energy: Any) -> pd.DataFrame:
    rows = [{"model_id": "m" + config_id, "config_id": config_id, "mode": "training", "batch": batch,
             "repeat": repeat, "iter": i, "time_ms": t, "status": "ok", "message": "", "peak_mem_mb": 100.0,
             "n_warmup": 1, "stop_reason": "max_iters", "threads": 1, "power_limit_w": limit,
             "power_limit_swept": swept, **energy} for i, t in enumerate(times)]
    frame = pd.DataFrame(rows).reindex(columns=[*TRACE_COLUMNS, *ENERGY_TRACE_COLUMNS])
    return frame.assign(device=device, trace_file=f"results/traces/{device}/s0000.parquet")


def test_energy_labels_per_batch_per_sample_edp_and_carbon() -> None:
    traces = pd.concat([
        run_rows("a", "gpu", [50.0, 50.0, 50.0], batch=8, limit=250.0, **window(125.0, 120.0)),
        run_rows("b", "gpu", [20.0, 20.0, 20.0], batch=4, limit=250.0, **window(math.nan, 60.0, iters=30, window_s=2.0)),
        run_rows("c", "gpu", [20.0, 20.0, 20.0], limit=250.0,
                 **window(math.nan, math.nan, message="energy counter at window end: GPU is lost")),
        run_rows("d", "cpu", [5.0, 5.0, 5.0]),
    ], ignore_index=True)
    runs = aggregate_runs(traces)
    assert runs.set_index("config_id").loc["a", "window_energy_counter_j"] == 125.0
    labels = energy_labels(runs, {"gpu": GPU_HW, "cpu": CPU_HW}).set_index("config_id")

    a = labels.loc["a"]  # counter preferred: 125 J over 50 steps of 2.5 s
    assert a["energy_source"] == "counter" and a["energy_j"] == pytest.approx(2.5)
    assert a["energy_per_sample_j"] == pytest.approx(2.5 / 8)
    assert a["mean_power_w"] == pytest.approx(125.0 / 2.5)
    assert a["edp"] == pytest.approx(2.5 * 0.050)  # E x median step time
    assert a["carbon_g"] == pytest.approx(2.5 / 3.6e6 * 300.0)
    assert a["carbon_per_sample_g"] == pytest.approx(a["carbon_g"] / 8)
    assert a["energy_missing_reason"] == ""

    b = labels.loc["b"]  # no counter: integrated samples
    assert b["energy_source"] == "samples" and b["energy_j"] == pytest.approx(2.0)
    assert b["energy_per_sample_j"] == pytest.approx(0.5) and b["mean_power_w"] == pytest.approx(30.0)

    c = labels.loc["c"]  # both readings failed: NaN with the reason, never 0
    assert all(math.isnan(c[k]) for k in ("energy_j", "energy_per_sample_j", "edp", "carbon_g", "mean_power_w"))
    assert "GPU is lost" in c["energy_missing_reason"]

    d = labels.loc["d"]  # cpu: no sensor
    assert math.isnan(d["energy_j"]) and math.isnan(d["edp"]) and math.isnan(d["carbon_g"])
    assert d["energy_missing_reason"] == NO_ENERGY_SENSOR


def test_runs_and_noise_floor_are_kept_apart_per_power_limit() -> None:
    traces = pd.concat([
        run_rows("a", "gpu", [10.0, 10.0, 10.0], repeat=r, limit=w, swept=True, **window(100.0, 100.0))
        for r in (0, 1) for w in (150.0, 300.0)
    ], ignore_index=True)
    runs = aggregate_runs(traces)
    assert len(runs) == 4 and set(runs["power_limit_w"]) == {150.0, 300.0}
    floor = noise_floor(runs).set_index("target")
    assert floor.loc["latency_ms", "pairs"] == 2  # (150 W, rep 0 vs 1) and (300 W, rep 0 vs 1), not 4


def test_energy_labels_get_a_noise_floor_where_both_measurements_have_them() -> None:
    traces = pd.concat([
        run_rows("a", "gpu", [10.0, 10.0, 10.0], **window(100.0, 100.0, iters=50)),
        run_rows("a", "gpu", [10.0, 10.0, 10.0], repeat=1, **window(110.0, 100.0, iters=50)),
        run_rows("b", "gpu", [10.0, 10.0, 10.0], **window(100.0, 100.0, iters=50)),
        run_rows("b", "gpu", [10.0, 10.0, 10.0], repeat=1,
                 **window(math.nan, math.nan, message="energy counter at window end: GPU is lost")),
        run_rows("c", "cpu", [5.0, 5.0, 5.0]), run_rows("c", "cpu", [5.0, 5.0, 5.0], repeat=1),
    ], ignore_index=True)
    labelled = energy_labels(aggregate_runs(traces), {"gpu": GPU_HW, "cpu": CPU_HW})
    floor = noise_floor(labelled).set_index(["device", "target"])
    # only config a has the label in both measurements: 110 J against 100 J over the same window
    assert floor.loc[("gpu", "energy_j"), "pairs"] == 1
    assert floor.loc[("gpu", "energy_j"), "noise_mape"] == pytest.approx(10.0)
    assert floor.loc[("gpu", "mean_power_w"), "noise_mape"] == pytest.approx(10.0)
    assert floor.loc[("gpu", "latency_ms"), "pairs"] == 2
    # no sensor on the cpu: its latency has a noise floor, its energy none (not NaN, not 0)
    cpu = floor.loc["cpu"]
    assert "latency_ms" in cpu.index and not any(t in cpu.index for t in ENERGY_LABELS)


def _features(manifest: pd.DataFrame) -> pd.DataFrame:
    return manifest[["model_id", "mode", "batch"]].assign(flops=1e9, weight_bytes=1e6, activation_bytes=1e6,
                                                         params=1e5)


def test_dataset_with_a_sweep_is_unique_per_power_limit(tmp_path) -> None:
    manifest = manifest_frame(expand_zoo(tiny_config()))
    first = manifest.iloc[0]
    gpu_dir, cpu_dir = tmp_path / "results/traces/gpu", tmp_path / "results/traces/cpu"
    gpu_dir.mkdir(parents=True)
    cpu_dir.mkdir(parents=True)

    def rows(device: str, repeat: int, limit: float, swept: bool, **energy: Any) -> pd.DataFrame:
        frame = run_rows(first["config_id"], device, [4.0, 4.0, 4.0], batch=int(first["batch"]), repeat=repeat,
                         limit=limit, swept=swept, **energy)
        return frame.assign(model_id=first["model_id"], mode=first["mode"]).drop(columns=["device", "trace_file"])

    pd.concat([rows("gpu", r, w, True, **window(w / 2, w / 2)) for r in (0, 1) for w in (150.0, 300.0)]).to_parquet(
        gpu_dir / "s0000.parquet")
    rows("cpu", 0, math.nan, False).to_parquet(cpu_dir / "s0000.parquet")
    write_json(tmp_path / "gpu.json", GPU_HW)
    write_json(tmp_path / "cpu.json", CPU_HW)
    data, noise, _ = build_dataset(manifest, _features(manifest),
                                   [str(gpu_dir / "s0000.parquet"), str(cpu_dir / "s0000.parquet")],
                                   [str(tmp_path / "gpu.json"), str(tmp_path / "cpu.json")])
    assert len(data) == 3
    assert not data.duplicated(["model_id", "device", "mode", "batch", "power_limit_w"]).any()
    gpu = data[data["device"] == "gpu"].set_index("power_limit_w")
    assert gpu.loc[150.0, "energy_j"] == pytest.approx(75.0 / 50) and gpu.loc[300.0, "energy_j"] == pytest.approx(3.0)
    assert gpu.loc[150.0, "hw_power_limit_w"] == 150.0 and gpu["row_id"].str.endswith(("|150W", "|300W")).all()
    cpu = data[data["device"] == "cpu"].iloc[0]
    assert cpu["row_id"].endswith("|-") and math.isnan(cpu["energy_j"]) and math.isnan(cpu["hw_power_limit_w"])
    assert noise.set_index(["device", "target"]).loc[("gpu", "latency_ms"), "pairs"] == 2


# -- the energy rule -----------------------------------------------------------------------------------


def _synthetic_sweep(manifest: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Trace and sensor tables of a sweep of one config: P = min(limit, 220 W), T = 2 s x 300 / limit."""
    config = manifest.iloc[0].to_dict()
    tasks, done = [], {}
    t_start = 10**12
    for repeat in (0, 1):
        for limit in (150.0, 200.0, 250.0, 300.0):
            task = Task(config, repeat, limit)
            duration, power = 2.0 * 300.0 / limit, min(limit, 220.0) + 3.0 * repeat
            t = np.arange(0.0, duration + 1e-9, 0.02)
            sensors = [{"t_ns": int(t_start + x * 1e9), "power_w": power, "gpu_util": 90.0, "mem_util": 40.0,
                        "sm_clock_mhz": 1410.0, "mem_clock_mhz": 1215.0, "temp_c": 55.0, "mem_used_mb": 1234.0,
                        "power_limit_w": limit} for x in t]
            t_start += int(60e9)
            extra = {"threads": 1, "power_limit_w": limit, "window_s": duration, "window_iters": 100,
                     "window_energy_counter_j": power * duration * 1.01, "window_energy_samples_j": power * duration,
                     "energy_disagreement": -0.0099, "power_source": "instant", "sensor_errors": 0,
                     "energy_message": "", "sensors": sensors}
            m = {"times_ms": [duration * 10.0] * 3, "peak_mem_mb": 100.0, "n_warmup": 1, "stop_reason": "max_iters",
                 "extra": extra}
            tasks.append(task)
            done[task.key] = {"status": "ok", "message": "", "measurement": m}
    return traces_frame(tasks, done), sensors_frame(tasks, done)


SNAKEFILE = """\
from snakemake.utils import validate


configfile: "config.yaml"


validate(config, "src/perfzoo/schemas/config.schema.yaml")


include: "rules/common.smk"
include: "rules/energy.smk"


rule all:
    input:
        energy_targets,
    default_target: True
"""


@pytest.mark.e2e
def test_energy_rule_regenerates_seed_002_analysis(tmp_path) -> None:
    for name in ("src", "rules", "workflow", "report", "envs"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    config = tiny_config()
    config["devices"]["gpu"] = {"kind": "cuda", "gpu_name": "A100", "power_limits_w": [150, 200, 250, 300],
                                "sweep_repetitions": 2}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    manifest = manifest_frame(expand_zoo(config))
    (tmp_path / "results/zoo").mkdir(parents=True)
    manifest.to_parquet(tmp_path / "results/zoo/manifest.parquet")
    traces, sensors = _synthetic_sweep(manifest)
    out = tmp_path / "results/traces/gpu"
    out.mkdir(parents=True)
    traces.to_parquet(out / "s0000.parquet")
    sensors.to_parquet(out / "s0000.sensors.parquet")
    traces.iloc[:0].to_parquet(out / "s0001.parquet")  # a shard of the device without rows
    sensors.iloc[:0].to_parquet(out / "s0001.sensors.parquet")

    snakemake(tmp_path, snakefile=tmp_path / "Snakefile", cores=1)
    energy_dir = tmp_path / "results/energy/gpu"
    assert not (tmp_path / "results/energy/cpu").exists()  # only devices of kind cuda
    summary = pd.read_csv(energy_dir / "summary.csv")
    assert sorted(summary["limit_w"]) == [150.0, 200.0, 250.0, 300.0] and (summary["n_runs"] == 2).all()
    row = summary.set_index("limit_w").loc[300.0]
    assert row["energy_j_mean"] == pytest.approx((220 + 223) / 2 * 2.0, rel=0.01)
    assert row["duration_s_mean"] == pytest.approx(2.0, rel=0.01)
    fits = pd.read_csv(energy_dir / "fits.csv").set_index("metric")
    assert set(fits.index) == {"energy_j", "duration_s", "edp_js"} and (fits["r2"] > 0.9).all()
    assert "label" in fits.columns
    counter = pd.read_csv(energy_dir / "counter_vs_samples.csv")
    assert len(counter) == 8 and counter["energy_disagreement"].notna().all()
    jitter = pd.read_csv(energy_dir / "jitter.csv").iloc[0]
    assert jitter["mean_hz"] == pytest.approx(50.0, rel=0.01)
    for figure in ("power_over_time", "cumulative_energy", "metrics_vs_limit", "sampling_jitter"):
        assert (energy_dir / f"{figure}.png").stat().st_size > 5000
    prov = json.loads((energy_dir / "provenance.json").read_text())
    assert prov["showcase"]["model_id"] == manifest.iloc[0]["model_id"]
    assert any(k.endswith("s0000.sensors.parquet") for k in prov["inputs"])

    snakemake(tmp_path, "--report", "report.zip", snakefile=tmp_path / "Snakefile", cores=1)
    assert (tmp_path / "report.zip").stat().st_size > 10_000
