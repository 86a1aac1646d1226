"""The one figure style of perfzoo: palette, labels, log axes, figure sizing and the figure saver.

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
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

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
    "xgboost_grid": "#882255", "mlp": "#999999", "memory_sim": "#44AA99",
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


def dedup_legend(axes: Sequence[Any]) -> tuple[list[Any], list[str]]:
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(lab, h)
    return list(seen.values()), list(seen)


def panel_groups(frame: pd.DataFrame, keys: list[str]) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    """One (key values, rows) pair per panel, in sorted key order (empty for an empty frame)."""
    return list(frame.groupby(keys, sort=True)) if len(frame) else []
