"""Evaluate stage: accuracy metrics of every (target, regressor, split) on held-out test rows, and the
empirical coverage of the 90 % prediction intervals on them.

Intervals. Every held-out row of a split was predicted by a fold model that did not see it, so its
residual ``|log(y / pred)|`` is an honest calibration point for the others. A held-out row's interval is
``pred × exp(±q)``, ``q`` the split-conformal quantile (:func:`perfzoo.stats.conformal_halfwidth`, level
0.9) of the residuals of the held-out rows of the *other* folds of the split (cross-conformal; the rows of
one fold, often one family, are correlated, so a fold never calibrates itself), or, for a split with a
single fold, of the other held-out rows (leave one row out); a row held out in several folds (the repeats
of a Monte-Carlo split) never calibrates itself either. No refit is needed. With fewer than
``MIN_CALIBRATION_ROWS`` residuals the interval is missing, with that reason. Regressors with intervals of
their own (``device_transfer``: conformal, calibrated by an inner leave-one-GPU-out) keep them.
``perfzoo predict`` uses the same :func:`calibrate` over all held-out rows of its predictor's split, so the
coverage in the metrics table is the coverage of the intervals it prints.

Why not MAPIE or crepes: MAPIE's cross-conformal regressor refits the estimator on folds of its own, while
here the folds are the workflow's splits and are already fitted; crepes' ``ConformalRegressor`` takes
residuals as they are, but computes exactly :func:`perfzoo.stats.conformal_halfwidth` and is not a
dependency of the package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfzoo.stats import METRICS, all_metrics, conformal_halfwidth, mape, mape_interval, rmse

GROUP = ["target", "regressor", "split"]
BASELINE_PREFIX = "baseline:"
INTERVAL_COLUMNS = ["n_interval", "coverage90", "interval_method", "interval_missing"]
MAPE_INTERVAL_COLUMNS = ["mape_lo90", "mape_hi90"]
NOISE_FLOOR_COLUMNS = {"noise_mape": "noise_floor_mape", "noise_lo90": "noise_floor_lo90",
                       "noise_hi90": "noise_floor_hi90"}
"""The noise floor table's columns a metrics row carries (the mean over the devices that measured the target; with
several devices the interval's ends are the means of theirs, at least as wide as the interval of the mean floor when
the devices' floors vary independently)."""
METRIC_COLUMNS = [*GROUP, "n", "folds", *METRICS, *MAPE_INTERVAL_COLUMNS, *INTERVAL_COLUMNS,
                  *NOISE_FLOOR_COLUMNS.values()]
RESAMPLING_UNITS = {"leave_one_family_out": "family", "family_monte_carlo": "family"}
"""The column whose values a split's MAPE interval resamples whole: the family for the splits that hold families
out (the rows of one family share its error), else :data:`DEFAULT_RESAMPLING_UNIT`."""
DEFAULT_RESAMPLING_UNIT = "model_id"
"""A model's configs (its batches and modes) share its error; a table without the column resamples rows."""
#: nominal level of the prediction intervals, the fewest residuals one is calibrated on, and the band of
#: measured coverage that counts as calibrated
INTERVAL_LEVEL = 0.9
MIN_CALIBRATION_ROWS = 20
COVERAGE_BAND = (0.85, 0.95)
OWN_INTERVALS = "the regressor's own intervals"
LEAVE_ONE_FOLD_OUT = "cross-conformal: residuals of the held-out rows of the other folds"
LEAVE_ONE_ROW_OUT = "conformal, leave one row out: residuals of the other held-out rows of the single fold"


@dataclass(frozen=True)
class Calibration:
    """A conformal half-width ``q`` in log space (the interval is ``pred × exp(±q)``) from ``n`` residuals;
    ``q`` is NaN, with ``reason``, when there are too few."""

    q: float
    n: int
    reason: str = ""

    def interval(self, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pred = np.asarray(pred, dtype=float)
        return pred * math.exp(-self.q), pred * math.exp(self.q)


def log_residuals(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """``|log(y_true / y_pred)|``; NaN where either is not a positive finite number."""
    y, p = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    ok = np.isfinite(y) & np.isfinite(p) & (y > 0) & (p > 0)
    out = np.full(y.shape, np.nan)
    out[ok] = np.abs(np.log(y[ok] / p[ok]))
    return out


def calibrate(abs_log_residuals: np.ndarray) -> Calibration:
    """The 90 % conformal half-width of the finite residuals; NaN with a reason below
    ``MIN_CALIBRATION_ROWS`` of them."""
    r = np.asarray(abs_log_residuals, dtype=float)
    r = r[np.isfinite(r)]
    if r.size < MIN_CALIBRATION_ROWS:
        return Calibration(math.nan, int(r.size),
                           f"{r.size} calibration residuals, fewer than the {MIN_CALIBRATION_ROWS} required")
    return Calibration(conformal_halfwidth(r, INTERVAL_LEVEL), int(r.size))


def calibration_groups(held: pd.DataFrame) -> tuple[np.ndarray, str]:
    """(group of every held-out row, method): a row is calibrated without the rows of its group, its fold
    when the split has several, else itself."""
    folds = held["fold"].astype(str).to_numpy()
    if len(set(folds)) > 1:
        return folds, LEAVE_ONE_FOLD_OUT
    return np.arange(len(held)), LEAVE_ONE_ROW_OUT


def cross_conformal(held: pd.DataFrame) -> pd.DataFrame:
    """The held-out rows of one (target, regressor, split) with ``y_lo``, ``y_hi`` (90 % cross-conformal
    intervals), ``interval_method``, ``interval_missing`` (the reason for a missing one) and
    ``calibration_rows``."""
    residuals = log_residuals(held["y_true"], held["y_pred"])
    pred = held["y_pred"].to_numpy(dtype=float)
    groups, method = calibration_groups(held)
    lo, hi, n_cal = np.full(len(held), np.nan), np.full(len(held), np.nan), np.zeros(len(held), dtype=int)
    missing = np.full(len(held), "", dtype=object)
    rows = held["row_id"].to_numpy() if "row_id" in held.columns else np.arange(len(held))
    for group in np.unique(groups):
        own = groups == group
        # nor the same rows held out by another fold (the repeats of a Monte-Carlo split overlap)
        cal = calibrate(residuals[~own & ~np.isin(rows, rows[own])])
        lo[own], hi[own] = cal.interval(pred[own])
        n_cal[own], missing[own] = cal.n, cal.reason
    missing[~np.isfinite(pred)] = "no point prediction"
    return held.assign(y_lo=lo, y_hi=hi, interval_method=method, interval_missing=missing,
                       calibration_rows=n_cal)


def own_intervals(held: pd.DataFrame) -> pd.DataFrame:
    """Held-out rows whose regressor wrote intervals of its own in the fit stage, kept as they are."""
    has = held["y_lo"].notna() & held["y_hi"].notna()
    return held.assign(interval_method=OWN_INTERVALS, calibration_rows=np.nan,
                       interval_missing=np.where(has, "", "the regressor gave no interval for this row"))


def with_intervals(predictions: pd.DataFrame) -> pd.DataFrame:
    """Every held-out prediction with its 90 % interval: the regressor's own where the fit stage wrote one
    (``y_lo``/``y_hi``), else cross-conformal (:func:`cross_conformal`), per (target, regressor, split)."""
    predictions = predictions.reset_index(drop=True)
    for column in ("y_lo", "y_hi"):
        if column not in predictions.columns:
            predictions[column] = np.nan
    parts = [own_intervals(g) if g["y_lo"].notna().any() else cross_conformal(g)
             for _, g in predictions.groupby(GROUP, sort=False, dropna=False)]
    if not parts:
        return predictions.assign(interval_method="", interval_missing="", calibration_rows=np.nan)
    return pd.concat(parts).sort_index()
FAMILY_COLUMNS = [*GROUP, "family", "n", "mape", "rmse"]


def test_rows(predictions: pd.DataFrame) -> pd.DataFrame:
    return predictions[predictions["set"] == "test"]


def interval_coverage(rows: pd.DataFrame) -> dict[str, object]:
    """Share of rows whose ``y_true`` lies in ``[y_lo, y_hi]`` over the rows that have an interval, how
    the intervals were made, and why rows have none (counted)."""
    if not {"y_lo", "y_hi"} <= set(rows.columns):
        return {"n_interval": 0, "coverage90": np.nan, "interval_method": "",
                "interval_missing": "no intervals in the predictions"}
    has = rows["y_lo"].notna() & rows["y_hi"].notna()
    inside = (rows["y_true"] >= rows["y_lo"]) & (rows["y_true"] <= rows["y_hi"])
    methods = rows.get("interval_method", pd.Series(dtype=str)).dropna()
    reasons = rows.get("interval_missing", pd.Series("", index=rows.index))[~has].fillna("").astype(str)
    reasons = sorted({r for r in reasons if r} or ({"no interval"} if (~has).any() else set()))
    missing = f"{int((~has).sum())} of {len(rows)} test rows without an interval: {'; '.join(reasons)}"
    return {"n_interval": int(has.sum()), "coverage90": float(inside[has].mean()) if has.any() else np.nan,
            "interval_method": "; ".join(sorted(set(methods.astype(str)) - {""})),
            "interval_missing": missing if reasons else ""}


def outside_coverage_band(coverage: float) -> bool:
    """Whether a measured coverage of the 90 % intervals lies outside :data:`COVERAGE_BAND`."""
    low, high = COVERAGE_BAND
    return math.isfinite(coverage) and not low <= coverage <= high


def mape_bounds(rows: pd.DataFrame, split: str) -> dict[str, float]:
    """The 90 % bootstrap interval of the MAPE of ``rows`` (held-out, predicted), resampling the split's
    units (:data:`RESAMPLING_UNITS`) whole: how much the MAPE depends on which models or families were held out."""
    unit = RESAMPLING_UNITS.get(split, DEFAULT_RESAMPLING_UNIT)
    units = rows[unit].to_numpy() if unit in rows.columns else np.arange(len(rows))
    low, high = mape_interval(rows["y_true"].to_numpy(), rows["y_pred"].to_numpy(), units)
    return dict(zip(MAPE_INTERVAL_COLUMNS, (low, high), strict=True))


def metrics_table(predictions: pd.DataFrame, noise: pd.DataFrame) -> pd.DataFrame:
    """MAPE (with its 90 % bootstrap interval, :func:`mape_bounds`), RMSE, Kendall tau, R2, share within 10 %,
    pooled over folds, with the noise floor (and its interval, where the noise table has one).

    Rows without a prediction (a baseline without a source row, a row without a feature the regressor uses) are
    left out and counted in ``n_missing``; ``coverage90`` is the empirical coverage of the 90 % intervals
    (:func:`with_intervals`) on the ``n_interval`` test rows that have one, ``interval_missing`` says why others
    have none.
    With baseline rows present (regressor ``baseline:*``), every other row
    names the best baseline of its (target, split) and whether it beats it (``beats_baseline``).
    """
    rows = []
    for (target, regressor, split), g in test_rows(predictions).groupby(GROUP, sort=True):
        ok = g[np.isfinite(g["y_pred"].to_numpy(dtype=float))]
        rows.append({"target": target, "regressor": regressor, "split": split, "n": len(ok),
                     "folds": g["fold"].nunique(), **all_metrics(ok["y_true"].to_numpy(), ok["y_pred"].to_numpy()),
                     **mape_bounds(ok, split), "n_missing": len(g) - len(ok), **interval_coverage(ok)})
    if not rows:  # no held-out predictions at all (every family failed): an empty, well-formed table
        return pd.DataFrame(columns=METRIC_COLUMNS)
    table = pd.DataFrame(rows)
    if table["regressor"].str.startswith(BASELINE_PREFIX).any():
        table = compare_with_baselines(table)
    floor_columns = {c: NOISE_FLOOR_COLUMNS[c] for c in NOISE_FLOOR_COLUMNS if c in noise.columns}
    floor = noise.groupby("target")[list(floor_columns)].mean().rename(columns=floor_columns)
    return table.merge(floor, left_on="target", right_index=True, how="left")


def compare_with_baselines(table: pd.DataFrame) -> pd.DataFrame:
    """Add ``best_baseline``, ``best_baseline_mape`` and ``beats_baseline`` (lower MAPE) to every row."""
    base = table[table["regressor"].str.startswith(BASELINE_PREFIX) & table["mape"].notna() & (table["n"] > 0)]
    best = base.loc[base.groupby(["target", "split"])["mape"].idxmin(), ["target", "split", "regressor", "mape"]]
    best = best.rename(columns={"regressor": "best_baseline", "mape": "best_baseline_mape"})
    out = table.merge(best, on=["target", "split"], how="left")
    is_model = ~out["regressor"].str.startswith(BASELINE_PREFIX)
    compared = is_model & out["best_baseline_mape"].notna()
    out["beats_baseline"] = pd.Series(pd.NA, index=out.index, dtype="boolean")
    out.loc[compared, "beats_baseline"] = out.loc[compared, "mape"] < out.loc[compared, "best_baseline_mape"]
    return out


def per_family_table(predictions: pd.DataFrame) -> pd.DataFrame:
    """MAPE and RMSE per family of the held-out rows (long form of the layout of Tables 5.2/5.3 of Panner
    Selvam, "Performance Prediction Models for Deep Learning")."""
    rows = []
    for (target, regressor, split, family), g in test_rows(predictions).groupby([*GROUP, "family"], sort=True):
        y, p = g["y_true"].to_numpy(), g["y_pred"].to_numpy()
        rows.append({"target": target, "regressor": regressor, "split": split, "family": family,
                     "n": len(g), "mape": mape(y, p), "rmse": rmse(y, p)})
    return pd.DataFrame(rows, columns=FAMILY_COLUMNS)


def best_per_target(metrics: pd.DataFrame) -> pd.DataFrame:
    """The lowest-MAPE regressor of every (target, split) (baselines are not candidates)."""
    if metrics.empty:
        return metrics.copy()
    metrics = metrics[~metrics["regressor"].str.startswith(BASELINE_PREFIX)]
    idx = metrics.groupby(["target", "split"])["mape"].idxmin()
    return metrics.loc[idx].reset_index(drop=True)


def comparison_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """Regressor comparison per target in the layout of Panner Selvam's Table 6.5: MAPE, RMSE, tau per
    split."""
    if metrics.empty:
        return pd.DataFrame()
    wide = metrics.pivot_table(index=["target", "regressor"], columns="split",
                               values=["mape", "rmse", "kendall_tau"], aggfunc="first")
    wide.columns = [f"{split} {metric}" for metric, split in wide.columns]
    ordered = sorted(wide.columns, key=lambda c: (c.split(" ")[0], ["mape", "rmse", "kendall_tau"].index(c.split(" ")[1])))
    return wide[ordered].reset_index()


def family_table(per_family: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per-family errors in the layout of Panner Selvam's Tables 5.2 (MAPE) / 5.3 (RMSE): families x
    regressors."""
    if per_family.empty:
        return pd.DataFrame()
    wide = per_family.pivot_table(index=["target", "split", "family"], columns="regressor", values=metric,
                                  aggfunc="first")
    wide.columns = [str(c) for c in wide.columns]
    return wide.reset_index()


def error_quantiles(predictions: pd.DataFrame) -> pd.DataFrame:
    """Absolute relative error per held-out prediction (for the error CDF)."""
    rows = test_rows(predictions)
    return rows.assign(abs_rel_error=(rows["y_pred"] - rows["y_true"]).abs() / rows["y_true"].abs())[
        [*GROUP, "family", "abs_rel_error"]].reset_index(drop=True)
