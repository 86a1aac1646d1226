"""Energy fidelity of NVML's power fields against an external meter, on real traces.

For each run (an nvidia-smi log and a meter log of the same card under a load with known edge times),
the meter is aligned on the load's first rising edge, the NVML fields are taken either on their own
clock (``raw``) or shifted by their measured lag at that edge (``lag``), and the energy of every load
window of a given length is computed from each source with :func:`perfzoo.energy.cumulative_energy`
(E = Δtᵀ·P, sample held until the next one; trapezoid for the meter). The error of a field is
(E_field − E_meter) / E_meter per window.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfzoo.energy import cumulative_energy
from perfzoo.plotting import new_figure, save_figure
from perfzoo.io import InputError
from perfzoo.sensors.pmd import START_LEAD_US, read_pmd, read_start_us
from perfzoo.sensors.smi import read_smi_csv

NVML_FIELDS: dict[str, str] = {"power.draw": "power_w", "power.draw.instant": "power_instant_w"}
WINDOWS_S: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0)
ALIGNMENTS: tuple[str, ...] = ("raw", "lag")
WHOLE_LOAD = "whole load"


@dataclass(frozen=True)
class MeterRun:
    """One recorded run: the nvidia-smi samples, the meter samples (both UTC ns) and the load's edges."""

    name: str
    gpu: str
    load: str
    smi: pd.DataFrame
    meter: pd.DataFrame
    edges_ns: np.ndarray
    meter_shift_ms: float


def _gpu_and_load(folder: Path) -> tuple[str, str]:
    """``5050/A100`` -> (A100, duty-50%); ``Transient_Response/A100_TR`` -> (A100, step)."""
    if folder.name.endswith("_TR"):
        return folder.name[: -len("_TR")], "step"
    return folder.name, "duty-50%"


def read_edges_ns(path: str | os.PathLike[str]) -> np.ndarray:
    """Unique, sorted load-edge times (UTC ns) from a ``timestamps.csv`` of µs epoch times."""
    src = Path(path)
    try:
        frame = pd.read_csv(src)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"{src}: cannot read ({type(exc).__name__})") from None
    if "timestamp" not in frame.columns:
        raise InputError(f"{src}: line 1: expected a 'timestamp' column of µs epoch times")
    values = pd.to_numeric(frame["timestamp"], errors="coerce")
    if values.isna().any():
        line = int(np.flatnonzero(values.isna().to_numpy())[0]) + 2
        raise InputError(f"{src}: line {line}, column timestamp: not an integer of µs since the epoch")
    edges = np.unique(values.to_numpy(dtype="int64")) * 1000
    if edges.size < 2:
        raise InputError(f"{src}: fewer than two load edges")
    return edges


def rising_edge_ns(t_ns: np.ndarray, power_w: np.ndarray, edges_ns: np.ndarray) -> float:
    """Time at which a signal first crosses halfway from idle (before the first edge) to load (first
    load phase) after the first edge; NaN if it never does."""
    t, p = np.asarray(t_ns, dtype="float64"), np.asarray(power_w, dtype="float64")
    idle = np.nanmedian(p[(t < edges_ns[0]) & (t > edges_ns[0] - 1e9)])
    load = np.nanmax(p[(t >= edges_ns[0]) & (t < edges_ns[0] + 2e9)])
    after = np.flatnonzero((t >= edges_ns[0] - 0.2e9) & (p > 0.5 * (idle + load)))
    return float(t[after[0]]) if after.size else float("nan")


def load_run(folder: str | os.PathLike[str], utc_offset_h: float, lead_us: int = START_LEAD_US) -> MeterRun:
    """Read one run folder (gpudata.csv, PMD_data.bin, PMD_start_ts.txt, timestamps.csv); the meter is
    shifted so that its first rising edge falls on the first load edge."""
    root = Path(folder)
    edges = read_edges_ns(root / "timestamps.csv")
    smi = read_smi_csv(root / "gpudata.csv", utc_offset_h)
    meter = read_pmd(root / "PMD_data.bin", read_start_us(root / "PMD_start_ts.txt"), lead_us=lead_us)
    shift = rising_edge_ns(meter["t_ns"].to_numpy(), meter["power_w"].to_numpy(), edges) - edges[0]
    if np.isfinite(shift):
        meter = meter.assign(t_ns=meter["t_ns"] - int(shift))
    gpu, load = _gpu_and_load(root)
    return MeterRun(root.name, gpu, load, smi, meter, edges, shift / 1e6)


RUN_FILES = ("gpudata.csv", "PMD_data.bin", "PMD_start_ts.txt", "timestamps.csv")


def run_folders(path: str | os.PathLike[str]) -> list[Path]:
    """A configured ``sensor_logs`` path as run folders: the folder itself when it is a run, else the runs below it."""
    root = Path(path)
    return [root] if (root / "gpudata.csv").exists() else find_runs(root)


def run_files(path: str | os.PathLike[str]) -> list[Path]:
    """Every file of every run a configured path holds (the rule's inputs; a path without runs is an error)."""
    return [f / name for f in run_folders(path) for name in RUN_FILES if (f / name).exists()]


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """Run folders below ``root`` (those holding a gpudata.csv and a PMD_data.bin), sorted."""
    base = Path(root)
    if not base.is_dir():
        raise InputError(f"{base}: not a folder of sensor runs")
    runs = sorted(p.parent for p in base.rglob("gpudata.csv") if (p.parent / "PMD_data.bin").exists())
    if not runs:
        raise InputError(f"{base}: no run folder with gpudata.csv and PMD_data.bin below it")
    return runs


def window_energies(t_ns: np.ndarray, power_w: np.ndarray, bounds_ns: np.ndarray, method: str) -> np.ndarray:
    """Energy (J) of the signal over each window [bounds[i], bounds[i+1]], from its cumulative energy
    (exact for the held-sample rule); NaN for windows outside the samples."""
    t_s = np.asarray(t_ns, dtype="float64") / 1e9
    cum = cumulative_energy(t_s, power_w, method=method)
    valid = np.sort(t_s[np.isfinite(t_s) & np.isfinite(np.asarray(power_w, dtype="float64"))])
    at = np.interp(np.asarray(bounds_ns, dtype="float64") / 1e9, valid, cum, left=np.nan, right=np.nan)
    return np.diff(at)


def window_bounds(edges_ns: np.ndarray, window_s: float | None) -> np.ndarray:
    """Consecutive windows of ``window_s`` tiling the load span (first to last edge), partial one dropped;
    ``None``: the whole span as one window."""
    span = float(edges_ns[-1] - edges_ns[0])
    if window_s is None:
        return np.asarray([edges_ns[0], edges_ns[-1]], dtype="float64")
    count = int(span // (window_s * 1e9))
    return edges_ns[0] + np.arange(count + 1) * window_s * 1e9


def field_lag_ms(run: MeterRun, column: str) -> float:
    """Delay (ms) of an NVML field's first rising edge after the meter's."""
    crossing = rising_edge_ns(run.smi["t_ns"].to_numpy(), run.smi[column].to_numpy(), run.edges_ns)
    return (crossing - run.edges_ns[0]) / 1e6


def _error_rows(run: MeterRun, window_s: float | None) -> list[dict[str, object]]:
    bounds = window_bounds(run.edges_ns, window_s)
    if bounds.size < 2:
        return []
    meter_j = window_energies(run.meter["t_ns"], run.meter["power_w"], bounds, "trapezoid")
    rows: list[dict[str, object]] = []
    for field, column in NVML_FIELDS.items():
        if column not in run.smi.columns:
            continue
        lag = field_lag_ms(run, column)
        for alignment in ALIGNMENTS:
            if alignment == "lag" and not np.isfinite(lag):
                continue  # no lag measured: no lag-aligned row, rather than the raw numbers under that label
            shift_ns = lag * 1e6 if alignment == "lag" else 0.0
            nvml_j = window_energies(run.smi["t_ns"] - shift_ns, run.smi[column], bounds, "rectangle")
            err = (nvml_j - meter_j) / meter_j
            rows.append(_summary_row(run, field, alignment, bounds, window_s is None, lag, meter_j, err))
    return rows


def _summary_row(run: MeterRun, field: str, alignment: str, bounds: np.ndarray, whole: bool, lag_ms: float,
                 meter_j: np.ndarray, err: np.ndarray) -> dict[str, object]:
    ok = err[np.isfinite(err)]
    window_s = round(float(bounds[1] - bounds[0]) / 1e9, 3)
    return {
        "gpu": run.gpu, "load": run.load, "field": field, "alignment": alignment,
        "window": WHOLE_LOAD if whole else f"{window_s:g} s", "window_s": window_s,
        "n_windows": int(ok.size), "meter_j_per_window": float(np.nanmean(meter_j)),
        "mean_err_pct": float(100 * ok.mean()) if ok.size else float("nan"),
        "mean_abs_err_pct": float(100 * np.abs(ok).mean()) if ok.size else float("nan"),
        "max_abs_err_pct": float(100 * np.abs(ok).max()) if ok.size else float("nan"),
        "lag_ms": lag_ms, "meter_shift_ms": run.meter_shift_ms,
    }


def fidelity_table(runs: Sequence[MeterRun], windows_s: Sequence[float] = WINDOWS_S) -> pd.DataFrame:
    """Per run × NVML field × alignment × window length (and the whole load as one window): error of
    window energies against the meter."""
    rows = [row for run in runs for w in (*windows_s, None) for row in _error_rows(run, w)]
    return pd.DataFrame(rows)


def plot_meter_vs_nvml(runs: Sequence[MeterRun], path: str | os.PathLike[str]) -> Path:
    """Power over time around the load, one panel per run: meter vs power.draw and power.draw.instant."""
    fig, axes = new_figure(len(runs), panel_height_in=1.7, ncols=1)
    for ax, run in zip(axes, runs, strict=True):
        t0 = run.edges_ns[0]
        meter = run.meter.iloc[:: max(len(run.meter) // 6000, 1)]
        ax.plot((meter["t_ns"] - t0) / 1e9, meter["power_w"], lw=0.4, color="0.6", label="meter (PMD)")
        for (field, column), color in zip(NVML_FIELDS.items(), ("C0", "C3"), strict=True):
            if column in run.smi.columns:
                ax.step((run.smi["t_ns"] - t0) / 1e9, run.smi[column], where="post", lw=0.9, color=color,
                        label=f"NVML {field}")
        ax.set_xlim(-0.5, (run.edges_ns[-1] - t0) / 1e9 + 1.0)
        ax.set_ylabel("power (W)")
        ax.set_title(f"{run.gpu}, {run.load} load", fontsize=8, loc="right")
    axes[0].legend(fontsize=8, loc="upper left", ncols=1)
    axes[-1].set_xlabel("time since the load's first edge (s)")
    return save_figure(fig, path, "meter vs NVML power")[0]


def default_estimate(table: pd.DataFrame, min_window_s: float) -> pd.DataFrame:
    """perfzoo's default GPU estimate per run: ``power.draw.instant`` where the GPU has it (else
    ``power.draw``), own clock, the shortest tabulated window of at least ``min_window_s``."""
    raw = table[(table["alignment"] == "raw") & (table["window"] != WHOLE_LOAD) & (table["window_s"] >= min_window_s)]
    raw = raw[raw["window_s"] == raw.groupby(["gpu", "load"])["window_s"].transform("min")]
    best = raw.assign(rank=(raw["field"] != "power.draw.instant").astype(int))
    best = best.sort_values(["gpu", "load", "rank"]).groupby(["gpu", "load"], sort=True).head(1)
    return best.drop(columns="rank").reset_index(drop=True)


def fidelity_markdown(table: pd.DataFrame) -> str:
    """Markdown table: GPU × load × field × alignment rows, one column of mean |error| (mean signed
    error) per window length, in %."""
    windows = [f"{w:g} s" for w in sorted(table.loc[table["window"] != WHOLE_LOAD, "window_s"].unique())]
    windows.append(WHOLE_LOAD)
    lines = ["| GPU | load | field | alignment | " + " | ".join(windows) + " |", "|" + "---|" * (4 + len(windows))]
    for key, group in table.groupby(["gpu", "load", "field", "alignment"], sort=True):
        by_window = {r.window: f"{r.mean_abs_err_pct:.1f} ({r.mean_err_pct:+.1f})" for r in group.itertuples()}
        cells = [by_window.get(w, "–") for w in windows]
        lines.append("| " + " | ".join(str(k) for k in key) + " | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
