"""The report: one registry of outputs, figures of tables only, a page that answers first, group-readable files."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from perfzoo import plotting
from perfzoo.report import figures
from perfzoo.evaluate import best_per_target, error_quantiles, metrics_table, per_family_table
from perfzoo.io import write_text
from perfzoo.report.html import FIGURE_DRAWERS, build_report, report_tables
from perfzoo.report.registry import REPORT_OUTPUTS, outputs, snakemake_report_args
from perfzoo.report.page import NOT_COMPUTED, fmt, health_line, render_index

FAMILIES = {"resnet": ["resnet18", "resnet50"], "vit": ["vit_a", "vit_b"], "mlp": ["mlp_s", "mlp_b"]}
PROV = {"code_version": "test", "tables": {}, "figures": {}}


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def dataset() -> pd.DataFrame:
    rows = []
    for family, labels in FAMILIES.items():
        for i, label in enumerate(labels):
            for batch in (1, 4, 16):
                lat = (i + 1) * 2.0 * batch ** 0.8
                rows.append({"model_id": label, "label": label, "family": family, "mode": "inference",
                             "device": "cpu", "batch": batch, "latency_ms": lat, "latency_ci_lo": lat * 0.97,
                             "latency_ci_hi": lat * 1.03, "cv": 0.02 + 0.001 * batch, "peak_mem_mb": 10.0 * batch})
    return pd.DataFrame(rows)


def held_out(data: pd.DataFrame) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for split in ("random", "batch_extrapolation"):
        for regressor, scale in (("linear", 0.3), ("random_forest", 0.05)):
            for target in ("latency_ms", "peak_mem_mb"):
                for r in data.itertuples():
                    y = getattr(r, target)
                    rows.append({"target": target, "regressor": regressor, "split": split, "fold": 0, "set": "test",
                                 "y_true": y, "y_pred": y * (1 + rng.normal(0, scale)), "family": r.family,
                                 "model_id": r.model_id, "mode": r.mode, "device": r.device, "label": r.label,
                                 "batch": r.batch})
    return pd.DataFrame(rows)


def record() -> dict:
    q = {"latency_ms": {"value": 12.345, "lo": 10.01, "hi": 14.6},
         "peak_mem_mb": {"value": 14840.0, "lo": 12000.0, "hi": 17900.0},
         "energy_per_sample_j": {"value": float("nan"), "lo": float("nan"), "hi": float("nan"),
                                 "missing": "no energy sensor on device cpu"},
         "cost_per_1k_samples": {"value": 0.08333, "lo": 0.07, "hi": 0.1}}
    return {"name": "resnet50_b8", "model": {"text": "torchvision:resnet50", "batch": 8, "mode": "inference"},
            "devices": {"cpu": {"quantities": q, "mig": None}},
            "recommendation": {"device": "cpu", "metric": "latency_ms", "value": 12.345, "unit": "ms"},
            "warnings": ["batch 8 is above the largest profiled batch (4)"]}


def tables_for(data: pd.DataFrame, predictions: pd.DataFrame, metrics: pd.DataFrame | None = None,
               flagged: list[int] | None = None) -> dict:
    noise = pd.DataFrame({"target": ["latency_ms", "peak_mem_mb"], "noise_mape": [4.0, 0.5], "pairs": [5, 5]})
    metrics = metrics_table(predictions, noise) if metrics is None else metrics
    statuses = pd.DataFrame({"device": ["cpu", "cpu"], "status": ["ok", "error"], "configs": [17, 1],
                             **({"flagged": flagged} if flagged is not None else {})})
    ablation = pd.DataFrame({"target": ["latency_ms"] * 2, "regressor": ["linear"] * 2, "split": ["random"] * 2,
                             "features": ["model only", "model + hardware"], "mape": [30.0, 20.0]})
    importance = pd.DataFrame({"target": ["latency_ms"] * 2, "regressor": ["random_forest"] * 2,
                               "split": ["random"] * 2, "feature": ["flops", "params"], "importance": [0.7, 0.3]})
    return report_tables(predictions, metrics, per_family_table(predictions), best_per_target(metrics), noise,
                         statuses, ablation, importance, pd.DataFrame([{"prediction": "resnet50_b8"}]),
                         pd.DataFrame(), pd.DataFrame())


def test_atomic_writes_follow_the_umask(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "shared.txt", "x")
        os.umask(0o077)
        write_text(tmp_path / "private.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shared.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "private.txt").stat().st_mode) == 0o600


def test_numbers_for_people() -> None:
    assert fmt(0.08333) == "0.0833" and fmt(14840.0, "MB") == "14,800 MB" and fmt(-2.217e5) == "-222,000"
    assert fmt(8.99e12, "%") == "8.99 × 10¹²%" and fmt(12.345, "ms") == "12.3 ms" and fmt(4.0, "%") == "4.00%" and fmt(float("nan")) == "–"


def test_registry_names_captions_and_snakemake_flags() -> None:
    names = [o.name for o in REPORT_OUTPUTS]
    assert len(names) == len(set(names)) and len({o.file for o in REPORT_OUTPUTS}) == len(names)
    for o in REPORT_OUTPUTS:
        assert o.caption_file.exists() and "seed 00" not in o.caption, o.name
        assert o.kind in ("table", "figure") and (o.vector_file or "").endswith(".pdf") == (o.kind == "figure")
    args = snakemake_report_args(outputs(rule="energy", kind="figure")[0], "gpu")
    assert args["subcategory"] == "gpu" and Path(args["caption"]).is_absolute() and args["category"] == "Energy"


def test_build_report_writes_every_registry_output_readable_by_the_group(tmp_path, umask_022) -> None:
    data = dataset()
    predictions = held_out(data)
    tables = tables_for(data, predictions)
    (tmp_path / "rec.json").write_text(json.dumps(record()))
    build_report(tmp_path, data, predictions, tables, ["1 config(s) on cpu ended with status error"], PROV,
                 [str(tmp_path / "rec.json")])
    for entry in outputs(rule="report"):
        assert (tmp_path / entry.file).stat().st_size > 0, entry.file
        if entry.kind == "figure":
            pdf = (tmp_path / entry.vector_file).read_bytes()
            assert pdf.startswith(b"%PDF"), entry.vector_file
            with Image.open(tmp_path / entry.file) as png:
                dpi = png.info.get("dpi", (0, 0))[0]
                assert dpi >= 200 and png.size[0] / dpi == pytest.approx(plotting.COLUMN_WIDTH_IN, abs=0.05)
    index = tmp_path / "results/report/index.html"
    assert stat.S_IMODE(index.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "results/report/figures/error_cdf.png").stat().st_mode) == 0o644


def test_figures_drawn_in_two_forked_processes_are_the_files_one_process_writes(tmp_path) -> None:
    data = dataset()
    predictions = held_out(data)
    tables = tables_for(data, predictions)
    for workers in (1, 2):
        build_report(tmp_path / str(workers), data, predictions, tables, [], PROV, [], workers=workers)
    entries = outputs(rule="report", kind="figure")
    assert entries and {e.name for e in entries} == set(FIGURE_DRAWERS)  # every figure of the registry drawn
    for entry in entries:
        for file in (entry.file, entry.vector_file):
            assert (tmp_path / "1" / file).read_bytes() == (tmp_path / "2" / file).read_bytes(), file


def first_screen(html: str) -> str:
    """The page up to its table of contents (what a reader sees before scrolling to details)."""
    return html[: html.index('id="contents"')]


def test_page_answers_first_with_formatted_numbers_and_intervals(tmp_path) -> None:
    data = dataset()
    predictions = held_out(data)
    html = render_index(tmp_path, tables_for(data, predictions), [record()],
                        ["1 config(s) on cpu ended with status error"], PROV)
    top = first_screen(html)
    assert top.index("Recommended: cpu") < top.index("Can these numbers be trusted?")
    assert "12.3 ms" in top and "10.0–14.6 ms" in top and "14,800 MB" in top and "0.0833" in top
    assert "no energy sensor on device cpu" in top  # a missing energy is said, with its reason
    assert "above the largest profiled batch" in top  # the warning's text, not its count
    assert "Latency (ms): best MAPE" in top and "random split" in top and "noise floor 4.00%" in top
    assert re.search(r"best MAPE [\d.]+% \[90 % interval [\d.]+–[\d.]+%, resampling held-out models\]", top)
    assert "on the hardest split" in top
    assert "1 of 18 profiled configs failed" in top
    assert top.count(NOT_COMPUTED) >= 3  # baseline, interval coverage, interference flags absent
    assert html.index("Contents") < html.index("<details>")
    assert "1 config(s) on cpu ended with status error" in html
    assert not re.search(r"[1-9]\d*\.\d{3,}|0\.0*[1-9]\d{3,}", top) and "e+0" not in html  # ≤ 3 significant digits


def test_first_screen_says_so_when_no_model_is_configured_to_predict(tmp_path) -> None:
    data = dataset()
    top = first_screen(render_index(tmp_path, tables_for(data, held_out(data)), [], [], PROV))
    assert "no model configured under <code>predict:</code>" in top and "Recommended:" not in top
    assert "best MAPE" in top


def test_page_shows_baseline_coverage_and_flags_when_other_stages_write_them(tmp_path) -> None:
    data = dataset()  # the dataset stage counts flagged configs in its status table (and fits clean rows only)
    predictions = held_out(data)
    noise = pd.DataFrame({"target": ["latency_ms", "peak_mem_mb"], "noise_mape": [4.0, 0.5],
                          "noise_lo90": [2.5, 0.3], "noise_hi90": [6.0, 0.8]})
    metrics = metrics_table(predictions, noise).assign(
        best_baseline="baseline:flops_nearest", best_baseline_mape=1000.0, coverage90=0.9, n_interval=40)
    baseline_row = metrics.iloc[:1].assign(regressor="baseline:flops_nearest", mape=0.001)
    metrics = pd.concat([metrics, baseline_row], ignore_index=True)  # never reported as the best regressor
    tables = tables_for(data, predictions, metrics, flagged=[1, 0])
    top = first_screen(render_index(tmp_path, tables, [record()], [], PROV))
    assert "best baseline (baseline:flops_nearest) 1,000%" in top and "(beats it)" in top
    assert "best MAPE 0.001" not in top
    assert "noise floor 4.00% [90 % interval 2.50–6.00%]" in top  # the floor's own uncertainty beside it
    assert "90.0% of 40 held-out values inside the 90 % interval" in top and "outside the" not in top
    assert "1 flagged for interference" in top and NOT_COMPUTED not in top


def test_coverage_outside_the_band_or_missing_is_said_so() -> None:
    from perfzoo.report.page import _coverage_text

    metrics = pd.DataFrame({"coverage90": [0.8, np.nan], "n_interval": [15, 0],
                            "interval_missing": ["", "15 of 15 test rows without an interval: 14 calibration residuals"]})
    low, missing = (_coverage_text(metrics, row) for _, row in metrics.iterrows())
    assert low == "80.0% of 15 held-out values inside the 90 % interval, outside the 85%–95% band of a calibrated interval"
    assert missing == f"interval coverage {NOT_COMPUTED} (15 of 15 test rows without an interval: 14 calibration residuals)"


def test_figures_keep_one_colour_per_regressor_across_panels() -> None:
    data = dataset()
    fig = figures.error_cdf(error_quantiles(held_out(data)))
    colours = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label() in ("linear", "random_forest"):
                colours.setdefault(line.get_label(), set()).add(line.get_color())
    assert colours == {"linear": {plotting.regressor_color("linear")},
                       "random_forest": {plotting.regressor_color("random_forest")}}
    assert max(ax.get_subplotspec().colspan.stop for ax in fig.axes if ax.get_visible()) <= 2  # a grid, not a strip


def test_first_screen_counts_flagged_configs_and_warns_about_a_high_noise_floor() -> None:
    statuses = pd.DataFrame({"device": ["cpu", "cpu"], "status": ["error", "ok"], "configs": [1, 20],
                             "flagged": [0, 3]})
    noise = pd.DataFrame({"device": ["cpu", "cpu"], "target": ["latency_ms", "peak_mem_mb"], "pairs": [5, 5],
                          "noise_mape": [12.5, 0.4]})
    line = health_line(statuses, noise, [], 0)
    assert "1 of 21 profiled configs failed" in line
    assert "3 flagged for interference (of 21 configs; measured while the machine was disturbed" in line
    assert "latency noise floor on cpu is 12.5%, above 10 %" in line
    assert "peak memory noise floor" not in line
    quiet = health_line(statuses.drop(columns="flagged"), noise.assign(noise_mape=[4.0, 0.4]), [], 0)
    assert "interference flags not computed" in quiet and "warning:" not in quiet


def test_first_screen_counts_imported_models_without_a_time_apart_from_the_profiled_configs() -> None:
    from perfzoo.dataset.build import NOT_MEASURED_STATUS

    statuses = pd.DataFrame({"device": ["cpu", "H200 SXM pt211-cu130"], "status": ["ok", NOT_MEASURED_STATUS],
                             "configs": [20, 1], "flagged": [2, None]})
    noise = pd.DataFrame({"device": ["cpu"], "target": ["latency_ms"], "pairs": [5], "noise_mape": [4.0]})
    line = health_line(statuses, noise, [], 0)
    assert line.startswith("0 of 20 profiled configs failed (oom, error or timeout); 1 imported config(s) not "
                           "measured in their table (no time, left out); 2 flagged for interference (of 20 configs;")
    imported_only = health_line(statuses.iloc[1:].drop(columns="flagged"), noise.iloc[:0], [], 0)
    assert imported_only.startswith("0 of 0 profiled configs failed (oom, error or timeout); 1 imported config(s)")


def test_first_screen_warns_when_the_memory_reference_moved_between_shards_or_since_the_hardware_rule() -> None:
    statuses = pd.DataFrame({"device": ["cpu"], "status": ["ok"], "configs": [3]})
    noise = pd.DataFrame({"device": ["cpu"], "target": ["latency_ms"], "pairs": [2], "noise_mape": [3.0]})
    rows = pd.DataFrame({"device": ["cpu", "cpu", "cpu", "gpu"], "memory_reference_mb": [95.0, 95.5, 95.2, None],
                         "memory_reference_hardware_mb": [95.1, 95.1, 95.1, None]})
    steady = health_line(statuses, noise, [], 0, rows)
    assert "memory reference on cpu: 95.0-95.5 MB over 3 rows (hardware rule: 95.1 MB)" in steady
    assert "warning:" not in steady and "on gpu" not in steady  # a CUDA device has none: nothing said
    shifted = health_line(statuses, noise, [], 0, rows.assign(memory_reference_mb=[95.0, 66.0, 95.2, None]))
    assert "warning: memory reference on cpu: 66.0-95.2 MB over 3 rows (hardware rule: 95.1 MB), 44 % apart" in shifted
    since = health_line(statuses, noise, [], 0, rows.assign(memory_reference_hardware_mb=[80.0] * 4))
    assert "warning: memory reference on cpu" in since  # the run's shards agree, the hardware rule's differs
    assert "memory reference" not in health_line(statuses, noise, [], 0, rows.drop(columns="memory_reference_mb"))
