"""Figures of the energy analysis of one device (:mod:`perfzoo.energy`): power over time per power limit,
cumulative energy mean ± sd, energy / time / EDP against the limit with the quadratic fit, and the
sampling-jitter histogram. Each function returns a figure; :func:`perfzoo.plotting.save_figure` writes it.
"""

from __future__ import annotations

from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from perfzoo.energy import (
    CONDITION_KEYS,
    METRICS,
    assign_runs,
    relative_time,
    cumulative_energy_curves,
    quadratic_fit,
    sampling_jitter,
    present_columns,
)
from perfzoo.io import InputError
from perfzoo.plotting import POWER_LIMIT_CMAP, new_figure


def _new_figure(nrows: int = 1, height: float = 2.0) -> tuple[Figure, np.ndarray]:
    """A single-column figure of ``nrows`` stacked panels (the width and style of :mod:`perfzoo.plotting`)."""
    fig, axes = new_figure(nrows, panel_height_in=height, ncols=1)
    return fig, np.array(axes).reshape(nrows, 1)


def _limit_color(i: int, n: int) -> Any:
    """Power limits low to high along the one power-limit colour map of :mod:`perfzoo.plotting`."""
    return matplotlib.colormaps[POWER_LIMIT_CMAP](0.9 * i / max(n - 1, 1))


def _limit_label(limit: float) -> str:
    return "default limit" if not np.isfinite(limit) else f"{limit:g} W"


def _single_configuration(frame: pd.DataFrame, what: str) -> None:
    keys = present_columns(frame, CONDITION_KEYS[:-1])
    if keys and len(frame[keys].drop_duplicates()) > 1:
        raise InputError(f"{what}: samples hold several configurations ({', '.join(keys)}); select one first")


def plot_power_over_time(samples: pd.DataFrame, title: str = "") -> Figure:
    """Raw power over relative time, one panel per power limit (low to high, top to bottom), first run."""
    frame = relative_time(samples)
    _single_configuration(frame, "plot_power_over_time")
    limits = sorted(frame["limit_w"].unique(), key=lambda v: (not np.isfinite(v), v))
    fig, axes = _new_figure(max(len(limits), 1), height=1.1)
    for ax, limit in zip(axes[:, 0], limits, strict=False):
        group = frame[(frame["limit_w"] == limit) | (np.isnan(limit) & frame["limit_w"].isna())]
        first_run = group[group["run"] == group["run"].min()]
        ax.plot(first_run["t_s"], first_run["power_w"], lw=0.8, color="#0072B2")
        if np.isfinite(limit):
            ax.axhline(limit, color="#D55E00", ls="--", lw=0.8)
        ax.set_ylabel("power (W)")
        ax.set_title(_limit_label(limit), loc="right")
    axes[-1, 0].set_xlabel("time since first sample (s)")
    if title:
        fig.suptitle(title)
    return fig


def plot_cumulative_energy(samples: pd.DataFrame, title: str = "") -> Figure:
    """Cumulative energy, mean ± sd over repetitions, one curve per power limit."""
    _single_configuration(assign_runs(samples), "plot_cumulative_energy")
    curves = cumulative_energy_curves(samples)
    fig, axes = _new_figure()
    ax = axes[0, 0]
    groups = list(curves.groupby("limit_w", dropna=False, sort=True))
    for i, (limit, curve) in enumerate(groups):
        color = _limit_color(i, len(groups))
        mean, sd = curve["energy_mean_j"].to_numpy(), np.nan_to_num(curve["energy_sd_j"].to_numpy())
        ax.plot(curve["t_s"], mean, color=color, label=_limit_label(limit))
        ax.fill_between(curve["t_s"], mean - sd, mean + sd, color=color, alpha=0.25, lw=0)
    ax.set_xlabel("time since first sample (s)")
    ax.set_ylabel("cumulative energy (J)")
    ax.legend()
    if title:
        ax.set_title(title)
    return fig


def plot_metrics_vs_limit(summary: pd.DataFrame, title: str = "") -> Figure:
    """Mean energy, time and EDP against the power limit, with sd error bars and the quadratic fit (R²)."""
    _single_configuration(summary, "plot_metrics_vs_limit")
    labels = {"energy_j": "energy (J)", "duration_s": "time (s)", "edp_js": "EDP (J·s)"}
    fig, axes = _new_figure(3, height=1.3)
    x = summary["limit_w"].to_numpy(dtype="float64")
    for ax, metric in zip(axes[:, 0], METRICS, strict=True):
        y = summary[f"{metric}_mean"].to_numpy(dtype="float64")
        ax.errorbar(
            x, y, yerr=summary[f"{metric}_std"].to_numpy(dtype="float64"), fmt="o", color="#0072B2", capsize=2
        )
        fit = quadratic_fit(x, y)
        if np.isfinite(fit.r2):
            grid = np.linspace(np.nanmin(x), np.nanmax(x), 100)
            ax.plot(grid, fit.predict(grid), color="#D55E00", label=f"quadratic fit, R² = {fit.r2:.3f}")
            ax.legend()
        ax.set_xlabel("power limit (W)")
        ax.set_ylabel(labels[metric])
    if title:
        fig.suptitle(title)
    return fig


def plot_sampling_jitter(samples: pd.DataFrame, bins: int = 50, title: str = "") -> Figure:
    """Histogram of the sampling frequency 1/Δt with its mean, sd and CV."""
    stats = sampling_jitter(samples, bins=bins)
    fig, axes = _new_figure()
    ax = axes[0, 0]
    if stats["n"]:
        ax.stairs(stats["counts"], stats["edges"], fill=True, color="#0072B2")
        ax.set_title(f"mean {stats['mean_hz']:.3g} Hz, sd {stats['sd_hz']:.3g} Hz, CV {100 * stats['cv']:.3g} %")
    ax.set_xlabel("sampling frequency (Hz)")
    ax.set_ylabel("intervals")
    if title:
        fig.suptitle(title)
    return fig
