"""Energy analysis of sensor samples: relative time, 4 Hz cubic resampling, masked-array averaging of
repetitions of unequal length, E = Δtᵀ·P, cumulative energy, EDP, quadratic fits against the power
limit, and sampling jitter. The figures built from them: :mod:`perfzoo.report.energy`.

Input is a sensor-sample table (columns of :data:`perfzoo.profiling.nvml.SENSOR_COLUMNS`) carrying the
run keys ``model_id, mode, batch, repeat``; a run is one repetition of one configuration at one power
limit. When no ``run`` column is given, runs are told apart by those keys and the power limit read
during the run.

Integration rule. The energy of a run is the dot product of the sample intervals and the power
readings, E = Δtᵀ·P, with Δtᵢ = tᵢ₊₁ − tᵢ paired with Pᵢ (``method="rectangle"``, the sample is held
until the next one: the seed report's rule). ``method="trapezoid"`` pairs Δtᵢ with (Pᵢ + Pᵢ₊₁)/2
instead. NaN power readings (failed reads) are dropped before integrating, so the previous reading is
held across the gap; they are never read as 0 W.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.interpolate import CubicSpline

from perfzoo.io import InputError

RUN_KEYS: tuple[str, ...] = ("model_id", "mode", "batch", "repeat")
CONDITION_KEYS: tuple[str, ...] = ("model_id", "mode", "batch", "limit_w")
RESAMPLE_HZ = 4.0
METRICS: tuple[str, ...] = ("energy_j", "duration_s", "edp_js")


# --------------------------------------------------------------------------------------------------
# Runs and time
# --------------------------------------------------------------------------------------------------


def present_columns(frame: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    return [k for k in keys if k in frame.columns]


def assign_runs(samples: pd.DataFrame) -> pd.DataFrame:
    """Add ``run`` (one id per run, unless given) and ``limit_w`` (the run's nominal power limit).

    Without a ``run`` column, a run is a distinct (run keys, power limit) combination; the limit read
    per sample is forward/back-filled within its repetition so that a failed read does not split a run.
    """
    if "t_ns" not in samples.columns:
        raise InputError("sensor samples: column 't_ns' is missing")
    frame = samples.sort_values("t_ns", kind="stable").reset_index(drop=True)
    keys = present_columns(frame, RUN_KEYS)
    if "power_limit_w" in frame.columns:
        limit = frame["power_limit_w"].astype("float64")
        if keys:
            limit = limit.groupby([frame[k] for k in keys], dropna=False, sort=False).transform(
                lambda s: s.ffill().bfill()
            )
        else:
            limit = limit.ffill().bfill()
        limit = limit.round(0)
    else:
        limit = pd.Series(np.nan, index=frame.index)
    if "run" not in frame.columns:
        identity = frame[keys].copy()
        identity["_limit"] = limit
        frame["run"] = identity.groupby(list(identity.columns), dropna=False, sort=True).ngroup()
    frame["limit_w"] = limit.groupby(frame["run"]).transform("median")
    return frame


def relative_time(samples: pd.DataFrame) -> pd.DataFrame:
    """Add ``t_s``: seconds since the first sample of each run (t_rel(i) = t_i − t_0)."""
    frame = assign_runs(samples)
    first = frame.groupby("run")["t_ns"].transform("min")
    frame["t_s"] = (frame["t_ns"] - first).astype("float64") / 1e9
    return frame


# --------------------------------------------------------------------------------------------------
# Resampling and averaging
# --------------------------------------------------------------------------------------------------


def resample_cubic(
    t_s: Sequence[float], values: Sequence[float], rate_hz: float = RESAMPLE_HZ
) -> tuple[np.ndarray, np.ndarray]:
    """Resample an unevenly sampled signal at ``rate_hz`` on [0, t_last] by cubic spline interpolation.

    NaN values are dropped first; with fewer than four valid points the interpolation is linear.
    """
    t = np.asarray(t_s, dtype="float64")
    y = np.asarray(values, dtype="float64")
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep]
    t, first = np.unique(t, return_index=True)
    y = y[first]
    if t.size < 2:
        return np.empty(0), np.empty(0)
    grid = np.arange(0.0, t[-1] - t[0] + 1e-9, 1.0 / rate_hz)
    if t.size < 4:
        return grid, np.interp(grid + t[0], t, y)
    return grid, CubicSpline(t, y)(grid + t[0])


def pad_masked(series: Sequence[Sequence[float]]) -> np.ma.MaskedArray:
    """Stack signals of unequal length: pad to the longest and mask the padding (and any NaN)."""
    arrays = [np.asarray(s, dtype="float64") for s in series]
    length = max((a.size for a in arrays), default=0)
    data = np.zeros((len(arrays), length))
    mask = np.ones((len(arrays), length), dtype=bool)
    for row, values in enumerate(arrays):
        data[row, : values.size] = values
        mask[row, : values.size] = ~np.isfinite(values)
    return np.ma.MaskedArray(data, mask=mask)


def masked_mean_sd(
    series: Sequence[Sequence[float]], ddof: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, standard deviation and count at each index over signals of unequal length.

    Where fewer than ``ddof + 1`` signals reach an index, the sd is NaN.
    """
    stacked = pad_masked(series)
    count = stacked.count(axis=0)
    mean = stacked.mean(axis=0).filled(np.nan)
    sd = np.full(count.shape, np.nan)
    enough = count > ddof
    if enough.any():
        sd[enough] = stacked[:, enough].std(axis=0, ddof=ddof).filled(np.nan)
    return np.asarray(mean), sd, np.asarray(count)


# --------------------------------------------------------------------------------------------------
# Energy
# --------------------------------------------------------------------------------------------------


def _valid_samples(t: Sequence[float], p: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    t_arr = np.asarray(t, dtype="float64")
    p_arr = np.asarray(p, dtype="float64")
    if t_arr.shape != p_arr.shape:
        raise InputError(f"energy: {t_arr.size} timestamps but {p_arr.size} power readings")
    keep = np.isfinite(t_arr) & np.isfinite(p_arr)
    order = np.argsort(t_arr[keep], kind="stable")
    return t_arr[keep][order], p_arr[keep][order]


def _interval_power(p: np.ndarray, method: str) -> np.ndarray:
    if method == "rectangle":
        return p[:-1]
    if method == "trapezoid":
        return 0.5 * (p[:-1] + p[1:])
    raise InputError(f"energy: unknown integration method '{method}' (use 'rectangle' or 'trapezoid')")


def cumulative_energy(
    t_s: Sequence[float], power_w: Sequence[float], method: str = "rectangle"
) -> np.ndarray:
    """E_s = Σ_{i<s} Δt_i · P_i at each valid sample (J; 0 at the first); NaN samples are dropped."""
    t, p = _valid_samples(t_s, power_w)
    if t.size == 0:
        return np.empty(0)
    return np.concatenate([[0.0], np.cumsum(np.diff(t) * _interval_power(p, method))])


def energy_from_samples(t_ns: Sequence[float], power_w: Sequence[float], method: str = "rectangle") -> float:
    """Energy in J of a sampled power signal, E = Δtᵀ·P (timestamps in ns); NaN with < 2 valid samples."""
    t, p = _valid_samples(np.asarray(t_ns, dtype="float64") / 1e9, power_w)
    if t.size < 2:
        return float("nan")
    return float(np.dot(np.diff(t), _interval_power(p, method)))


def energy_delay_product(energy_j: float, duration_s: float) -> float:
    """EDP = E · Δt (J·s)."""
    return float(energy_j) * float(duration_s)


def compare_counter(counter_j: float, samples_j: float) -> float:
    """Relative disagreement of sample-integrated energy with the counter: (samples - counter) / counter."""
    if not (np.isfinite(counter_j) and np.isfinite(samples_j)) or counter_j == 0:
        return float("nan")
    return float((samples_j - counter_j) / counter_j)


def run_energy(samples: pd.DataFrame, method: str = "rectangle") -> pd.DataFrame:
    """One row per run: run keys, ``limit_w``, duration, energy, mean power, EDP and sample counts."""
    frame = relative_time(samples)
    keys = present_columns(frame, RUN_KEYS)
    rows = []
    for run, group in frame.groupby("run", sort=True):
        t, p = group["t_s"].to_numpy(), group["power_w"].to_numpy(dtype="float64")
        duration = float(t.max() - t.min()) if len(t) else float("nan")
        energy = energy_from_samples(group["t_ns"].to_numpy(), p, method=method)
        row: dict[str, Any] = {k: group[k].iloc[0] for k in keys}
        row.update(
            run=run,
            limit_w=float(group["limit_w"].iloc[0]),
            duration_s=duration,
            energy_j=energy,
            mean_power_w=energy / duration if duration > 0 else float("nan"),
            edp_js=energy_delay_product(energy, duration),
            n_samples=len(group),
            n_power_missing=int(np.isnan(p).sum()),
        )
        rows.append(row)
    return pd.DataFrame(rows)


def summarize_vs_limit(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and sd over repetitions of energy, time and EDP per (configuration, power limit)."""
    keys = present_columns(runs, CONDITION_KEYS)
    grouped = runs.groupby(keys, dropna=False, sort=True)
    out = grouped[list(METRICS)].agg(["mean", "std"])
    out.columns = [f"{metric}_{stat}" for metric, stat in out.columns]
    out["n_runs"] = grouped.size()
    return out.reset_index()


# --------------------------------------------------------------------------------------------------
# Quadratic fit
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuadraticFit:
    """Least-squares y = a·x² + b·x + c with its coefficient of determination."""

    a: float
    b: float
    c: float
    r2: float
    n: int

    def predict(self, x: Sequence[float] | float) -> np.ndarray:
        return np.polyval([self.a, self.b, self.c], np.asarray(x, dtype="float64"))


def quadratic_fit(x: Sequence[float], y: Sequence[float]) -> QuadraticFit:
    """Second-degree least-squares polynomial fit and R²; NaN coefficients with < 3 distinct x."""
    xa, ya = np.asarray(x, dtype="float64"), np.asarray(y, dtype="float64")
    keep = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[keep], ya[keep]
    if np.unique(xa).size < 3:
        return QuadraticFit(np.nan, np.nan, np.nan, np.nan, int(xa.size))
    a, b, c = np.polyfit(xa, ya, 2)
    residual = float(np.sum((ya - np.polyval([a, b, c], xa)) ** 2))
    total = float(np.sum((ya - ya.mean()) ** 2))
    r2 = 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else np.nan)
    return QuadraticFit(float(a), float(b), float(c), float(r2), int(xa.size))


def fits_vs_limit(summary: pd.DataFrame) -> pd.DataFrame:
    """Quadratic fit of mean energy, time and EDP against the power limit, per configuration."""
    keys = present_columns(summary, CONDITION_KEYS[:-1])
    groups = summary.groupby(keys, sort=True) if keys else [((), summary)]
    rows = []
    for key, group in groups:
        for metric in METRICS:
            fit = quadratic_fit(group["limit_w"], group[f"{metric}_mean"])
            values = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
            rows.append(
                {**values, "metric": metric, "a": fit.a, "b": fit.b, "c": fit.c, "r2": fit.r2, "n": fit.n}
            )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# Curves and jitter
# --------------------------------------------------------------------------------------------------


def cumulative_energy_curves(samples: pd.DataFrame, rate_hz: float = RESAMPLE_HZ) -> pd.DataFrame:
    """Mean ± sd of cumulative energy over repetitions, per power limit, on a ``rate_hz`` grid.

    Each run's power is resampled (cubic, :func:`resample_cubic`), integrated cumulatively, and the
    runs, of unequal length, are averaged with masked arrays.
    """
    frame = relative_time(samples)
    parts = []
    for limit, group in frame.groupby("limit_w", dropna=False, sort=True):
        curves = []
        for _, run in group.groupby("run", sort=True):
            grid, power = resample_cubic(run["t_s"], run["power_w"], rate_hz)
            if grid.size:
                curves.append(cumulative_energy(grid, power))
        if not curves:
            continue
        mean, sd, count = masked_mean_sd(curves)
        parts.append(
            pd.DataFrame(
                {
                    "limit_w": limit,
                    "t_s": np.arange(mean.size) / rate_hz,
                    "energy_mean_j": mean,
                    "energy_sd_j": sd,
                    "n_runs": count,
                }
            )
        )
    columns = ["limit_w", "t_s", "energy_mean_j", "energy_sd_j", "n_runs"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)


def sampling_intervals_s(samples: pd.DataFrame) -> np.ndarray:
    """Intervals between consecutive samples within each run, in seconds."""
    frame = relative_time(samples)
    return frame.groupby("run")["t_s"].diff().dropna().to_numpy()


def sampling_jitter(samples: pd.DataFrame, bins: int = 50) -> dict[str, Any]:
    """Sampling-rate statistics (mean, sd and CV of 1/Δt) and a histogram of the sampling frequency."""
    intervals = sampling_intervals_s(samples)
    intervals = intervals[intervals > 0]
    if intervals.size == 0:
        return {
            "n": 0,
            "mean_hz": np.nan,
            "sd_hz": np.nan,
            "cv": np.nan,
            "counts": np.empty(0),
            "edges": np.empty(0),
        }
    freq = 1.0 / intervals
    counts, edges = np.histogram(freq, bins=bins)
    mean = float(freq.mean())
    sd = float(freq.std(ddof=1)) if freq.size > 1 else float("nan")
    return {
        "n": int(freq.size),
        "mean_hz": mean,
        "sd_hz": sd,
        "cv": sd / mean,
        "mean_interval_s": float(intervals.mean()),
        "counts": counts,
        "edges": edges,
    }
