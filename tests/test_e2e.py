"""End to end: real Snakemake on a seven-config zoo (one fails), numbers recomputed from the raw traces."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfzoo.report.registry import outputs
from perfzoo.stats import mape

from conftest import own_code, snakemake

pytestmark = pytest.mark.e2e

TABLES = ["results/dataset/dataset.parquet", "results/evaluate/metrics.parquet",
          "results/report/tables/metrics.csv", "results/report/tables/per_family.csv",
          "results/report/tables/noise_floor.csv", "results/report/tables/status_counts.csv"]


@pytest.fixture(scope="module")
def run(finished_workflow) -> Path:
    """The session's finished run (``conftest.finished_config``: seven configs, one whose builder fails),
    made under a group-readable umask."""
    return finished_workflow


def test_report_is_built(run) -> None:
    index = (run / "results/report/index.html").read_text()
    for name in ("metrics", "noise_floor", "status_counts", "per_family_mape", "actual_vs_predicted"):
        assert name.replace("_", " ") in index
    assert "sha256" in index and (run / "results/report/figures/latency_vs_batch.png").stat().st_size > 1000


def test_every_registry_output_exists_and_is_group_readable(run) -> None:
    for entry in outputs(rule="report"):
        for path in filter(None, (entry.file, entry.vector_file)):
            assert (run / path).stat().st_size > 0, path
    for path in ("results/report/index.html", "results/report/tables/metrics.csv", "results/dataset/dataset.parquet"):
        assert stat.S_IMODE((run / path).stat().st_mode) == 0o644, path
    index = (run / "results/report/index.html").read_text()
    first_screen = index[: index.index('id="contents"')]
    assert "Recommended: " in first_screen  # the README's prediction (resnet50_b8) answers first
    assert "best MAPE" in first_screen and "1 of 7 profiled configs failed" in first_screen
    assert "memory reference on cpu: " in first_screen and "(hardware rule: " in first_screen


def test_failed_model_is_counted_and_the_rest_measured(run) -> None:
    counts = pd.read_csv(run / "results/report/tables/status_counts.csv").set_index("status")["configs"]
    assert counts.to_dict() == {"error": 1, "ok": 6}
    assert "1 config(s) on cpu ended with status error" in (run / "results/report/index.html").read_text()


def test_reported_numbers_recomputed_from_raw_traces(run) -> None:
    raw = pd.concat([pd.read_parquet(p) for p in sorted((run / "results/traces/cpu").glob("s*[0-9].parquet"))])
    ok = raw[(raw["status"] == "ok") & (raw["interference"].fillna("") == "")]  # disturbed runs are not labels
    medians = ok.groupby(["config_id", "repeat"])["time_ms"].median().unstack()
    pairs = medians.dropna()
    expected = mape(pairs[0].to_numpy(), pairs[1].to_numpy())
    floor = pd.read_csv(run / "results/report/tables/noise_floor.csv").set_index("target")
    assert floor.loc["latency_ms", "noise_mape"] == pytest.approx(expected, rel=1e-5)
    assert floor.loc["latency_ms", "pairs"] == len(pairs)

    data = pd.read_parquet(run / "results/dataset/dataset.parquet")
    manifest = pd.read_parquet(run / "results/zoo/manifest.parquet")
    row = data.iloc[0]
    config_id = manifest[(manifest["model_id"] == row["model_id"]) & (manifest["mode"] == row["mode"])
                         & (manifest["batch"] == row["batch"])]["config_id"].item()
    assert row["latency_ms"] == pytest.approx(medians.loc[config_id, 0])
    measured_with = raw.loc[(raw["config_id"] == config_id) & (raw["repeat"] == 0), "memory_reference_mb"].iloc[0]
    assert row["memory_reference_mb"] == measured_with > 0 and row["memory_reference_hardware_mb"] > 0
    assert np.isnan(row["energy_j"]) and "no energy sensor" in row["energy_missing_reason"]


def test_rerun_on_same_traces_gives_identical_tables(run) -> None:
    before = {t: (run / t).read_bytes() for t in TABLES}
    snakemake(run, "--forcerun", "dataset", **own_code(run))
    after = {t: (run / t).read_bytes() for t in TABLES}
    assert before == after


def test_corrupted_trace_names_the_file_and_keeps_other_outputs(run, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns(".snakemake"))
    trace = copy / "results/traces/cpu/s0000.parquet"
    trace.write_bytes(trace.read_bytes()[:200])
    proc = snakemake(copy, "--forcerun", "dataset", **own_code(copy), check=False)
    assert proc.returncode != 0
    assert "results/traces/cpu/s0000.parquet" in proc.stderr and "corrupted" in proc.stderr
    assert (copy / "results/traces/cpu/s0001.parquet").exists()
    assert (copy / "results/features/models.parquet").exists()
