"""Evaluate stage: accuracy metrics of every (target, regressor, split) on held-out test rows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfzoo.stats import METRICS, all_metrics, mape, rmse

GROUP = ["target", "regressor", "split"]
BASELINE_PREFIX = "baseline:"
METRIC_COLUMNS = [*GROUP, "n", "folds", *METRICS, "noise_floor_mape"]
FAMILY_COLUMNS = [*GROUP, "family", "n", "mape", "rmse"]


def test_rows(predictions: pd.DataFrame) -> pd.DataFrame:
    return predictions[predictions["set"] == "test"]


def interval_coverage(rows: pd.DataFrame) -> dict[str, float]:
    """Share of rows whose ``y_true`` lies in ``[y_lo, y_hi]``, over the rows that have an interval."""
    if not {"y_lo", "y_hi"} <= set(rows.columns):
        return {"n_interval": 0, "coverage90": np.nan}
    has = rows["y_lo"].notna() & rows["y_hi"].notna()
    inside = (rows["y_true"] >= rows["y_lo"]) & (rows["y_true"] <= rows["y_hi"])
    return {"n_interval": int(has.sum()), "coverage90": float(inside[has].mean()) if has.any() else np.nan}


def metrics_table(predictions: pd.DataFrame, noise: pd.DataFrame) -> pd.DataFrame:
    """MAPE, RMSE, Kendall tau, R2, share within 10 %, pooled over folds, with the noise floor.

    Rows without a prediction (a baseline without a source row) are left out and counted in
    ``n_missing``; ``coverage90`` is the empirical coverage of the 90 % intervals where the
    predictions carry them. With baseline rows present (regressor ``baseline:*``), every other row
    names the best baseline of its (target, split) and whether it beats it (``beats_baseline``).
    """
    rows = []
    for (target, regressor, split), g in test_rows(predictions).groupby(GROUP, sort=True):
        ok = g[np.isfinite(g["y_pred"].to_numpy(dtype=float))]
        rows.append({"target": target, "regressor": regressor, "split": split, "n": len(ok),
                     "folds": g["fold"].nunique(), **all_metrics(ok["y_true"].to_numpy(), ok["y_pred"].to_numpy()),
                     "n_missing": len(g) - len(ok), **interval_coverage(ok)})
    if not rows:  # no held-out predictions at all (every family failed): an empty, well-formed table
        return pd.DataFrame(columns=METRIC_COLUMNS)
    table = pd.DataFrame(rows)
    if not table["regressor"].str.startswith(BASELINE_PREFIX).any():
        table = table.drop(columns=["n_missing", "n_interval", "coverage90"])
    else:
        table = compare_with_baselines(table)
    floor = noise.groupby("target")["noise_mape"].mean().rename("noise_floor_mape")
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
