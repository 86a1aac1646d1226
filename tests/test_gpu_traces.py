"""The GPU path on real traces: a workflow finished from traces measured on an NVIDIA H100.

``tests/fixtures/gpu-h100/`` holds what ``bench/gpu_run.sh`` measured with ``config/gpu-local.yaml`` (20 configs,
fp32 and AMP, inference and training; its README names the GPU, driver, CUDA and torch). Here the
measurement outputs are copied into a fresh workflow folder and marked up to date (``snakemake --touch``,
as a cluster's login node finishes what its GPU nodes measured), then the rest of the workflow runs for real:
features, dataset with energy labels, fits, the energy analysis of the sensor samples, predictions (with
MIG advice) and the report.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT, copy_workflow, own_code, snakemake

pytestmark = pytest.mark.e2e

FIXTURE = ROOT / "tests" / "fixtures" / "gpu-h100"


def gpu_config() -> dict:
    """config/gpu-local.yaml with fewer fits, mean power as a third target and a second prediction (fp32)."""
    config = yaml.safe_load((ROOT / "config" / "gpu-local.yaml").read_text())
    config["splits"] = {"schemes": ["random"], "seed": 1337}
    config["fit"] = {"targets": ["latency_ms", "peak_mem_mb", "mean_power_w"], "regressors": ["linear", "random_forest"]}
    config["predict"]["resnet50_b64_h100_fp32"] = {**config["predict"]["resnet50_b64_h100"], "precision": "fp32"}
    return config


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    folder = copy_workflow(tmp_path_factory.mktemp("gpu") / "perfzoo", gpu_config())
    shutil.copytree(FIXTURE / "results", folder / "results")
    snakemake(folder, "--touch", "profile_h100", **own_code(folder), timeout=300)
    run = snakemake(folder, **own_code(folder), timeout=900)
    assert "rule trace_h100" not in run.stderr and "rule hardware_h100" not in run.stderr  # nothing re-measured
    return folder


def test_energy_labels_come_from_the_h100_counter_over_each_window(finished: Path) -> None:
    data = pd.read_parquet(finished / "results" / "dataset" / "dataset.parquet")
    assert len(data) == 20 and set(data["precision"]) == {"fp32", "amp"} and (data["device"] == "h100").all()
    assert (data["energy_source"] == "counter").all() and (data["power_source"] == "instant").all()
    # the label is the counter's energy over the window, per step and per sample; mean power over the window
    per_step = data["window_energy_counter_j"] / data["window_iters"]
    assert data["energy_j"].to_numpy() == pytest.approx(per_step.to_numpy(), rel=1e-9)
    assert data["energy_per_sample_j"].to_numpy() == pytest.approx((per_step / data["batch"]).to_numpy(), rel=1e-9)
    assert data["mean_power_w"].to_numpy() == pytest.approx(
        (data["window_energy_counter_j"] / data["window_s"]).to_numpy(), rel=1e-9)
    assert data["mean_power_w"].between(60, 700).all()  # between the card's idle draw and its 700 W limit
    # amp rows carry the tensor-core GEMM rate the hardware rule measured in fp16
    hw = json.loads((finished / "results" / "hardware" / "h100.json").read_text())
    amp = data[data["precision"] == "amp"]
    assert (amp["hw_tensor_cores"] == 1.0).all()
    assert amp["hw_peak_gflops"].to_numpy() == pytest.approx(hw["measured_gemm_tflops"]["fp16"] * 1000)


def test_energy_analysis_of_the_h100_sensor_samples(finished: Path) -> None:
    windows = pd.read_csv(finished / "results" / "energy" / "h100" / "counter_vs_samples.csv")
    assert len(windows) == 26  # 20 configs + 6 repeats of the noise floor
    # each window's two energies as the trace recorded them, and their disagreement recomputed from them
    traces = pd.concat(pd.read_parquet(f) for f in sorted((FIXTURE / "results" / "traces" / "h100").glob("s*[0-9].parquet")))
    recorded = traces.drop_duplicates(["model_id", "mode", "repeat"]).set_index(["model_id", "mode", "repeat"])
    merged = windows.merge(recorded[["window_energy_counter_j", "window_energy_samples_j"]].reset_index(),
                           on=["model_id", "mode", "repeat"], suffixes=("", "_trace"), validate="one_to_one")
    assert len(merged) == 26  # the table's values are printed to 6 significant digits
    assert merged["window_energy_counter_j"].to_numpy() == pytest.approx(merged["window_energy_counter_j_trace"], rel=1e-5)
    counter, samples = merged["window_energy_counter_j_trace"], merged["window_energy_samples_j_trace"]
    expected = (samples - counter) / counter
    assert merged["energy_disagreement"].to_numpy() == pytest.approx(expected.to_numpy(), abs=1e-5)
    assert merged["energy_disagreement"].abs().median() < 0.05  # the H100's two energies of a 2 s window agree
    jitter = pd.read_csv(finished / "results" / "energy" / "h100" / "jitter.csv")
    assert not jitter.empty


def test_predictions_on_the_h100_at_each_precision_with_mig_advice(finished: Path) -> None:
    amp = json.loads((finished / "results" / "predictions" / "resnet50_b64_h100.json").read_text())
    fp32 = json.loads((finished / "results" / "predictions" / "resnet50_b64_h100_fp32.json").read_text())
    assert amp["model"]["precision"] == "amp" and fp32["model"]["precision"] == "fp32"
    for record in (amp, fp32):
        quantities = record["devices"]["h100"]["quantities"]
        for target in ("latency_ms", "peak_mem_mb", "mean_power_w"):
            assert math.isfinite(quantities[target]["value"]), quantities[target]
        assert record["recommendation"]["device"] == "h100"
    rows = {d: r for d, r in zip(("amp", "fp32"), (amp, fp32), strict=True)}
    features = {p: r["feature_rows"]["h100"] for p, r in rows.items()}
    assert features["amp"]["hw_tensor_cores"] == 1.0 and features["fp32"]["hw_tensor_cores"] == 0.0
    assert features["amp"]["hw_peak_gflops"] > 10 * features["fp32"]["hw_peak_gflops"]
    mig = pd.read_csv(finished / "results" / "report" / "tables" / "mig_recommendation.csv")
    assert set(mig["gpu"]) == {"H100-80GB"} and mig["profile"].notna().all()


def test_the_noise_floor_of_the_h100_is_measured_and_reported(finished: Path) -> None:
    noise = pd.read_parquet(finished / "results" / "dataset" / "noise_floor.parquet").set_index("target")
    assert noise.loc["latency_ms", "pairs"] == 6 and noise.loc["latency_ms", "noise_mape"] > 0
    assert noise.loc["peak_mem_mb", "noise_mape"] == 0.0  # the CUDA allocator reserves the same blocks each time
    assert noise.loc["mean_power_w", "pairs"] == 6 and noise.loc["mean_power_w", "noise_mape"] > 0  # energy too
    page = (finished / "results" / "report" / "index.html").read_text()
    assert "h100" in page and "noise floor" in page.lower()
