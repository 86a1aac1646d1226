"""The report's paper figures, each a function of tables only, drawn in the style of :mod:`perfzoo.plotting`.

Every figure is sized for a single journal column with fonts of at least 8 pt, drawn as small multiples in
a grid of at most two columns and written by :func:`perfzoo.plotting.save_figure` (PNG and vector PDF).
"""

from __future__ import annotations



import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from perfzoo.plotting import (
    FEATURE_SET_COLORS,
    SHORT_QUANTITY,
    corner_note,
    dedup_legend,
    empty_figure,
    family_color,
    log_axes,
    new_figure,
    panel_title,
    panel_groups,
    quantity_label,
    quantity_unit,
    regressor_color,
    shared_legend,
)


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
    shared_legend(fig, *dedup_legend(axes), ncol=3)
    return fig


def per_family_mape(per_family: pd.DataFrame) -> Figure:
    """MAPE per family, one bar per regressor, one panel per target and split."""
    panels = panel_groups(per_family, ["split", "target"])
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
    shared_legend(fig, *dedup_legend(axes), ncol=3)
    return fig


def error_cdf(errors: pd.DataFrame) -> Figure:
    """Cumulative share of held-out predictions within a given absolute relative error, per regressor."""
    panels = panel_groups(errors, ["split", "target"])
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
    shared_legend(fig, *dedup_legend(axes), ncol=3)
    return fig


def feature_importance(importance: pd.DataFrame, top: int = 8) -> Figure:
    """Mean feature importance of each tree regressor, one panel per target and regressor."""
    panels = panel_groups(importance, ["target", "regressor"])
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
    shared_legend(fig, *dedup_legend(axes))
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
    shared_legend(fig, *dedup_legend(axes), ncol=3)
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
