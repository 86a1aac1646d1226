"""Linear-family regressors: the roofline bound with a fitted factor per device, ridge regression on
log features (a power law), and a NeuralPower-like sparse polynomial (Lasso on log-feature monomials)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations_with_replacement
from typing import ClassVar

import numpy as np
import pandas as pd
from sklearn.linear_model import Lasso, LassoCV, Ridge
from sklearn.model_selection import KFold
from sklearn.utils.validation import check_is_fitted

from perfzoo.io import InputError
from perfzoo.regressors.base import (
    LogFeatureRegressor,
    Regressor,
    check_frame,
    column_medians,
    group_labels,
    impute,
    numeric_matrix,
    register_regressor,
    require_columns,
    sorted_importances,
)
from perfzoo.stats import mean_and_scale


@register_regressor
class RooflineRegressor(Regressor):
    """Roofline time times one measured/roofline factor per device.

    ``t_roof = max(flops / (hw_peak_gflops·1e9), (weight_bytes + activation_bytes) / (hw_mem_bw_gbs·1e9))``
    in seconds, reported in ms. The only learned quantity is ``factors_[device] = median(y / t_roof)``
    over the training rows of that device (the inverse of the achieved efficiency); devices not
    seen in training use ``global_factor_``, the median over all rows. ``flops`` counts floating
    point operations (not MACs) of one step at the row's batch size. Non-positive hardware peaks
    are treated as missing. With ``group_col=None`` a single global factor is used. With
    ``log_target=True`` the factors are geometric (median of ``log(y / t_roof)``).
    """

    kind = "roofline"
    only_targets = ("latency_ms",)
    required_columns: ClassVar[tuple[str, ...]] = (
        "flops",
        "weight_bytes",
        "activation_bytes",
        "hw_peak_gflops",
        "hw_mem_bw_gbs",
    )

    def __init__(self, group_col: str | None = "device", log_target: bool = False) -> None:
        self.group_col = group_col
        self.log_target = log_target

    def _check_columns(self, X: pd.DataFrame) -> None:
        needed = list(self.required_columns) + ([self.group_col] if self.group_col else [])
        require_columns(check_frame(X), needed, what="roofline")

    @staticmethod
    def _roofline_ms(A: np.ndarray) -> np.ndarray:
        flops, weight_bytes, activation_bytes, peak_gflops, bw_gbs = A.T
        compute_s = flops / (peak_gflops * 1e9)
        memory_s = (weight_bytes + activation_bytes) / (bw_gbs * 1e9)
        return np.maximum(compute_s, memory_s) * 1e3

    def _roofline_inputs(self, X: pd.DataFrame) -> np.ndarray:
        A = numeric_matrix(X, self.required_columns)
        A[:, 3:][A[:, 3:] <= 0] = np.nan
        return A

    def _groups(self, X: pd.DataFrame) -> np.ndarray:
        return group_labels(X, self.group_col, "roofline group")

    def _summarise(self, ratios: np.ndarray) -> float:
        if self.log_target:
            return float(np.exp(np.median(np.log(ratios))))
        return float(np.median(ratios))

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> RooflineRegressor:
        self._check_columns(X)
        A = self._roofline_inputs(X)
        self.feature_names_ = list(self.required_columns)
        self.n_features_in_ = len(self.required_columns)
        self.medians_ = column_medians(A)
        target = np.asarray(y, dtype=np.float64).ravel()
        if target.shape[0] != len(X):
            raise InputError(f"y has {target.shape[0]} values but X has {len(X)} rows")
        ratios = target / self._roofline_ms(impute(A, self.medians_))
        usable = np.isfinite(ratios) & (ratios > 0)
        if not usable.any():
            raise InputError("roofline: no training row has a positive, finite target and roofline time")
        groups = self._groups(X)
        self.global_factor_ = self._summarise(ratios[usable])
        self.factors_ = {
            str(g): self._summarise(ratios[usable & (groups == g)]) for g in sorted(set(groups[usable]))
        }
        return self

    def roofline_ms(self, X: pd.DataFrame) -> np.ndarray:
        """Unscaled roofline time in ms for each row."""
        check_is_fitted(self, "factors_")
        self._check_columns(X)
        return self._roofline_ms(impute(self._roofline_inputs(X), self.medians_))

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        t_roof = self.roofline_ms(X)
        factor = np.array([self.factors_.get(g, self.global_factor_) for g in self._groups(X)], dtype=float)
        return t_roof * factor


@register_regressor
class LinearRegressor(LogFeatureRegressor):
    """Ridge regression on standardised log features (a power law when ``log_target``)."""

    kind = "linear"

    def __init__(
        self, alpha: float = 1.0, log_target: bool = True, features: Sequence[str] | None = None
    ) -> None:
        self.alpha = alpha
        self.log_target = log_target
        self.features = features

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> LinearRegressor:
        Z = self._fit_log_features(X)
        model = Ridge(alpha=self.alpha).fit(Z, self._encode_target(y, len(X)))
        self.coef_ = np.asarray(model.coef_, dtype=np.float64)
        self.intercept_ = float(model.intercept_)
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return self._decode_target(self._log_features(X) @ self.coef_ + self.intercept_)

    def _importances(self) -> pd.Series:
        return sorted_importances(self.feature_names_, np.abs(self.coef_))


def _polynomial_powers(n_features: int, degree: int) -> np.ndarray:
    """Exponents of all monomials of degree 1..``degree`` (no bias), PolynomialFeatures order."""
    rows = []
    for d in range(1, degree + 1):
        for combo in combinations_with_replacement(range(n_features), d):
            rows.append(np.bincount(combo, minlength=n_features))
    return np.array(rows, dtype=np.int64).reshape(-1, n_features)


def _expand_polynomial(Z: np.ndarray, powers: np.ndarray) -> np.ndarray:
    out = np.ones((Z.shape[0], powers.shape[0]), dtype=np.float64)
    for j, exponents in enumerate(powers):
        for i in np.flatnonzero(exponents):
            out[:, j] *= Z[:, i] ** int(exponents[i])
    return out


def _term_names(names: Sequence[str], powers: np.ndarray) -> list[str]:
    def monomial(exponents: np.ndarray) -> str:
        parts = [names[i] if e == 1 else f"{names[i]}^{e}" for i, e in enumerate(exponents) if e]
        return " ".join(parts)

    return [monomial(p) for p in powers]


@register_regressor
class PolyLassoRegressor(LogFeatureRegressor):
    """Sparse polynomial like NeuralPower (Cai, Juan, Stamoulis and Marculescu, "NeuralPower: Predict and
    Deploy Energy-Efficient Convolutional Neural Networks"): degree-``degree`` monomials of log features,
    Lasso.

    ``alpha=None`` picks the penalty by ``cv``-fold cross-validation (LassoCV, shuffled with
    ``random_state``); coordinate descent is cyclic, so the fit is deterministic.
    """

    kind = "poly_lasso"

    def __init__(
        self,
        degree: int = 2,
        alpha: float | None = None,
        cv: int = 5,
        max_iter: int = 20000,
        random_state: int = 0,
        log_target: bool = True,
        features: Sequence[str] | None = None,
    ) -> None:
        self.degree = degree
        self.alpha = alpha
        self.cv = cv
        self.max_iter = max_iter
        self.random_state = random_state
        self.log_target = log_target
        self.features = features

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> PolyLassoRegressor:
        if int(self.degree) < 1:
            raise InputError(f"poly_lasso: degree must be >= 1, got {self.degree}")
        Z = self._fit_log_features(X)
        target = self._encode_target(y, len(X))
        self.powers_ = _polynomial_powers(Z.shape[1], int(self.degree))
        P = _expand_polynomial(Z, self.powers_)
        self.term_mean_, self.term_scale_ = mean_and_scale(P)
        Q = (P - self.term_mean_) / self.term_scale_
        if self.alpha is None:
            folds = KFold(n_splits=min(int(self.cv), len(X)), shuffle=True, random_state=self.random_state)
            model = LassoCV(cv=folds, max_iter=self.max_iter, n_jobs=1).fit(Q, target)
            self.alpha_ = float(model.alpha_)
        else:
            model = Lasso(alpha=self.alpha, max_iter=self.max_iter).fit(Q, target)
            self.alpha_ = float(self.alpha)
        self.coef_ = np.asarray(model.coef_, dtype=np.float64)
        self.intercept_ = float(model.intercept_)
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        P = _expand_polynomial(self._log_features(X), self.powers_)
        return self._decode_target(((P - self.term_mean_) / self.term_scale_) @ self.coef_ + self.intercept_)

    @property
    def term_names_(self) -> list[str]:
        """Readable names of the polynomial terms, aligned with ``coef_``."""
        return _term_names(self.feature_names_, self.powers_)

    def _importances(self) -> pd.Series:
        return sorted_importances(self.term_names_, np.abs(self.coef_))
