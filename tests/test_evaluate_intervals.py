"""Cross-conformal 90 % intervals of the evaluate stage: coverage on held-out rows, calibration without the
own fold, too few residuals, and the same calibration behind what ``perfzoo predict`` prints."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfzoo.evaluate import (
    LEAVE_ONE_FOLD_OUT,
    LEAVE_ONE_ROW_OUT,
    MIN_CALIBRATION_ROWS,
    calibrate,
    log_residuals,
    metrics_table,
    with_intervals,
)
from perfzoo.stats import conformal_halfwidth

NOISE = pd.DataFrame({"target": ["latency_ms"], "noise_mape": [0.0]})


def held_out(log_errors: np.ndarray, folds: list[str] | np.ndarray, regressor: str = "linear") -> pd.DataFrame:
    """Held-out test rows of one (target, regressor, split) with the given log errors of the prediction."""
    n = len(log_errors)
    y_pred = np.linspace(1.0, 100.0, n)
    return pd.DataFrame({"target": "latency_ms", "regressor": regressor, "split": "s", "fold": np.asarray(folds),
                         "set": "test", "row_id": [f"r{i}" for i in range(n)], "family": "f",
                         "y_true": y_pred * np.exp(log_errors), "y_pred": y_pred, "y_lo": np.nan, "y_hi": np.nan})


def halfwidths(rows: pd.DataFrame) -> np.ndarray:
    return np.log(rows["y_hi"].to_numpy() / rows["y_pred"].to_numpy())


def test_cross_conformal_coverage_is_near_ninety_percent_with_known_noise() -> None:
    rng = np.random.default_rng(0)
    n = 2000
    rows = with_intervals(held_out(rng.normal(0, 0.2, n), rng.choice(list("abcde"), n)))
    inside = ((rows["y_true"] >= rows["y_lo"]) & (rows["y_true"] <= rows["y_hi"])).mean()
    assert 0.875 <= inside <= 0.925  # 2000 rows: binomial sd 0.7 %
    assert np.median(halfwidths(rows)) == pytest.approx(1.645 * 0.2, rel=0.08)  # the normal 90 % quantile
    row = metrics_table(rows, NOISE).iloc[0]
    assert row["coverage90"] == pytest.approx(inside) and row["n_interval"] == n
    assert row["interval_method"] == LEAVE_ONE_FOLD_OUT and row["interval_missing"] == ""


def test_a_fold_is_calibrated_on_the_other_folds_only() -> None:
    # fold a predicts almost exactly, fold b is off by a factor e: each fold's half-width is the other's quantile
    rng = np.random.default_rng(1)
    small, large = rng.uniform(0, 0.01, 30), rng.uniform(0.9, 1.1, 30)
    rows = with_intervals(held_out(np.concatenate([small, large]), ["a"] * 30 + ["b"] * 30))
    q = halfwidths(rows)
    assert np.allclose(q[:30], conformal_halfwidth(large, 0.9))  # fold a: only fold b's residuals
    assert np.allclose(q[30:], conformal_halfwidth(small, 0.9))  # fold b: only fold a's residuals
    assert (rows["y_true"].iloc[30:] > rows["y_hi"].iloc[30:]).all()  # so fold b is not covered


def test_a_row_held_out_by_several_folds_does_not_calibrate_itself() -> None:
    # Monte-Carlo repeats: rows r0-r29 are held out by fold a and again, far off, by fold c
    rng = np.random.default_rng(3)
    small, other = rng.uniform(0, 0.01, 30), rng.uniform(0.1, 0.2, 30)
    rows = held_out(np.concatenate([small, other, np.full(30, 5.0)]), ["a"] * 30 + ["b"] * 30 + ["c"] * 30)
    rows["row_id"] = [f"r{i}" for i in range(60)] + [f"r{i}" for i in range(30)]
    q = halfwidths(with_intervals(rows))
    assert np.allclose(q[:30], conformal_halfwidth(other, 0.9))  # fold a: fold b only, not its rows in fold c


def test_a_single_fold_leaves_each_row_out_of_its_own_calibration() -> None:
    errors = np.linspace(0.01, 0.3, 25)
    rows = with_intervals(held_out(errors, ["only"] * 25))
    expected = [conformal_halfwidth(np.delete(errors, i), 0.9) for i in range(25)]
    assert np.allclose(halfwidths(rows), expected)
    assert (rows["interval_method"] == LEAVE_ONE_ROW_OUT).all()
    assert (rows["calibration_rows"] == 24).all()


def test_too_few_calibration_rows_give_no_interval_and_the_reason() -> None:
    per_fold = MIN_CALIBRATION_ROWS // 2  # each fold sees fewer than the minimum from the other
    rows = with_intervals(held_out(np.full(2 * per_fold, 0.1), ["a"] * per_fold + ["b"] * per_fold))
    assert rows["y_lo"].isna().all() and rows["y_hi"].isna().all()
    row = metrics_table(rows, NOISE).iloc[0]
    assert np.isnan(row["coverage90"]) and row["n_interval"] == 0
    assert f"{per_fold} calibration residuals, fewer than the {MIN_CALIBRATION_ROWS} required" in row["interval_missing"]
    assert math.isnan(calibrate(np.array([0.1, np.nan] * MIN_CALIBRATION_ROWS)[:MIN_CALIBRATION_ROWS]).q)


def test_own_intervals_of_a_regressor_are_kept() -> None:
    rows = held_out(np.zeros(30), ["a"] * 15 + ["b"] * 15, regressor="device_transfer")
    rows = rows.assign(y_lo=rows["y_pred"] * 0.5, y_hi=rows["y_pred"] * 2.0)
    out = with_intervals(rows)
    assert np.allclose(out["y_hi"], rows["y_pred"] * 2.0)
    assert metrics_table(out, NOISE).iloc[0]["interval_method"] == "the regressor's own intervals"


def test_predict_prints_the_calibration_and_coverage_of_the_metrics_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfzoo import evaluate
    from perfzoo.fitting import save_models
    from perfzoo.prediction.predictors import load_predictors
    from perfzoo.regressors import make_regressor

    rng = np.random.default_rng(2)
    n = 120
    x = rng.uniform(1, 10, n)
    X = pd.DataFrame({"flops": x})
    model = make_regressor("linear").fit(X, 2 * x)
    held = held_out(rng.normal(0, 0.2, n), rng.choice(list("abc"), n)).assign(split="random")
    fit_dir = tmp_path / "fit" / "latency_ms" / "linear"
    fit_dir.mkdir(parents=True)
    held.to_parquet(fit_dir / "random.predictions.parquet")
    save_models(fit_dir / "random.models.json", {"a": model}, {})
    (tmp_path / "evaluate").mkdir()
    metrics = metrics_table(with_intervals(held), NOISE)
    metrics.to_parquet(tmp_path / "evaluate" / "metrics.parquet")
    predictor = load_predictors(tmp_path, pd.DataFrame())[0]["latency_ms"]
    point, lo, hi, method = predictor.predict(X.iloc[:1])
    q = calibrate(log_residuals(held["y_true"], held["y_pred"])).q  # over all held-out rows of the split
    assert hi[0] / point[0] == pytest.approx(math.exp(q)) and point[0] / lo[0] == pytest.approx(math.exp(q))
    row = metrics.iloc[0]
    assert f"measured coverage {row['coverage90']:.0%} of {row['n_interval']} held-out test rows" in method
    assert f"over {n} held-out rows of split random" in method
    # one calibration behind both: change it, and the metrics' intervals and the printed one change together
    monkeypatch.setattr(evaluate, "conformal_halfwidth", lambda residuals, level: 0.5)
    assert np.allclose(halfwidths(with_intervals(held)), 0.5)
    predictor = load_predictors(tmp_path, pd.DataFrame())[0]["latency_ms"]
    point, _, hi, _ = predictor.predict(X.iloc[:1])
    assert hi[0] / point[0] == pytest.approx(math.exp(0.5))


def test_rows_a_regressor_gave_no_prediction_are_counted_without_baselines_too() -> None:
    """A held-out row missing a feature the regressor uses gets no prediction; the table counts it whether or not
    the run has baselines to compare with."""
    rows = held_out(np.zeros(10), list("ab" * 5))
    rows.loc[[2, 7], "y_pred"] = np.nan
    row = metrics_table(rows, NOISE).iloc[0]
    assert row["n"] == 8 and row["n_missing"] == 2
