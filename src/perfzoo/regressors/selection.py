"""Hyper-parameter selection: K-fold (or grouped K-fold) cross-validated grid search by validation MAPE."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold, KFold, ParameterGrid
from tqdm.auto import tqdm

from perfzoo.io import InputError
from perfzoo.regressors.base import Regressor
from perfzoo.stats import mape


def _cv_splits(
    n_rows: int, groups: np.ndarray | None, cv: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """K-fold splits; with ``groups`` no group spans train and validation (GroupKFold)."""
    index = np.zeros((n_rows, 1))
    if groups is not None:
        n_groups = len(pd.unique(groups))
        if n_groups < 2:
            raise InputError("grid search: need at least 2 groups for grouped cross-validation")
        return list(GroupKFold(n_splits=min(cv, n_groups)).split(index, groups=groups))
    if n_rows < 2:
        raise InputError("grid search: need at least 2 rows")
    return list(KFold(n_splits=min(cv, n_rows), shuffle=True, random_state=seed).split(index))


def cross_validated_grid(
    make: Callable[[dict[str, Any]], Regressor],
    X: pd.DataFrame,
    y: np.ndarray,
    grid: Mapping[str, Sequence[Any]],
    groups: np.ndarray | None = None,
    cv: int = 5,
    seed: int = 0,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Mean validation MAPE (percent, :func:`perfzoo.stats.mape`) of every grid point; returns the
    best point and all results (``{"params": point, "mape": percent}``, ``inf`` for a non-finite mean).

    Uses only the rows given (pass the training split); ties keep the earlier grid point.
    """
    splits = _cv_splits(len(X), groups, cv, seed)
    results: list[dict[str, Any]] = []
    for point in tqdm(list(ParameterGrid(dict(grid))), desc="grid search", mininterval=5.0):
        scores = []
        for train, valid in splits:
            reg = make(point).fit(X.iloc[train], y[train])
            scores.append(mape(y[valid], reg.predict(X.iloc[valid])))
        mean = float(np.mean(scores))
        results.append({"params": point, "mape": mean if math.isfinite(mean) else math.inf})
    best = min(results, key=lambda r: r["mape"])
    return dict(best["params"]), results
