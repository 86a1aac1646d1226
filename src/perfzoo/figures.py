"""Paper figures, each a function of tables only, in one style with one palette.

Every figure is sized for a single journal column (:data:`COLUMN_WIDTH_IN` = 3.3 in) with fonts of at least
8 pt at that size, drawn as small multiples in a grid of at most two columns, and written twice by
:func:`save_figure`: a PNG at :data:`PNG_DPI` dpi and a vector PDF with the same stem. Colours come from
:func:`regressor_color` and :func:`family_color` only, so a regressor or family keeps its colour in every
figure; axis labels are words with units (:func:`quantity_label`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from perfzoo.io import atomic_path

COLUMN_WIDTH_IN = 3.3
PNG_DPI = 220
FONT_PT = 8
STYLE = {
    "font.size": FONT_PT, "axes.titlesize": FONT_PT, "axes.labelsize": FONT_PT, "xtick.labelsize": FONT_PT,
    "ytick.labelsize": FONT_PT, "legend.fontsize": FONT_PT, "figure.titlesize": FONT_PT + 1,
    "legend.frameon": False, "axes.spines.top": False, "axes.spines.right": False, "lines.linewidth": 1.0,
    "lines.markersize": 3.5, "svg.hashsalt": "perfzoo", "pdf.compression": 6,
}  # fmt: skip
matplotlib.rcParams.update(STYLE)

# Fixed colours: the known regressors and families first (Okabe-Ito / tab10 order), others by a stable hash.
REGRESSOR_COLORS = {
    "roofline": "#000000", "linear": "#E69F00", "gianniti_e2e": "#56B4E9", "gianniti_layer": "#009E73",
    "poly_lasso": "#F0E442", "random_forest": "#0072B2", "extra_trees": "#D55E00", "xgboost": "#CC79A7",
    "xgboost_grid": "#882255", "mlp": "#999999",
}  # fmt: skip
FAMILY_COLORS = {
    "resnet": "#1f77b4", "vgg": "#ff7f0e", "mobilenet": "#2ca02c", "efficientnet": "#d62728",
    "densenet": "#9467bd", "vit": "#8c564b", "convnext": "#e377c2", "mlp": "#7f7f7f",
    "transformer": "#bcbd22", "regnet": "#17becf",
}  # fmt: skip
_SPARE = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1")
FEATURE_SET_COLORS = {"model only": "#999999", "model + hardware": "#0072B2"}
POWER_LIMIT_CMAP = "viridis"

QUANTITY_LABELS = {
    "latency_ms": "latency (ms)", "peak_mem_mb": "peak memory (MB)", "throughput": "throughput (samples/s)",
    "mean_power_w": "mean power (W)", "energy_j": "energy (J)", "energy_per_sample_j": "energy per sample (J)",
    "edp": "energy-delay product (J·s)",
}  # fmt: skip
SPLIT_LABELS = {
    "random": "random split", "family_monte_carlo": "held-out families",
    "stratified_kfold": "stratified k-fold", "leave_one_family_out": "family left out",
    "batch_extrapolation": "larger batches", "leave_one_device_out": "device left out",
}  # fmt: skip
SHORT_QUANTITY = {"latency_ms": "latency", "peak_mem_mb": "peak memory", "energy_j": "energy",
                  "energy_per_sample_j": "energy/sample", "mean_power_w": "power", "throughput": "throughput"}


def _stable(name: str) -> str:
    return _SPARE[zlib.crc32(name.encode()) % len(_SPARE)]


def regressor_color(name: str) -> str:
    return REGRESSOR_COLORS.get(name) or _stable(name)


def family_color(name: str) -> str:
    return FAMILY_COLORS.get(name) or _stable(name)


def quantity_label(column: str) -> str:
    return QUANTITY_LABELS.get(column, column.replace("_", " "))


def quantity_unit(column: str) -> str:
    label = quantity_label(column)
    return label[label.rfind("(") + 1 : -1] if label.endswith(")") else "value"


def split_label(split: str) -> str:
    return SPLIT_LABELS.get(split, split.replace("_", " "))


def panel_title(target: str, split: str) -> str:
    return f"{SHORT_QUANTITY.get(target, target.replace('_', ' '))}\n{split_label(split)}"


def _plain(value: float, _pos: int = 0) -> str:
    return f"{value:g}" if 1e-3 <= abs(value) < 1e5 else f"{value:.0e}"


def _minor_label(axis: Any) -> Any:
    """Minor ticks at 2 and 5 labelled only when the axis spans less than a decade (else unlabelled)."""

    def label(value: float, _pos: int = 0) -> str:
        lo, hi = sorted(axis.get_view_interval())
        if lo <= 0 or hi / lo > 10 or value <= 0:
            return ""
        mantissa = round(value / 10 ** math.floor(math.log10(value)), 6)
        return _plain(float(f"{value:.2g}")) if mantissa in (2, 5) else ""

    return label


def log_axes(ax: Any, x: bool = True, y: bool = True, base: float = 10) -> None:
    """Log scale with plain major tick labels (1, 10, 100) and unlabelled minor ticks."""
    from matplotlib.ticker import FuncFormatter

    for on, axis, setter in ((x, ax.xaxis, ax.set_xscale), (y, ax.yaxis, ax.set_yscale)):
        if on:
            setter("log", base=base)
            axis.set_major_formatter(FuncFormatter(_plain))
            axis.set_minor_formatter(FuncFormatter(_minor_label(axis)))


def corner_note(ax: Any, text: str) -> None:
    ax.text(0.03, 0.97, text, transform=ax.transAxes, ha="left", va="top")


def new_figure(panels: int, panel_height_in: float = 1.6, ncols: int = 2) -> tuple[Figure, list[Any]]:
    """A single-column figure with ``panels`` axes in a grid of ``ncols`` columns (unused cells hidden)."""
    n = max(panels, 1)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(COLUMN_WIDTH_IN, 0.5 + panel_height_in * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def empty_figure(text: str) -> Figure:
    fig, (ax,) = new_figure(1, panel_height_in=1.0, ncols=1)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    return fig


def save_figure(fig: Figure, png_path: str | Path, description: str = "") -> list[Path]:
    """Write ``png_path`` (PNG at :data:`PNG_DPI` dpi) and the PDF beside it; deterministic metadata."""
    png = Path(png_path)
    pdf = png.with_suffix(".pdf")
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=PNG_DPI, metadata={"Software": None, "Description": description or None})
    with atomic_path(pdf) as tmp:
        fig.savefig(tmp, format="pdf", metadata={"CreationDate": None, "ModDate": None, "Creator": None,
                                                 "Producer": None, "Subject": description or None})
    return [png, pdf]


def shared_legend(fig: Figure, handles: Sequence[Any], labels: Sequence[str], ncol: int = 2) -> None:
    """One legend below all panels (never covering data)."""
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, handlelength=1.2, columnspacing=0.8)


def _dedup_legend(axes: Sequence[Any]) -> tuple[list[Any], list[str]]:
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    return list(seen.values()), list(seen)


def _panels(frame: pd.DataFrame, keys: list[str]) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    """One (key values, rows) pair per panel, in sorted key order (empty for an empty frame)."""
    return list(frame.groupby(keys, sort=True)) if len(frame) else []


# ---------------------------------------------------------------------------------------------- accuracy


def actual_vs_predicted(predictions: pd.DataFrame, best: pd.DataFrame) -> Figure:
    """Measured vs predicted (log-log, y = x and ±10 % band), best regressor per target and split."""
    rows = best.sort_values(["split", "target"]).to_dict("records")
    if not rows:
        return empty_figure("no held-out predictions")
    fig, axes = new_figure(len(rows), panel_height_in=1.55)
    for ax, b in zip(axes, rows, strict=True):
        g = predictions[(predictions["set"] == "test") & (predictions["target"] == b["target"])
                        & (predictions["regressor"] == b["regressor"]) & (predictions["split"] == b["split"])]
        values = g[["y_true", "y_pred"]].to_numpy(dtype=float)
        values = values[np.isfinite(values) & (values > 0)]
        if values.size:
            line = np.geomspace(values.min() * 0.8, values.max() * 1.25, 50)
            ax.fill_between(line, line * 0.9, line * 1.1, color="0.85", lw=0, label="±10 %")
            ax.plot(line, line, color="0.3", lw=0.6, label="y = x")
        for family, f in g.groupby("family"):
            ax.scatter(f["y_true"], f["y_pred"], s=6, color=family_color(family), label=family, lw=0)
        log_axes(ax)
        unit = quantity_unit(b["target"])
        ax.set_xlabel(f"measured ({unit})")
        ax.set_ylabel(f"predicted ({unit})")
        ax.set_title(panel_title(b["target"], b["split"]))
        corner_note(ax, f"{b['regressor']}\nMAPE {b['mape']:.3g} %")
    shared_legend(fig, *_dedup_legend(axes), ncol=3)
    return fig


def per_family_mape(per_family: pd.DataFrame) -> Figure:
    """MAPE per family, one bar per regressor, one panel per target and split."""
    panels = _panels(per_family, ["split", "target"])
    if not panels:
        return empty_figure("no per-family errors")
    fig, axes = new_figure(len(panels), panel_height_in=1.5)
    for ax, ((split, target), g) in zip(axes, panels, strict=True):
        wide = g.pivot_table(index="family", columns="regressor", values="mape", aggfunc="first").sort_index()
        width = 0.85 / max(len(wide.columns), 1)
        for i, regressor in enumerate(wide.columns):
            ax.bar(np.arange(len(wide)) + i * width, wide[regressor], width, color=regressor_color(regressor),
                   label=regressor)
        ax.set_xticks(np.arange(len(wide)) + 0.425 - width / 2, wide.index, rotation=60, ha="right")
        log_axes(ax, x=False)
        ax.set_ylabel("MAPE (%)")
        ax.set_title(panel_title(target, split))
    shared_legend(fig, *_dedup_legend(axes), ncol=3)
    return fig


def error_cdf(errors: pd.DataFrame) -> Figure:
    """Cumulative share of held-out predictions within a given absolute relative error, per regressor."""
    panels = _panels(errors, ["split", "target"])
    if not panels:
        return empty_figure("no held-out predictions")
    fig, axes = new_figure(len(panels), panel_height_in=1.4)
    for ax, ((split, target), g) in zip(axes, panels, strict=True):
        for regressor, r in g.groupby("regressor"):
            e = np.sort(r["abs_rel_error"].to_numpy(dtype=float) * 100)
            e = np.clip(e[np.isfinite(e)], 1e-3, None)
            if not len(e):
                continue
            share = np.arange(0, len(e) + 1) / len(e)  # the empirical CDF, rising from 0 at the smallest error
            ax.step(np.concatenate([e[:1], e]), share, where="post", color=regressor_color(regressor),
                    label=regressor)
        ax.axvline(10, color="0.5", lw=0.6, ls="--")
        log_axes(ax, y=False)
        ax.set_xlabel("absolute error (%)")
        ax.set_ylabel("share of predictions")
        ax.set_title(panel_title(target, split))
    shared_legend(fig, *_dedup_legend(axes), ncol=3)
    return fig


def feature_importance(importance: pd.DataFrame, top: int = 8) -> Figure:
    """Mean feature importance of each tree regressor, one panel per target and regressor."""
    panels = _panels(importance, ["target", "regressor"])
    if not panels:
        return empty_figure("no tree regressor fitted")
    fig, axes = new_figure(len(panels), panel_height_in=1.3, ncols=1)
    for ax, ((target, regressor), g) in zip(axes, panels, strict=True):
        g = g.nlargest(top, "importance").sort_values("importance")
        names = [n if len(n) <= 24 else n[:23] + "…" for n in g["feature"].str.replace("_", " ")]
        ax.barh(names, g["importance"], color=regressor_color(regressor))
        ax.set_xlabel("importance (share)")
        ax.set_title(f"{SHORT_QUANTITY.get(target, target)}, {regressor}")
    return fig


def ablation(table: pd.DataFrame) -> Figure:
    """MAPE with model features only vs model + hardware features, per target, one bar pair per regressor."""
    panels = sorted(table["target"].unique()) if "features" in table and len(table) else []
    if not panels:
        return empty_figure("feature ablation not computed")
    fig, axes = new_figure(len(panels), panel_height_in=1.5)
    for ax, target in zip(axes, panels, strict=True):
        g = table[table["target"] == target]
        wide = g.pivot_table(index="regressor", columns="features", values="mape", aggfunc="mean")
        for i, features in enumerate(c for c in FEATURE_SET_COLORS if c in wide.columns):
            ax.bar(np.arange(len(wide)) + i * 0.4, wide[features], 0.4, color=FEATURE_SET_COLORS[features],
                   label=features)
        ax.set_xticks(np.arange(len(wide)) + 0.2, wide.index, rotation=30, ha="right")
        log_axes(ax, x=False)
        ax.set_ylabel("MAPE (%)")
        ax.set_title(quantity_label(target))
    shared_legend(fig, *_dedup_legend(axes))
    return fig


# ------------------------------------------------------------------------------------------ measurements


def latency_vs_batch(data: pd.DataFrame) -> Figure:
    """Measured median latency (95 % CI) against batch size, one panel per family, one line per model/mode.

    Only profiled rows are drawn: imported rows carry no confidence interval."""
    data = data[data["latency_ci_lo"].notna()] if "latency_ci_lo" in data else data.iloc[0:0]
    families = sorted(data["family"].unique()) if len(data) else []
    if not families:
        return empty_figure("no measured configs")
    fig, axes = new_figure(len(families), panel_height_in=1.3)
    for ax, family in zip(axes, families, strict=True):
        g = data[data["family"] == family]
        for (label, mode, _device), m in g.groupby(["label", "mode", "device"]):
            m = m.sort_values("batch")
            ax.errorbar(m["batch"], m["latency_ms"], yerr=[m["latency_ms"] - m["latency_ci_lo"],
                        m["latency_ci_hi"] - m["latency_ms"]], color=family_color(family),
                        marker="o" if mode == "inference" else "s", ls="-" if mode == "inference" else "--",
                        mfc="white" if mode == "training" else None, alpha=0.85)
        log_axes(ax, y=False, base=2)
        log_axes(ax, x=False)
        ax.set_title(family)
        ax.set_xlabel("batch size")
        ax.set_ylabel("latency (ms)")
    from matplotlib.lines import Line2D

    marks = [Line2D([], [], color="0.3", marker="o", ls="-"), Line2D([], [], color="0.3", marker="s", ls="--",
                                                                      mfc="white")]
    shared_legend(fig, marks, ["inference", "training step"])
    return fig


def batch_extrapolation(predictions: pd.DataFrame, data: pd.DataFrame, max_series: int = 4) -> Figure:
    """Measured latency vs batch with each regressor's prediction for the held-out (larger) batches."""
    held = predictions[(predictions["split"] == "batch_extrapolation") & (predictions["set"] == "test")
                       & (predictions["target"] == "latency_ms")]
    series = held[["model_id", "mode", "device", "label"]].drop_duplicates().head(max_series).to_dict("records")
    if not series:
        return empty_figure("split batch_extrapolation not configured or not formable")
    fig, axes = new_figure(len(series), panel_height_in=1.4)
    for ax, s in zip(axes, series, strict=True):
        measured = data[(data["model_id"] == s["model_id"]) & (data["mode"] == s["mode"])
                        & (data["device"] == s["device"])].sort_values("batch")
        ax.plot(measured["batch"], measured["latency_ms"], "o-", color="0.2", label="measured")
        p = held[(held["model_id"] == s["model_id"]) & (held["mode"] == s["mode"]) & (held["device"] == s["device"])]
        for regressor, r in p.groupby("regressor"):
            ax.scatter(r["batch"], r["y_pred"], marker="x", s=14, color=regressor_color(regressor), label=regressor)
        log_axes(ax, y=False, base=2)
        log_axes(ax, x=False)
        ax.set_xlabel("batch size")
        ax.set_ylabel("latency (ms)")
        ax.set_title(f"{s['label']}, {s['mode']}")
    shared_legend(fig, *_dedup_legend(axes), ncol=3)
    return fig


def cv_distribution(data: pd.DataFrame) -> Figure:
    """Histogram of the coefficient of variation of the measured iterations of each config."""
    cv = data["cv"].dropna().to_numpy(dtype=float) * 100 if "cv" in data else np.array([])
    fig, (ax,) = new_figure(1, panel_height_in=1.8, ncols=1)
    ax.hist(cv, bins=30, color="#0072B2")
    ax.set_xlabel("coefficient of variation of iteration times (%)")
    ax.set_ylabel("configs")
    ax.set_title(f"median {np.median(cv):.3g} % over {len(cv)} configs" if len(cv) else "no configs")
    return fig
