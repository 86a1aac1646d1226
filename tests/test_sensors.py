"""Sensor-log ingestion and energy fidelity on real GPU traces (tests/fixtures/gpu-power, a subset of
the GPU_Power_Benchmark artifact): reference numbers are computed here independently with numpy."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT, snakemake, tiny_config

from perfzoo.energy import energy_from_samples
from perfzoo.io import InputError
from perfzoo.sensors.fidelity import (
    fidelity_table,
    find_runs,
    load_run,
    plot_meter_vs_nvml,
    read_edges_ns,
    window_bounds,
    window_energies,
)
from perfzoo.sensors.pmd import read_pmd
from perfzoo.sensors.smi import read_sensor_log, read_smi_csv

FIXTURES = Path(__file__).parent / "fixtures" / "gpu-power"
A100 = FIXTURES / "5050" / "A100"
RTX3090 = FIXTURES / "5050" / "3090"
UTC_OFFSET_H = 1.0  # the fixtures' nvidia-smi clock: local time at UTC+1 (fixtures README)


def _plain_meter(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """Meter (t in s since the epoch, P in W) decoded record by record from the format's description."""
    data = (folder / "PMD_data.bin").read_bytes()
    start_s = int((folder / "PMD_start_ts.txt").read_text()) / 1e6 - 0.05
    times, powers, elapsed, previous = [], [], 0, None
    for off in range(0, len(data), 18):
        words = [int.from_bytes(data[off + 2 * k: off + 2 * k + 2], "little") for k in range(9)]
        if previous is not None:
            elapsed += (words[0] - previous) % 65536
        previous = words[0]
        power = 0.0
        for pair in range(4):
            raw = [((w - 65536 if w >= 32768 else w) >> 4) & 0xFFF for w in words[1 + 2 * pair: 3 + 2 * pair]]
            raw = [0 if r & 0x800 else r for r in raw]
            power += raw[0] * (0.0075 if pair == 2 else 0.007568) * raw[1] * 0.0488
        times.append(start_s + elapsed / 2934.5 / 1000)
        powers.append(power)
    return np.array(times), np.array(powers)


def test_smi_log_read_with_units_and_utc_offset() -> None:
    samples = read_smi_csv(A100 / "gpudata.csv", utc_offset_h=1.0)
    first = (A100 / "gpudata.csv").read_text().splitlines()[1].split(", ")
    expected_s = datetime.strptime(first[0] + " +0100", "%Y/%m/%d %H:%M:%S.%f %z").timestamp()
    assert samples["t_ns"].iloc[0] == round(expected_s * 1000) * 10**6
    assert samples["power_w"].iloc[0] == float(first[5])
    assert samples["power_instant_w"].iloc[0] == float(first[6])
    assert list(samples["pstate"].unique()) == ["P0"]
    shifted = read_smi_csv(A100 / "gpudata.csv", utc_offset_h=0.0)
    assert (shifted["t_ns"] - samples["t_ns"] == 3600 * 10**9).all()


def test_smi_log_any_column_order_subset_and_nounits(tmp_path: Path) -> None:
    log = tmp_path / "smi.csv"
    log.write_text("power.draw, timestamp, memory.used\n130.5, 2024/01/02 03:04:05.250, 1024\n"
                   "[N/A], 2024/01/02 03:04:05.350, 2048\n")
    samples = read_smi_csv(log, utc_offset_h=-5)
    assert samples["t_ns"].tolist() == [1704182645250000000, 1704182645350000000]
    assert samples["power_w"].iloc[0] == 130.5 and np.isnan(samples["power_w"].iloc[1])
    assert samples["mem_used_mb"].tolist() == [1024.0, 2048.0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2024/01/02 03:04:05.250, 130.5\n", "line 1: not an nvidia-smi --query-gpu CSV log"),
        ("model, device, batch\nresnet, a100, 8\n", "expected a header with 'timestamp'"),
        ("timestamp, power.draw [W]\n2024/01/02 03:04:05.250, 13O.5 W\n", "line 2, column 2 (power.draw)"),
        ("timestamp, power.draw [W]\n02.01.2024 03:04, 130.5 W\n", "line 2, column 1 (timestamp)"),
        ("timestamp, power.draw [mW]\n2024/01/02 03:04:05.250, 130500\n", "column 2 ('power.draw [mW]'): unit 'mW'"),
        ("timestamp, power.draw [W]\n2024/01/02 03:04:05.250\n", "line 2: 1 columns, header has 2"),
    ],
)
def test_bad_smi_logs_refused_with_file_line_column(tmp_path: Path, text: str, message: str) -> None:
    log = tmp_path / "bad.csv"
    log.write_text(text)
    with pytest.raises(InputError, match=str(log)) as info:
        read_smi_csv(log, utc_offset_h=0)
    assert message in str(info.value)


def test_sensor_log_needs_explicit_offset_and_reads_perfzoo_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="UTC offset"):
        read_sensor_log(A100 / "gpudata.csv")
    own = tmp_path / "x.sensors.parquet"
    pd.DataFrame({"t_ns": [1, 2], "power_w": [50.0, 60.0], "gpu_util": [1.0, 2.0]}).to_parquet(own)
    assert read_sensor_log(own)["power_w"].tolist() == [50.0, 60.0]
    bad = tmp_path / "bad.csv"
    bad.write_text("t_ns,power_w\n1,50\n2,fifty\n")
    with pytest.raises(InputError, match=r"line 3, column power_w"):
        read_sensor_log(bad)


def test_pmd_reader_matches_plain_decoding() -> None:
    meter = read_pmd(A100 / "PMD_data.bin", int((A100 / "PMD_start_ts.txt").read_text()))
    t_s, p_w = _plain_meter(A100)
    assert len(meter) == len(t_s) == (A100 / "PMD_data.bin").stat().st_size // 18
    np.testing.assert_allclose(meter["power_w"], p_w, rtol=1e-12)
    np.testing.assert_allclose(meter["t_ns"] / 1e9, t_s, atol=2e-6)


def test_meter_window_energy_equals_plain_trapezoid() -> None:
    run = load_run(A100, UTC_OFFSET_H)
    t_s, p_w = _plain_meter(A100)
    t_s = t_s - run.meter_shift_ms / 1e3
    bounds = window_bounds(run.edges_ns, 0.5)
    got = window_energies(run.meter["t_ns"], run.meter["power_w"], bounds, "trapezoid")
    a, b = bounds[0] / 1e9, bounds[1] / 1e9
    inside = (t_s >= a) & (t_s <= b)
    plain = np.trapezoid(p_w[inside], t_s[inside])
    assert got[0] == pytest.approx(plain, rel=2e-3)
    assert 60 < got[0] < 110  # 0.5 s of a 60/190 W duty cycle


def test_nvml_window_energy_equals_held_sample_sum() -> None:
    run = load_run(RTX3090, UTC_OFFSET_H)
    bounds = window_bounds(run.edges_ns, 1.0)
    got = window_energies(run.smi["t_ns"], run.smi["power_w"], bounds, "rectangle")[0]
    t, p = run.smi["t_ns"].to_numpy(), run.smi["power_w"].to_numpy()
    inside = (t > bounds[0]) & (t < bounds[1])
    grid = np.concatenate([[bounds[0]], t[inside], [bounds[1]]])
    held = np.concatenate([[p[t <= bounds[0]][-1]], p[inside]])
    assert got == pytest.approx(float(np.dot(np.diff(grid) / 1e9, held)), rel=1e-6)
    whole = energy_from_samples(t, p)
    assert whole == pytest.approx(float(np.dot(np.diff(t) / 1e9, p[:-1])), rel=1e-6)


def test_edges_and_alignment_on_real_traces() -> None:
    edges = read_edges_ns(A100 / "timestamps.csv")
    assert np.all(np.diff(edges) > 0) and 0.04e9 < np.median(np.diff(edges)) < 0.07e9
    run = load_run(A100, UTC_OFFSET_H)
    assert abs(run.meter_shift_ms) < 5  # the 50 ms lead of the artifact already aligns within ms


def test_fidelity_table_on_fixtures_shows_field_lag_and_sampling_error() -> None:
    runs = [load_run(p, UTC_OFFSET_H) for p in find_runs(FIXTURES)]
    assert [(r.gpu, r.load) for r in runs] == [("3090", "duty-50%"), ("A100", "duty-50%")]
    table = fidelity_table(runs, windows_s=(0.1, 1.0))
    rtx = table[(table["gpu"] == "3090") & (table["alignment"] == "raw")].set_index(["field", "window_s"])
    lag = rtx.groupby(level="field")["lag_ms"].first()
    assert lag["power.draw"] > 3 * lag["power.draw.instant"]  # the 1-s average lags the instant field
    a100 = table[(table["gpu"] == "A100") & (table["window_s"] == 0.1) & (table["alignment"] == "raw")]
    assert (a100["mean_abs_err_pct"] > 15).all()  # a sensor averaging part of each update aliases
    for row in table.itertuples():
        if row.alignment == "raw":
            assert row.n_windows >= 1 and np.isfinite(row.mean_err_pct)
        else:  # shifted by the field's lag, a window can run past the last sample: missing, never 0
            assert (row.n_windows >= 1) == np.isfinite(row.mean_err_pct)
    assert not table.loc[(table["gpu"] == "3090") & (table["alignment"] == "lag"), "n_windows"].all()


def test_figure_written(tmp_path: Path) -> None:
    runs = [load_run(p, UTC_OFFSET_H) for p in find_runs(FIXTURES)]
    for suffix in ("png", "pdf"):
        out = plot_meter_vs_nvml(runs, tmp_path / f"f.{suffix}")
        assert out.stat().st_size > 10_000


def test_cli_sensors_command(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    out = tmp_path / "s.parquet"
    ok = subprocess.run([sys.executable, "-m", "perfzoo", "sensors", str(A100 / "gpudata.csv"), "-o", str(out),
                         "--utc-offset", "1"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert len(pd.read_parquet(out)) == len((A100 / "gpudata.csv").read_text().splitlines()) - 1
    headerless = tmp_path / "h.csv"
    headerless.write_text("\n".join((A100 / "gpudata.csv").read_text().splitlines()[1:]))
    bad = subprocess.run([sys.executable, "-m", "perfzoo", "sensors", str(headerless), "-o", str(out),
                          "--utc-offset", "1"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr and "h.csv: line 1" in bad.stderr


SNAKEFILE = """\
from snakemake.utils import validate


configfile: "config.yaml"


validate(config, "src/perfzoo/schemas/config.schema.yaml")


include: "rules/common.smk"
include: "rules/sensors.smk"


rule all:
    input:
        sensors_targets,
    default_target: True
"""


def _workflow(tmp_path: Path, config: dict[str, object]) -> subprocess.CompletedProcess[str]:
    for name in ("src", "rules", "workflow", "report", "envs"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return snakemake(tmp_path, snakefile=tmp_path / "Snakefile", cores=1, check=False)


@pytest.mark.e2e
def test_sensor_logs_rule_writes_table_and_figures(tmp_path: Path) -> None:
    config = {**tiny_config(), "sensor_logs": [{"path": str(FIXTURES / "5050"), "utc_offset_h": 1}]}
    proc = _workflow(tmp_path, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(tmp_path / "results/sensors/energy_fidelity.csv")
    direct = fidelity_table([load_run(p, UTC_OFFSET_H) for p in find_runs(FIXTURES)])
    pd.testing.assert_frame_equal(table, direct.round(4), check_dtype=False, atol=1e-4)
    for suffix in ("png", "pdf"):
        assert (tmp_path / f"results/sensors/meter_vs_nvml.{suffix}").stat().st_size > 10_000


@pytest.mark.e2e
def test_no_sensor_logs_no_sensor_outputs(tmp_path: Path) -> None:
    proc = _workflow(tmp_path, tiny_config())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sensors_energy_fidelity" not in proc.stderr and not (tmp_path / "results/sensors").exists()


def test_perfzoo_import_points_smi_logs_to_sensors_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perfzoo.dataset.external import external_main

    code = external_main([str(A100 / "gpudata.csv"), "-o", str(tmp_path / "x.parquet"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "x.parquet").exists()
    assert "gpudata.csv: an nvidia-smi sensor log" in err and "perfzoo sensors" in err and err.count("\n") == 1


def test_energy_analysis_runs_on_real_nvml_samples() -> None:
    from perfzoo.energy import resample_cubic, run_energy

    frames = []
    for repeat, folder in enumerate((A100, RTX3090)):
        smi = read_smi_csv(folder / "gpudata.csv", utc_offset_h=1.0)
        frames.append(smi.assign(model_id="duty50", mode="inference", batch=1, repeat=repeat))
    runs = run_energy(pd.concat(frames, ignore_index=True)).set_index("repeat")
    for repeat, frame in enumerate(frames):
        t_s = (frame["t_ns"].to_numpy() - frame["t_ns"].iloc[0]) / 1e9
        p = frame["power_w"].to_numpy()
        plain = sum((t_s[i + 1] - t_s[i]) * p[i] for i in range(len(p) - 1))
        assert runs.loc[repeat, "energy_j"] == pytest.approx(plain, rel=1e-7)  # epoch ns as float64 s
        assert runs.loc[repeat, "duration_s"] == pytest.approx(t_s[-1], rel=1e-12)
        assert runs.loc[repeat, "n_samples"] == len(frame)
    grid, power = resample_cubic((frames[0]["t_ns"] - frames[0]["t_ns"].iloc[0]) / 1e9, frames[0]["power_w"])
    assert np.allclose(np.diff(grid), 0.25) and grid.size == int(runs.loc[0, "duration_s"] * 4) + 1
    assert np.nanmedian(power) == pytest.approx(np.median(frames[0]["power_w"]), rel=0.2)
