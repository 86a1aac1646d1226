"""Regressors that predict latency, memory and energy of a model on a device from tabular features.

All regressors follow scikit-learn's estimator contract (the constructor only stores parameters,
``fit`` returns ``self``, ``predict`` takes a DataFrame, fitted attributes end in ``_``) and share
the same input handling:

- ``X`` is a DataFrame that may hold non-numeric columns (``device``, ``family``, ``model_id``).
  Learned models use its numeric columns (or the ``features`` parameter), remembered at fit time in
  ``feature_names_``; a feature column missing at predict time raises :class:`InputError`.
- NaN and ±inf feature values are replaced by the training median of their column (0 when the
  column was entirely missing in training).
- Targets are positive quantities (ms, MB, W, J). With ``log_target=True`` a regressor fits
  ``log(y)`` and returns ``exp(prediction)`` in the original units.

A fitted regressor is saved as one JSON file without pickle: coefficients, MLP weights and the node
arrays of every tree as JSON numbers or (large arrays) compressed little-endian bytes, XGBoost
boosters as their native JSON model text. Learned models other than XGBoost predict with numpy from
those arrays alone, so a loaded regressor needs neither scikit-learn's estimator objects nor
unpickling; arrays round-trip exactly, so predictions after loading are bit-identical to those
before saving.
"""

from __future__ import annotations

import base64
import json
import math
import os
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import combinations_with_replacement
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import sklearn
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.model_selection import GroupKFold, KFold
from sklearn.utils.validation import check_is_fitted

from perfzoo import __version__
from perfzoo.io import InputError, atomic_path, read_json, suggest
from perfzoo.stats import mean_and_scale

FILE_FORMAT = "perfzoo.regressor"
FILE_FORMAT_VERSION = 1

__all__ = [
    "REGISTRY",
    "ExtraTreesRegressor",
    "GiannitiE2ERegressor",
    "LinearRegressor",
    "MLPRegressor",
    "PolyLassoRegressor",
    "RandomForestRegressor",
    "Regressor",
    "RooflineRegressor",
    "XGBoostRegressor",
    "feature_importances",
    "load_regressor",
    "make_regressor",
    "register_regressor",
    "save_regressor",
]


# --------------------------------------------------------------------------- input helpers


def _check_frame(X: Any) -> pd.DataFrame:
    if not isinstance(X, pd.DataFrame):
        raise InputError(f"X must be a pandas DataFrame, got {type(X).__name__}")
    return X


def _require_columns(X: pd.DataFrame, columns: Iterable[str], what: str = "feature") -> None:
    missing = [c for c in columns if c not in X.columns]
    if missing:
        raise InputError(f"missing {what} column(s): {', '.join(missing)}")


def _numeric_columns(X: pd.DataFrame) -> list[str]:
    """Names of the numeric (including boolean) columns of ``X``, in order."""
    return [str(c) for c in X.columns if pd.api.types.is_numeric_dtype(X[c])]


def _numeric_matrix(X: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """Columns of ``X`` as a float64 matrix with ±inf turned into NaN."""
    out = np.empty((len(X), len(columns)), dtype=np.float64)
    for j, name in enumerate(columns):
        try:
            values = pd.to_numeric(X[name], errors="raise")
        except (TypeError, ValueError):
            raise InputError(f"feature column {name!r} is not numeric") from None
        out[:, j] = values.to_numpy(dtype=np.float64, na_value=np.nan)
    out[np.isinf(out)] = np.nan
    return out


def _column_medians(A: np.ndarray) -> np.ndarray:
    """Per-column median ignoring NaN; 0.0 for a column without any finite value."""
    medians = np.zeros(A.shape[1], dtype=np.float64)
    for j in range(A.shape[1]):
        finite = A[:, j][~np.isnan(A[:, j])]
        if finite.size:
            medians[j] = float(np.median(finite))
    return medians


def _impute(A: np.ndarray, medians: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(A), medians[None, :], A)


def _signed_log1p(A: np.ndarray) -> np.ndarray:
    """``log1p`` for non-negative values, mirrored for negative ones (monotone, sign-safe)."""
    return np.sign(A) * np.log1p(np.abs(A))



def _mape(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(np.abs(y_pred - y_true) / np.abs(y_true)))


# --------------------------------------------------------------------------- JSON state


#: arrays with at least this many elements are stored as compressed bytes rather than JSON numbers
_BYTES_THRESHOLD = 256


def _to_json(value: Any) -> Any:
    """Encode fitted state as JSON values; arrays keep dtype and shape, floats stay exact."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"cannot store an array of dtype {value.dtype} as JSON")
        if value.size >= _BYTES_THRESHOLD:
            raw = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()
            data = base64.b64encode(zlib.compress(raw, 6)).decode("ascii")
            return {"__ndarray_zlib__": data, "dtype": value.dtype.name, "shape": list(value.shape)}
        flat = [_to_json(v) for v in value.ravel().tolist()]
        return {"__ndarray__": flat, "dtype": value.dtype.name, "shape": list(value.shape)}
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, Mapping):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} as JSON")


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if "__ndarray__" in value:
            flat = [_from_json(v) for v in value["__ndarray__"]]
            return np.array(flat, dtype=value["dtype"]).reshape(value["shape"])
        if "__ndarray_zlib__" in value:
            raw = zlib.decompress(base64.b64decode(value["__ndarray_zlib__"]))
            dtype = np.dtype(value["dtype"]).newbyteorder("<")
            return np.frombuffer(raw, dtype=dtype).astype(value["dtype"]).reshape(value["shape"])
        if "__float__" in value:
            return float(value["__float__"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _package_versions(*extra: str) -> dict[str, str]:
    versions = {"perfzoo": __version__, "numpy": np.__version__, "scikit-learn": sklearn.__version__}
    for name in extra:
        module = __import__(name)
        versions[name] = module.__version__
    return versions


# --------------------------------------------------------------------------- base class


class Regressor(RegressorMixin, BaseEstimator):
    """Common input handling, target transform and pickle-free persistence."""

    kind: ClassVar[str] = ""
    #: fitted attributes a saved document must hold for :meth:`predict` to work
    _required_state: ClassVar[tuple[str, ...]] = ("feature_names_",)
    #: fitted attributes kept out of the JSON state (stored in the payload instead)
    _payload_attrs: ClassVar[tuple[str, ...]] = ()

    # -- features

    def _feature_columns(self, X: pd.DataFrame) -> list[str]:
        """``features`` if given, else every numeric column of ``X``."""
        chosen = getattr(self, "features", None)
        if chosen is not None:
            columns = [str(c) for c in chosen]
            _require_columns(X, columns)
            return columns
        columns = _numeric_columns(X)
        if not columns:
            raise InputError("X has no numeric feature columns")
        return columns

    def _fit_matrix(self, X: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
        """Remember the feature columns and their medians; return the imputed training matrix."""
        A = _numeric_matrix(X, columns)
        self.feature_names_ = list(columns)
        self.n_features_in_ = len(columns)
        self.medians_ = _column_medians(A)
        return _impute(A, self.medians_)

    def _matrix(self, X: pd.DataFrame) -> np.ndarray:
        """Imputed feature matrix of ``X`` in the fitted column order."""
        check_is_fitted(self, "feature_names_")
        X = _check_frame(X)
        _require_columns(X, self.feature_names_)
        return _impute(_numeric_matrix(X, self.feature_names_), self.medians_)

    # -- target

    def _encode_target(self, y: pd.Series | np.ndarray, n_rows: int) -> np.ndarray:
        t = np.asarray(y, dtype=np.float64).ravel()
        if t.shape[0] != n_rows:
            raise InputError(f"y has {t.shape[0]} values but X has {n_rows} rows")
        if n_rows == 0:
            raise InputError("cannot fit on zero rows")
        if not np.isfinite(t).all():
            raise InputError(f"y holds {int((~np.isfinite(t)).sum())} missing or infinite values")
        if self.log_target:
            if (t <= 0).any():
                n_bad = int((t <= 0).sum())
                raise InputError(f"log_target needs positive targets; y holds {n_bad} values <= 0")
            return np.log(t)
        return t

    def _decode_target(self, z: np.ndarray) -> np.ndarray:
        return np.exp(z) if self.log_target else z

    # -- persistence

    def _fitted_state(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in vars(self).items()
            if k.endswith("_") and not k.startswith("_") and k not in self._payload_attrs
        }

    def _dump_payload(self) -> dict[str, str] | None:
        return None

    def _load_payload(self, payload: dict[str, str] | None, source: str) -> None:
        return None

    _payload_modules: ClassVar[tuple[str, ...]] = ()

    def to_document(self) -> dict[str, Any]:
        """The JSON document :meth:`save` writes."""
        check_is_fitted(self, "feature_names_")
        return {
            "format": FILE_FORMAT,
            "format_version": FILE_FORMAT_VERSION,
            "kind": self.kind,
            "params": _to_json(self.get_params(deep=False)),
            "state": _to_json(self._fitted_state()),
            "payload": self._dump_payload(),
            "versions": _package_versions(*self._payload_modules),
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the fitted regressor to one JSON file, atomically."""
        text = json.dumps(self.to_document(), allow_nan=False, sort_keys=True)
        with atomic_path(path) as tmp:
            tmp.write_text(text + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Regressor:
        """Read a regressor written by :meth:`save`; it must be of this class."""
        reg = load_regressor(path)
        if not isinstance(reg, cls):
            raise InputError(f"{path}: holds a {reg.kind!r} regressor, not {cls.kind!r}")
        return reg

    @classmethod
    def from_document(cls, doc: Mapping[str, Any], source: str = "<document>") -> Regressor:
        try:
            reg = cls(**_from_json(doc["params"]))
        except TypeError as exc:
            raise InputError(f"{source}: parameters do not match regressor {cls.kind!r} ({exc})") from None
        state = _from_json(doc["state"])
        lacking = [name for name in cls._required_state if name not in state]
        if lacking:
            raise InputError(
                f"{source}: {cls.kind!r} regressor without fitted {', '.join(lacking)} (written by another "
                f"perfzoo version?); refit it with `snakemake --cores all`"
            )
        for name, value in state.items():
            setattr(reg, name, value)
        reg._load_payload(doc.get("payload"), source)
        return reg

    # -- optional extras

    def _importances(self) -> pd.Series | None:
        return None


# --------------------------------------------------------------------------- registry


REGISTRY: dict[str, type[Regressor]] = {}


def register_regressor(cls: type[Regressor]) -> type[Regressor]:
    """Class decorator: make ``cls`` available under ``cls.kind``."""
    if not cls.kind:
        raise ValueError(f"{cls.__name__} has no kind name")
    REGISTRY[cls.kind] = cls
    return cls



def make_regressor(name: str, **params: Any) -> Regressor:
    """Instantiate the regressor registered as ``name`` with ``params``."""
    cls = REGISTRY.get(name)
    if cls is None:
        raise InputError(
            f"unknown regressor {name!r}{suggest(name, REGISTRY)} (known: {', '.join(sorted(REGISTRY))})"
        )
    valid = cls._get_param_names()
    unknown = [p for p in params if p not in valid]
    if unknown:
        hints = "".join(suggest(p, valid) for p in unknown)
        raise InputError(
            f"regressor {name!r}: unknown parameter(s) {', '.join(unknown)}{hints}"
            f" (valid: {', '.join(valid)})"
        )
    return cls(**params)


def save_regressor(reg: Regressor, path: str | os.PathLike[str]) -> None:
    """Write a fitted regressor to ``path`` (one JSON file, no pickle)."""
    reg.save(path)


def load_regressor(path: str | os.PathLike[str]) -> Regressor:
    """Read any regressor written by :func:`save_regressor`, dispatching on its stored kind."""
    doc = read_json(path)
    if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT:
        raise InputError(f"{path}: not a perfzoo regressor file")
    if doc.get("format_version") != FILE_FORMAT_VERSION:
        raise InputError(f"{path}: unsupported regressor file version {doc.get('format_version')!r}")
    return regressor_from_document(doc, str(path))


def regressor_from_document(doc: Mapping[str, Any], source: str) -> Regressor:
    """Rebuild a fitted regressor from its JSON document, dispatching on the stored kind."""
    kind = doc.get("kind")
    cls = REGISTRY.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise InputError(f"{source}: unknown regressor kind {kind!r}{suggest(str(kind), REGISTRY)}")
    return cls.from_document(doc, source=source)


def feature_importances(reg: Regressor) -> pd.Series | None:
    """Importance per feature, largest first: tree importances, or |coefficient| of linear models.

    ``None`` for regressors without a per-feature importance (roofline, Gianniti, MLP).
    """
    check_is_fitted(reg, "feature_names_")
    return reg._importances()


def _sorted_importances(names: Sequence[str], values: np.ndarray) -> pd.Series:
    series = pd.Series(np.asarray(values, dtype=np.float64), index=list(names), name="importance")
    return series.sort_values(ascending=False, kind="stable")


# --------------------------------------------------------------------------- roofline


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
        _require_columns(_check_frame(X), needed, what="roofline")

    @staticmethod
    def _roofline_ms(A: np.ndarray) -> np.ndarray:
        flops, weight_bytes, activation_bytes, peak_gflops, bw_gbs = A.T
        compute_s = flops / (peak_gflops * 1e9)
        memory_s = (weight_bytes + activation_bytes) / (bw_gbs * 1e9)
        return np.maximum(compute_s, memory_s) * 1e3

    def _roofline_inputs(self, X: pd.DataFrame) -> np.ndarray:
        A = _numeric_matrix(X, self.required_columns)
        A[:, 3:][A[:, 3:] <= 0] = np.nan
        return A

    def _groups(self, X: pd.DataFrame) -> np.ndarray:
        if not self.group_col:
            return np.full(len(X), "", dtype=object)
        return X[self.group_col].astype(str).to_numpy(dtype=object)

    def _summarise(self, ratios: np.ndarray) -> float:
        if self.log_target:
            return float(np.exp(np.median(np.log(ratios))))
        return float(np.median(ratios))

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> RooflineRegressor:
        self._check_columns(X)
        A = self._roofline_inputs(X)
        self.feature_names_ = list(self.required_columns)
        self.n_features_in_ = len(self.required_columns)
        self.medians_ = _column_medians(A)
        target = np.asarray(y, dtype=np.float64).ravel()
        if target.shape[0] != len(X):
            raise InputError(f"y has {target.shape[0]} values but X has {len(X)} rows")
        ratios = target / self._roofline_ms(_impute(A, self.medians_))
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
        return self._roofline_ms(_impute(self._roofline_inputs(X), self.medians_))

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        t_roof = self.roofline_ms(X)
        factor = np.array([self.factors_.get(g, self.global_factor_) for g in self._groups(X)], dtype=float)
        return t_roof * factor


# --------------------------------------------------------------------------- linear family


class _LogFeatureRegressor(Regressor):
    """Features through sign-safe ``log1p`` and standardisation (mean/scale stored as JSON)."""

    def _fit_log_features(self, X: pd.DataFrame) -> np.ndarray:
        L = _signed_log1p(self._fit_matrix(_check_frame(X), self._feature_columns(X)))
        self.feature_mean_, self.feature_scale_ = mean_and_scale(L)
        return (L - self.feature_mean_) / self.feature_scale_

    def _log_features(self, X: pd.DataFrame) -> np.ndarray:
        return (_signed_log1p(self._matrix(X)) - self.feature_mean_) / self.feature_scale_


@register_regressor
class LinearRegressor(_LogFeatureRegressor):
    """Ridge regression on standardised log features (a power law when ``log_target``)."""

    kind = "linear"

    def __init__(
        self, alpha: float = 1.0, log_target: bool = True, features: Sequence[str] | None = None
    ) -> None:
        self.alpha = alpha
        self.log_target = log_target
        self.features = features

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> LinearRegressor:
        from sklearn.linear_model import Ridge

        Z = self._fit_log_features(X)
        model = Ridge(alpha=self.alpha).fit(Z, self._encode_target(y, len(X)))
        self.coef_ = np.asarray(model.coef_, dtype=np.float64)
        self.intercept_ = float(model.intercept_)
        return self

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return self._decode_target(self._log_features(X) @ self.coef_ + self.intercept_)

    def _importances(self) -> pd.Series:
        return _sorted_importances(self.feature_names_, np.abs(self.coef_))


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
class PolyLassoRegressor(_LogFeatureRegressor):
    """NeuralPower-like sparse polynomial: degree-``degree`` monomials of log features, Lasso.

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
        from sklearn.linear_model import Lasso, LassoCV

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
        return _sorted_importances(self.term_names_, np.abs(self.coef_))


# --------------------------------------------------------------------------- Gianniti end-to-end


def _affine_fit(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Weighted least squares ``y ≈ a + b·x``; ``b = 0`` when ``x`` does not vary."""
    total = w.sum()
    x_mean = float((w * x).sum() / total)
    y_mean = float((w * y).sum() / total)
    sxx = float((w * (x - x_mean) ** 2).sum())
    if not sxx > 0:
        return y_mean, 0.0
    b = float((w * (x - x_mean) * (y - y_mean)).sum() / sxx)
    return y_mean - b * x_mean, b


@register_regressor
class GiannitiE2ERegressor(Regressor):
    """Gianniti et al. end-to-end model: time affine in batch size, one line per model.

    For every (``model_col``, context) group of the training rows, where the context is made of
    the ``context_cols`` present in ``X`` (by default ``mode`` and ``device``), least squares
    gives ``y = a + b·batch``. This extrapolates to batch sizes beyond the training range.

    Fallbacks, in original units:

    - a group with a single distinct training batch keeps the shape of its context's global line
      and is rescaled to go through its own mean: ``y = s·(A + B·covariate)``;
    - a model not seen in training uses its context's global line ``y = A + B·covariate``
      (all training rows of that context), or the line fitted on all rows for an unseen context.

    ``covariate`` is a numeric column that grows with the work per step (default ``flops``); when it
    is absent at fit time the batch size is used. Affine models live in original units, so
    ``log_target`` defaults to False; ``log_target=True`` keeps them affine but weights the least
    squares by ``1/y²`` (minimising relative rather than absolute error).
    """

    kind = "gianniti_e2e"

    def __init__(
        self,
        batch_col: str = "batch",
        model_col: str = "model_id",
        context_cols: Sequence[str] = ("mode", "device"),
        covariate: str | None = "flops",
        log_target: bool = False,
    ) -> None:
        self.batch_col = batch_col
        self.model_col = model_col
        self.context_cols = context_cols
        self.covariate = covariate
        self.log_target = log_target

    @staticmethod
    def _keys(X: pd.DataFrame, columns: Sequence[str]) -> list[str]:
        """One string key per row: the values of ``columns`` joined by a unit separator."""
        if not columns:
            return [""] * len(X)
        parts = X[list(columns)].astype(str)
        return parts.agg("\x1f".join, axis=1).tolist()

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> GiannitiE2ERegressor:
        X = _check_frame(X)
        _require_columns(X, [self.batch_col, self.model_col], what="gianniti_e2e")
        self.context_cols_ = [c for c in self.context_cols if c in X.columns]
        use_covariate = self.covariate and self.covariate in X.columns and self.covariate != self.batch_col
        self.covariate_ = self.covariate if use_covariate else self.batch_col
        columns = [self.batch_col] + ([self.covariate_] if use_covariate else [])
        A = self._fit_matrix(X, columns)
        target = np.asarray(y, dtype=np.float64).ravel()
        if target.shape[0] != len(X) or not np.isfinite(target).all():
            raise InputError("gianniti_e2e: y must be finite and have one value per row of X")
        if self.log_target and (target <= 0).any():
            raise InputError("gianniti_e2e: log_target needs positive targets")
        weights = 1.0 / target**2 if self.log_target else np.ones_like(target)
        batch, cov = A[:, 0], A[:, columns.index(self.covariate_)]
        contexts = np.array(self._keys(X, self.context_cols_), dtype=object)
        groups = np.array(self._keys(X, [self.model_col, *self.context_cols_]), dtype=object)
        self.overall_ = list(_affine_fit(cov, target, weights))
        self.context_fits_ = {
            c: list(_affine_fit(cov[contexts == c], target[contexts == c], weights[contexts == c]))
            for c in sorted(set(contexts))
        }
        self.group_fits_ = {}
        for g in sorted(set(groups)):
            rows = groups == g
            self.group_fits_[g] = self._fit_group(
                batch[rows], cov[rows], target[rows], weights[rows], self.context_fits_[contexts[rows][0]]
            )
        return self

    @staticmethod
    def _fit_group(
        batch: np.ndarray, cov: np.ndarray, y: np.ndarray, w: np.ndarray, context_line: list[float]
    ) -> dict[str, Any]:
        if np.unique(batch).size >= 2:
            a, b = _affine_fit(batch, y, w)
            return {"a": a, "b": b, "scale": None, "n": int(y.size)}
        reference = float(np.mean(context_line[0] + context_line[1] * cov))
        if reference > 0:
            return {"a": None, "b": None, "scale": float(np.mean(y)) / reference, "n": int(y.size)}
        return {"a": float(np.mean(y)), "b": 0.0, "scale": None, "n": int(y.size)}

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        A = self._matrix(X)
        _require_columns(X, [self.model_col, *self.context_cols_], what="gianniti_e2e")
        batch, cov = A[:, 0], A[:, self.feature_names_.index(self.covariate_)]
        contexts = self._keys(X, self.context_cols_)
        groups = self._keys(X, [self.model_col, *self.context_cols_])
        out = np.empty(len(X), dtype=np.float64)
        for i, (g, c) in enumerate(zip(groups, contexts, strict=True)):
            line = self.context_fits_.get(c, self.overall_)
            fit = self.group_fits_.get(g)
            if fit is not None and fit["scale"] is None:
                out[i] = fit["a"] + fit["b"] * batch[i]
            else:
                scale = fit["scale"] if fit is not None else 1.0
                out[i] = scale * (line[0] + line[1] * cov[i])
        return out

    def coefficients(self) -> pd.DataFrame:
        """Per-group ``a``, ``b`` (NaN for rescaled single-batch groups) and row count."""
        check_is_fitted(self, "group_fits_")
        names = [self.model_col, *self.context_cols_]
        rows = []
        for key, fit in self.group_fits_.items():
            rows.append(
                {
                    **dict(zip(names, key.split("\x1f"), strict=True)),
                    "a": np.nan if fit["a"] is None else fit["a"],
                    "b": np.nan if fit["b"] is None else fit["b"],
                    "n": fit["n"],
                }
            )
        return pd.DataFrame(rows, columns=[*names, "a", "b", "n"])


# --------------------------------------------------------------------------- tree ensembles


def _pack_trees(trees: Sequence[Any]) -> dict[str, np.ndarray]:
    """Node arrays of fitted scikit-learn trees, concatenated; child indices point into the whole.

    ``left``/``right`` are -1 at leaves; ``roots[t]`` is the first node of tree ``t``.
    """
    sizes = [tree.tree_.node_count for tree in trees]
    roots = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    left, right, feature, threshold, value = [], [], [], [], []
    for root, tree in zip(roots, trees, strict=True):
        t = tree.tree_
        leaf = t.children_left < 0
        left.append(np.where(leaf, -1, t.children_left + root))
        right.append(np.where(leaf, -1, t.children_right + root))
        feature.append(np.where(leaf, 0, t.feature))
        threshold.append(t.threshold)
        value.append(t.value.reshape(t.node_count))
    return {
        "roots": roots,
        "left": np.concatenate(left).astype(np.int64),
        "right": np.concatenate(right).astype(np.int64),
        "feature": np.concatenate(feature).astype(np.int64),
        "threshold": np.concatenate(threshold).astype(np.float64),
        "value": np.concatenate(value).astype(np.float64),
    }


def _tree_outputs(trees: Mapping[str, np.ndarray], A: np.ndarray) -> np.ndarray:
    """Leaf value of every packed tree for every row of ``A``, shape ``(n_trees, n_rows)``.

    Compares as scikit-learn does: features rounded to float32, thresholds in float64.
    """
    X = np.asarray(A, dtype=np.float32).astype(np.float64)
    left, right, feature, threshold = trees["left"], trees["right"], trees["feature"], trees["threshold"]
    node = np.repeat(trees["roots"][:, None], X.shape[0], axis=1)
    rows = np.broadcast_to(np.arange(X.shape[0]), node.shape)
    inner = left[node] >= 0
    while inner.any():
        go_left = X[rows, feature[node]] <= threshold[node]
        node = np.where(inner, np.where(go_left, left[node], right[node]), node)
        inner = left[node] >= 0
    return trees["value"][node]


class _ForestRegressor(Regressor):
    """Tree ensemble on the numeric features (trees need no scaling), stored as node arrays."""

    _required_state = ("feature_names_", "trees_", "feature_importances_")

    def __init__(
        self,
        n_estimators: int = 200,
        max_features: float | str | None = 1.0,
        min_samples_leaf: int = 1,
        random_state: int = 0,
        n_jobs: int = 1,
        log_target: bool = True,
        features: Sequence[str] | None = None,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_features = max_features
        self.min_samples_leaf = min_samples_leaf
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.log_target = log_target
        self.features = features

    def _make_estimator(self) -> Any:
        raise NotImplementedError

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> _ForestRegressor:
        A = self._fit_matrix(_check_frame(X), self._feature_columns(X))
        forest = self._make_estimator().fit(A, self._encode_target(y, len(X)))
        self.trees_ = _pack_trees(forest.estimators_)
        self.feature_importances_ = np.asarray(forest.feature_importances_, dtype=np.float64)
        return self

    def _member_outputs(self, X: pd.DataFrame) -> np.ndarray:
        return _tree_outputs(self.trees_, self._matrix(X))

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Ensemble mean in target space (geometric mean of members with ``log_target``)."""
        return self._decode_target(self._member_outputs(X).mean(axis=0))

    def predict_members(self, X: pd.DataFrame) -> np.ndarray:
        """Per-tree predictions in original units, shape ``(n_members, n_rows)``."""
        return self._decode_target(self._member_outputs(X))

    def _importances(self) -> pd.Series:
        return _sorted_importances(self.feature_names_, self.feature_importances_)


@register_regressor
class RandomForestRegressor(_ForestRegressor):
    """scikit-learn random forest (bootstrap samples, best splits)."""

    kind = "random_forest"

    def _make_estimator(self) -> Any:
        from sklearn.ensemble import RandomForestRegressor as SkRandomForest

        return SkRandomForest(
            n_estimators=self.n_estimators,
            max_features=self.max_features,
            min_samples_leaf=self.min_samples_leaf,
            random_state=self.random_state,
            n_jobs=self.n_jobs,
        )


@register_regressor
class ExtraTreesRegressor(_ForestRegressor):
    """scikit-learn extremely randomised trees (Sponner et al.'s choice)."""

    kind = "extra_trees"

    def _make_estimator(self) -> Any:
        from sklearn.ensemble import ExtraTreesRegressor as SkExtraTrees

        return SkExtraTrees(
            n_estimators=self.n_estimators,
            max_features=self.max_features,
            min_samples_leaf=self.min_samples_leaf,
            random_state=self.random_state,
            n_jobs=self.n_jobs,
        )


# --------------------------------------------------------------------------- multilayer perceptron

@register_regressor
class MLPRegressor(_LogFeatureRegressor):
    """scikit-learn multilayer perceptron on standardised log features and standardised target.

    Adam without early stopping, seeded by ``random_state``: deterministic for a given input. The
    fitted weights are kept as arrays and evaluated with numpy (scikit-learn's forward pass).
    """

    kind = "mlp"
    _required_state = ("feature_names_", "weights_", "biases_")

    def __init__(
        self,
        hidden_layer_sizes: Sequence[int] = (64, 64),
        alpha: float = 1e-4,
        learning_rate_init: float = 1e-3,
        max_iter: int = 500,
        random_state: int = 0,
        log_target: bool = True,
        features: Sequence[str] | None = None,
    ) -> None:
        self.hidden_layer_sizes = hidden_layer_sizes
        self.alpha = alpha
        self.learning_rate_init = learning_rate_init
        self.max_iter = max_iter
        self.random_state = random_state
        self.log_target = log_target
        self.features = features

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> MLPRegressor:
        from sklearn.neural_network import MLPRegressor as SkMLP

        Z = self._fit_log_features(X)
        target = self._encode_target(y, len(X))
        self.target_mean_ = float(target.mean())
        self.target_scale_ = float(target.std()) or 1.0
        model = SkMLP(
            hidden_layer_sizes=tuple(int(h) for h in self.hidden_layer_sizes),
            alpha=self.alpha,
            learning_rate_init=self.learning_rate_init,
            max_iter=self.max_iter,
            activation="relu",
            early_stopping=False,
            random_state=self.random_state,
        ).fit(Z, (target - self.target_mean_) / self.target_scale_)
        self.weights_ = [np.asarray(w, dtype=np.float64) for w in model.coefs_]
        self.biases_ = [np.asarray(b, dtype=np.float64) for b in model.intercepts_]
        self.n_iter_ = int(model.n_iter_)
        return self

    def _forward(self, Z: np.ndarray) -> np.ndarray:
        """The network's output for standardised inputs ``Z``: scikit-learn's forward pass (ReLU hidden
        layers, identity output)."""
        out = Z
        for i, (w, b) in enumerate(zip(self.weights_, self.biases_, strict=True)):
            out = out @ w + b
            if i < len(self.weights_) - 1:
                out = np.maximum(out, 0.0)
        return out.ravel()

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        z = self._forward(self._log_features(X))
        return self._decode_target(z * self.target_scale_ + self.target_mean_)


# --------------------------------------------------------------------------- XGBoost


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
    """Mean validation MAPE of every grid point; returns the best point and all results.

    Uses only the rows given (pass the training split); ties keep the earlier grid point.
    """
    from sklearn.model_selection import ParameterGrid
    from tqdm.auto import tqdm

    splits = _cv_splits(len(X), groups, cv, seed)
    results: list[dict[str, Any]] = []
    for point in tqdm(list(ParameterGrid(dict(grid))), desc="grid search", mininterval=5.0):
        scores = []
        for train, valid in splits:
            reg = make(point).fit(X.iloc[train], y[train])
            scores.append(_mape(y[valid], reg.predict(X.iloc[valid])))
        mape = float(np.mean(scores))
        results.append({"params": point, "mape": mape if math.isfinite(mape) else math.inf})
    best = min(results, key=lambda r: r["mape"])
    return dict(best["params"]), results


@register_regressor
class XGBoostRegressor(Regressor):
    """Gradient-boosted trees (XGBoost ``hist``), deterministic for fixed ``random_state``/``nthread``.

    Defaults fit quickly without search. ``search=True`` (or :meth:`grid_search`) first picks
    ``n_estimators``, ``learning_rate``, ``max_depth`` and ``subsample`` from :attr:`param_grid` by
    ``search_cv``-fold cross-validation on the training rows only (grouped by the
    ``search_groups`` column when given), then refits on all of them; the choice is in
    ``best_params_`` and the per-point validation MAPE in ``cv_results_``.
    """

    kind = "xgboost"
    _required_state = ("feature_names_",)
    _payload_attrs = ("booster_",)
    _payload_modules = ("xgboost",)
    #: hyper-parameter grid of the tabular XGBoost predictor (seed 003, §6.5.3)
    param_grid: ClassVar[dict[str, list[Any]]] = {
        "n_estimators": [100, 500, 1000, 2000],
        "learning_rate": [1e-1, 1e-2, 1e-3],
        "max_depth": [3, 5, 8, 10, 30],
        "subsample": [0.5, 0.75, 1.0],
    }

    def __init__(
        self,
        n_estimators: int = 500,
        learning_rate: float = 0.1,
        max_depth: int = 6,
        subsample: float = 1.0,
        colsample_bytree: float = 1.0,
        min_child_weight: float = 1.0,
        reg_lambda: float = 1.0,
        random_state: int = 0,
        nthread: int = 1,
        search: bool = False,
        search_cv: int = 5,
        search_groups: str | None = None,
        log_target: bool = True,
        features: Sequence[str] | None = None,
    ) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.reg_lambda = reg_lambda
        self.random_state = random_state
        self.nthread = nthread
        self.search = search
        self.search_cv = search_cv
        self.search_groups = search_groups
        self.log_target = log_target
        self.features = features

    def _fit_booster(self, X: pd.DataFrame, y: pd.Series | np.ndarray, params: Mapping[str, Any]) -> None:
        import xgboost

        A = self._fit_matrix(_check_frame(X), self._feature_columns(X))
        model = xgboost.XGBRegressor(
            n_estimators=int(params["n_estimators"]),
            learning_rate=float(params["learning_rate"]),
            max_depth=int(params["max_depth"]),
            subsample=float(params["subsample"]),
            colsample_bytree=float(self.colsample_bytree),
            min_child_weight=float(self.min_child_weight),
            reg_lambda=float(self.reg_lambda),
            tree_method="hist",
            random_state=int(self.random_state),
            n_jobs=int(self.nthread),
        )
        model.fit(A, self._encode_target(y, len(X)))
        self.booster_ = model.get_booster()

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> XGBoostRegressor:
        params = self.get_params(deep=False)
        if self.search:
            X = _check_frame(X)
            groups = None
            if self.search_groups is not None:
                _require_columns(X, [self.search_groups], what="search group")
                groups = X[self.search_groups].astype(str).to_numpy()
            best, results = self._search(X, y, groups, self.search_cv, self.random_state)
            self.best_params_, self.cv_results_ = best, results
            params.update(self.best_params_)
        self._fit_booster(X, y, params)
        return self

    def _search(
        self,
        X: pd.DataFrame,
        y: pd.Series | np.ndarray,
        groups: np.ndarray | None,
        cv: int,
        seed: int,
        grid: Mapping[str, Sequence[Any]] | None = None,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        base = {**self.get_params(deep=False), "search": False, "random_state": seed}

        def make(point: dict[str, Any]) -> Regressor:
            return type(self)(**{**base, **point})

        target = np.asarray(y, dtype=np.float64).ravel()
        return cross_validated_grid(make, X, target, grid or self.param_grid, groups, cv, seed)

    @classmethod
    def grid_search(
        cls,
        X: pd.DataFrame,
        y: pd.Series | np.ndarray,
        groups: np.ndarray | pd.Series | str | None = None,
        cv: int = 5,
        seed: int = 0,
        param_grid: Mapping[str, Sequence[Any]] | None = None,
        **params: Any,
    ) -> XGBoostRegressor:
        """Search ``param_grid`` (default :attr:`param_grid`) by K-fold CV on ``X, y`` and refit.

        ``groups`` (array or column name of ``X``) switches to grouped folds. Returns a regressor
        whose parameters are the best grid point, with ``best_params_`` and ``cv_results_`` set.
        """
        X = _check_frame(X)
        if isinstance(groups, str):
            _require_columns(X, [groups], what="group")
            groups = X[groups]
        group_array = None if groups is None else np.asarray(groups).astype(str)
        searcher = cls(**{**params, "random_state": seed})
        best, results = searcher._search(X, y, group_array, cv, seed, param_grid)
        reg = cls(**{**params, **best, "random_state": seed})
        reg.fit(X, y)
        reg.best_params_, reg.cv_results_ = best, results
        return reg

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        A = self._matrix(X)
        self.booster_.set_param({"nthread": int(self.nthread)})
        return self._decode_target(np.asarray(self.booster_.inplace_predict(A), dtype=np.float64))

    def _dump_payload(self) -> dict[str, str]:
        text = bytes(self.booster_.save_raw(raw_format="json")).decode("utf-8")
        return {"encoding": "xgboost-json", "data": text}

    def _load_payload(self, payload: dict[str, str] | None, source: str) -> None:
        import xgboost

        if not payload or payload.get("encoding") != "xgboost-json":
            raise InputError(f"{source}: missing or unknown XGBoost payload")
        booster = xgboost.Booster()
        try:
            booster.load_model(bytearray(payload["data"].encode("utf-8")))
        except xgboost.core.XGBoostError as exc:
            raise InputError(f"{source}: corrupted XGBoost model ({exc})") from None
        self.booster_ = booster

    def _importances(self) -> pd.Series:
        gain = self.booster_.get_score(importance_type="total_gain")
        values = np.array([gain.get(f"f{i}", 0.0) for i in range(len(self.feature_names_))])
        total = values.sum()
        return _sorted_importances(self.feature_names_, values / total if total > 0 else values)


# The per-layer model of Gianniti et al. lives in its own module and registers itself here.
from perfzoo import gianniti as _gianniti  # noqa: E402,F401
from perfzoo import transfer as _transfer  # noqa: E402,F401
