"""Statistics shared by profiling (adaptive stopping) and evaluation (metrics)."""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054


def median_ci(values: np.ndarray | list[float], z: float = Z95) -> tuple[float, float, float]:
    """Median and its distribution-free 95 % confidence interval (binomial order statistics)."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan
    med = float(np.median(x))
    half = z * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)), 0)
    hi = min(int(math.ceil(n / 2 + half)), n - 1)
    return med, float(x[lo]), float(x[hi])


def relative_ci_halfwidth(values: np.ndarray | list[float]) -> float:
    """Half the width of the median's 95 % CI, as a fraction of the median."""
    med, lo, hi = median_ci(values)
    return (hi - lo) / 2 / med if med > 0 else math.inf


def coefficient_of_variation(values: np.ndarray | list[float]) -> float:
    x = np.asarray(values, dtype=float)
    return float(np.std(x, ddof=1) / np.mean(x)) if len(x) > 1 and np.mean(x) > 0 else math.nan


def mape(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    y_true, y_pred = np.asarray(y_true, float), np.asarray(y_pred, float)
    return float(np.mean(np.abs(y_pred - y_true) / np.abs(y_true)) * 100) if len(y_true) else math.nan


def rmse(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    y_true, y_pred = np.asarray(y_true, float), np.asarray(y_pred, float)
    return float(np.sqrt(np.mean((y_pred - y_true) ** 2))) if len(y_true) else math.nan


def r2(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    y_true, y_pred = np.asarray(y_true, float), np.asarray(y_pred, float)
    ss_tot = float(np.sum((y_true - y_true.mean()) ** 2)) if len(y_true) else 0.0
    return 1 - float(np.sum((y_true - y_pred) ** 2)) / ss_tot if ss_tot > 0 else math.nan


def kendall_tau(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    if len(y_true) < 2:
        return math.nan
    from scipy import stats  # lazy: ~1.5 s to import; the profiling worker and dataset rule never need it

    return float(stats.kendalltau(y_true, y_pred).statistic)


def within(y_true: np.ndarray, y_pred: np.ndarray, tolerance: float = 0.10) -> float:
    """Share (0-1) of predictions within ``tolerance`` relative error."""
    y_true, y_pred = np.asarray(y_true, float), np.asarray(y_pred, float)
    return float(np.mean(np.abs(y_pred - y_true) <= tolerance * np.abs(y_true) * (1 + 1e-9))) if len(y_true) else math.nan


METRICS = {"mape": mape, "rmse": rmse, "kendall_tau": kendall_tau, "r2": r2, "within_10pct": within}


def mape_interval(y_true: np.ndarray, y_pred: np.ndarray, units: np.ndarray, level: float = 0.9,
                  n_resamples: int = 999, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval (``level``) of the MAPE, in percent, resampling whole ``units`` (one label per
    row, e.g. the rows' families): the rows of a unit share its error, so they are drawn together (a cluster
    bootstrap; scipy's ``bootstrap`` on each unit's summed error and row count, paired). Seeded, so a table is
    the same on every run. NaN with fewer than two units."""
    y_true, y_pred = np.asarray(y_true, float), np.asarray(y_pred, float)
    uniques, codes = np.unique(np.asarray(units).astype(str), return_inverse=True)
    codes = codes.ravel()
    if len(uniques) < 2:
        return math.nan, math.nan
    errors = np.bincount(codes, weights=np.abs(y_pred - y_true) / np.abs(y_true))
    rows = np.bincount(codes).astype(float)
    if np.all(errors / rows == errors[0] / rows[0]):  # every resample gives the same MAPE
        return (float(errors[0] / rows[0] * 100),) * 2
    from scipy import stats  # lazy, as in kendall_tau

    result = stats.bootstrap((errors, rows), lambda e, n, axis: e.sum(axis=axis) / n.sum(axis=axis) * 100,
                             paired=True, vectorized=True, confidence_level=level, n_resamples=n_resamples,
                             method="percentile", rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def all_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    return {name: fn(y_true, y_pred) for name, fn in METRICS.items()}


def conformal_halfwidth(abs_residuals: np.ndarray | list[float], level: float) -> float:
    """Split-conformal half-width: the ``ceil((n+1)·level)``-th smallest absolute residual.

    Vovk, Gammerman and Shafer, "Algorithmic Learning in a Random World"; Lei et al., "Distribution-Free
    Predictive Inference for Regression". ``inf`` when there are too few residuals for ``level``.
    """
    r = np.sort(np.asarray(abs_residuals, dtype=np.float64))
    rank = math.ceil((r.size + 1) * level)
    return float(r[rank - 1]) if 0 < rank <= r.size else math.inf


def mean_and_scale(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column means and standard deviations; a constant column gets scale 1."""
    mean = A.mean(axis=0)
    scale = A.std(axis=0)
    scale[~(scale > 0)] = 1.0
    return mean, scale
