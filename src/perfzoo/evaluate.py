"""Evaluate stage: accuracy metrics of every (target, regressor, split) on held-out test rows."""

from __future__ import annotations

import pandas as pd

from perfzoo.stats import METRICS, all_metrics, mape, rmse

GROUP = ["target", "regressor", "split"]
METRIC_COLUMNS = [*GROUP, "n", "folds", *METRICS, "noise_floor_mape"]
FAMILY_COLUMNS = [*GROUP, "family", "n", "mape", "rmse"]


def test_rows(predictions: pd.DataFrame) -> pd.DataFrame:
    return predictions[predictions["set"] == "test"]


def metrics_table(predictions: pd.DataFrame, noise: pd.DataFrame) -> pd.DataFrame:
    """MAPE, RMSE, Kendall tau, R2, share within 10 %, pooled over folds, with the noise floor."""
    rows = []
    for (target, regressor, split), g in test_rows(predictions).groupby(GROUP, sort=True):
        rows.append({"target": target, "regressor": regressor, "split": split, "n": len(g),
                     "folds": g["fold"].nunique(), **all_metrics(g["y_true"].to_numpy(), g["y_pred"].to_numpy())})
    if not rows:  # no held-out predictions at all (every family failed): an empty, well-formed table
        return pd.DataFrame(columns=METRIC_COLUMNS)
    table = pd.DataFrame(rows)
    floor = noise.groupby("target")["noise_mape"].mean().rename("noise_floor_mape")
    return table.merge(floor, left_on="target", right_index=True, how="left") if len(table) else table


def per_family_table(predictions: pd.DataFrame) -> pd.DataFrame:
    """MAPE and RMSE per family of the held-out rows (seed 003 Tables 5.2/5.3 layout, long form)."""
    rows = []
    for (target, regressor, split, family), g in test_rows(predictions).groupby([*GROUP, "family"], sort=True):
        y, p = g["y_true"].to_numpy(), g["y_pred"].to_numpy()
        rows.append({"target": target, "regressor": regressor, "split": split, "family": family,
                     "n": len(g), "mape": mape(y, p), "rmse": rmse(y, p)})
    return pd.DataFrame(rows, columns=FAMILY_COLUMNS)


def best_per_target(metrics: pd.DataFrame) -> pd.DataFrame:
    """The lowest-MAPE regressor of every (target, split)."""
    if metrics.empty:
        return metrics.copy()
    idx = metrics.groupby(["target", "split"])["mape"].idxmin()
    return metrics.loc[idx].reset_index(drop=True)


def comparison_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """Regressor comparison per target in the layout of seed 003 Table 6.5: MAPE, RMSE, tau per split."""
    if metrics.empty:
        return pd.DataFrame()
    wide = metrics.pivot_table(index=["target", "regressor"], columns="split",
                               values=["mape", "rmse", "kendall_tau"], aggfunc="first")
    wide.columns = [f"{split} {metric}" for metric, split in wide.columns]
    ordered = sorted(wide.columns, key=lambda c: (c.split(" ")[0], ["mape", "rmse", "kendall_tau"].index(c.split(" ")[1])))
    return wide[ordered].reset_index()


def family_table(per_family: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per-family errors in the layout of seed 003 Tables 5.2 (MAPE) / 5.3 (RMSE): families x regressors."""
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
