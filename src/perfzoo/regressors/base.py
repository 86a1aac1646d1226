"""The regressor base class: input validation, target transform, JSON persistence and the registry.

Every regressor of :mod:`perfzoo.regressors` derives from :class:`Regressor`, which follows
scikit-learn's estimator contract (the constructor only stores parameters, ``fit`` returns ``self``,
``predict`` takes a DataFrame, fitted attributes end in ``_``) and gives all of them the same input
handling:

- ``X`` is a DataFrame that may hold non-numeric columns (``device``, ``family``, ``model_id``).
  Learned models use its numeric columns (or the ``features`` parameter), remembered at fit time in
  ``feature_names_``; a feature column missing at predict time raises :class:`InputError`.
- NaN and ±inf feature values are replaced by the training median of their column (0 when the
  column was entirely missing in training).
- Targets are positive quantities (ms, MB, W, J). With ``log_target=True`` a regressor fits
  ``log(y)`` and returns ``exp(prediction)`` in the original units.

A fitted regressor is saved as one JSON file without pickle: coefficients, MLP weights and the node
arrays of every tree as JSON numbers or (large arrays) compressed little-endian bytes, XGBoost
boosters as their native JSON model text. The file names the regressor by its registered ``kind``
(never by a module path), so files keep loading when code moves. Learned models other than XGBoost
predict with numpy from those arrays alone, so a loaded regressor needs neither scikit-learn's
estimator objects nor unpickling; arrays round-trip exactly, so predictions after loading are
bit-identical to those before saving.

:data:`REGISTRY` maps each ``kind`` to its class; the estimator modules register their classes with
:func:`register_regressor` when :mod:`perfzoo.regressors` is imported.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from perfzoo.features.op_kinds import OP_FEATURES
from perfzoo.io import InputError, atomic_path, read_json, suggest
from perfzoo.provenance import package_versions
from perfzoo.stats import mean_and_scale

FILE_FORMAT = "perfzoo.regressor"
FILE_FORMAT_VERSION = 1
#: packages whose versions every saved regressor records (plus the class's ``_payload_modules``)
SAVED_VERSIONS = ("perfzoo", "numpy", "scikit-learn")


# --------------------------------------------------------------------------- input helpers


def check_frame(X: Any) -> pd.DataFrame:
    if not isinstance(X, pd.DataFrame):
        raise InputError(f"X must be a pandas DataFrame, got {type(X).__name__}")
    return X


def require_columns(X: pd.DataFrame, columns: Iterable[str], what: str = "feature") -> None:
    missing = [c for c in columns if c not in X.columns]
    if missing:
        raise InputError(f"missing {what} column(s): {', '.join(missing)}")


def group_labels(X: pd.DataFrame, group_col: str | None, what: str, pooled: str = "") -> np.ndarray:
    """Per row of ``X``, the group (device) whose coefficients apply: the ``group_col`` value as text, or
    ``pooled`` for every row of a regressor fitted without groups. A missing ``group_col`` is named."""
    if not group_col:
        return np.full(len(X), pooled, dtype=object)
    require_columns(X, [group_col], what=what)
    return X[group_col].astype(str).to_numpy(dtype=object)


def without_operator_features(X: pd.DataFrame) -> pd.DataFrame:
    """The end-to-end features of ``X``: its operator aggregates ``op_<kind>_*`` dropped, as a regressor that does
    not use them (:attr:`Regressor.uses_operator_features`) sees a frame."""
    return X.drop(columns=[c for c in X.columns if c in OP_FEATURES])


def numeric_columns(X: pd.DataFrame) -> list[str]:
    """Names of the numeric (including boolean) columns of ``X``, in order."""
    return [str(c) for c in X.columns if pd.api.types.is_numeric_dtype(X[c])]


def incomplete_rows(model: Regressor, X: pd.DataFrame) -> np.ndarray:
    """Rows of ``X`` without a value for a feature ``model`` uses (:meth:`Regressor.missing_features`)."""
    return np.array([bool(names) for names in model.missing_features(X)], dtype=bool)


def fit_on_complete_rows(make: Callable[[], Regressor], X: pd.DataFrame, y: pd.Series | np.ndarray,
                         fitted: FittedModels | None = None) -> tuple[Regressor, np.ndarray]:
    """(``make()`` fitted on the rows of ``X`` that have every feature it uses, the incomplete rows left out): fitted
    once on all rows to learn which features those are, again without the incomplete rows where there are any, so no
    training row has a median filled in. Raises ``InputError`` naming the missing features when no row has them all
    (a fit there would rest on filled-in values alone). Each fit goes through ``fitted`` (:class:`FittedModels`),
    which returns a model fitted before on the same rows instead of fitting again."""
    fitted = fitted if fitted is not None else FittedModels()
    model = fitted.fit(make(), X, y)
    incomplete = incomplete_rows(model, X)
    if not incomplete.any():
        return model, incomplete
    if incomplete.all():
        missing = sorted({name for names in model.missing_features(X) for name in names})
        raise InputError(f"no training row has every feature {type(model).__name__} uses ({', '.join(missing)} "
                         "missing); a fit on filled-in values is refused")
    target = np.asarray(y, dtype=float)
    return fitted.fit(make(), X[~incomplete], target[~incomplete]), incomplete


def fit_digest(model: Regressor, X: pd.DataFrame, y: pd.Series | np.ndarray) -> str:
    """What a fit of ``model`` depends on, as a SHA-256: its kind and parameters, the columns and values of ``X``
    and the values of ``y``. The regressors' fits are deterministic (fixed seeds, cyclic coordinate descent), so two
    fits with one digest give the same model."""
    digest = hashlib.sha256()
    identity = {"kind": model.kind, "params": _to_json(model.get_params(deep=False)),
                "columns": [str(c) for c in X.columns]}
    digest.update(json.dumps(identity, sort_keys=True).encode())
    digest.update(pd.util.hash_pandas_object(X, index=False).to_numpy().tobytes())
    digest.update(np.ascontiguousarray(np.asarray(y, dtype=np.float64).ravel()).tobytes())
    return digest.hexdigest()


class FittedModels:
    """Regressors fitted before, found by :func:`fit_digest`: :meth:`fit` returns the one fitted on the same inputs
    with the same parameters instead of fitting again, and gives every model it fits its digest (``fit_digest_``,
    saved with it). A blend's member that also runs as a regressor of its own is fitted once: the blend's fit job
    is given the member's saved models (the fit rule's ``reuse`` input)."""

    def __init__(self, models: Iterable[Regressor] = ()) -> None:
        self._by_digest = {m.fit_digest_: m for m in models if getattr(m, "fit_digest_", None)}
        self.reused = 0

    def fit(self, model: Regressor, X: pd.DataFrame, y: pd.Series | np.ndarray) -> Regressor:
        """``model`` fitted on ``X``, ``y``, or the model fitted before with the same digest."""
        digest = fit_digest(model, X, y)
        found = self._by_digest.get(digest)
        if found is not None:
            self.reused += 1
            return found
        model = model.fit(X, y, fitted=self) if model.fits_members else model.fit(X, y)
        model.fit_digest_ = digest
        return model


def _holds_values(column: pd.Series) -> bool:
    """Whether ``column`` holds feature values: numbers, some or all of them missing (a JSON record's ``None``), as
    :func:`numeric_matrix` reads them; not a key column of text (``model_id``), which no regressor fills in."""
    try:
        pd.to_numeric(column, errors="raise")
    except (TypeError, ValueError):
        return False
    return True


def numeric_matrix(X: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
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


def column_medians(A: np.ndarray) -> np.ndarray:
    """Per-column median ignoring NaN; 0.0 for a column without any finite value."""
    medians = np.zeros(A.shape[1], dtype=np.float64)
    for j in range(A.shape[1]):
        finite = A[:, j][~np.isnan(A[:, j])]
        if finite.size:
            medians[j] = float(np.median(finite))
    return medians


def impute(A: np.ndarray, medians: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(A), medians[None, :], A)


def signed_log1p(A: np.ndarray) -> np.ndarray:
    """``log1p`` for non-negative values, mirrored for negative ones (monotone, sign-safe)."""
    return np.sign(A) * np.log1p(np.abs(A))


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


def saved_versions(extra: Sequence[str] = ()) -> dict[str, str]:
    """The installed versions of :data:`SAVED_VERSIONS` and ``extra``, as recorded in a saved regressor
    (from :func:`perfzoo.provenance.package_versions`)."""
    names = (*SAVED_VERSIONS, *extra)
    return {name: version for name, version in package_versions().items() if name in names}


# --------------------------------------------------------------------------- base class


class Regressor(RegressorMixin, BaseEstimator):
    """Common input handling, target transform and pickle-free persistence."""

    kind: ClassVar[str] = ""
    #: fitted attributes a saved document must hold for :meth:`predict` to work
    _required_state: ClassVar[tuple[str, ...]] = ("feature_names_",)
    #: fitted attributes kept out of the JSON state (stored in the payload instead)
    _payload_attrs: ClassVar[tuple[str, ...]] = ()
    #: whether the regressor is fitted on the operator aggregates ``op_*`` (the fit rule then passes them)
    uses_operator_features: ClassVar[bool] = False
    #: whether the regressor applies the devices' measured constants (the fit rule then passes them; a frame
    #: without them gets the regressor's fallback for a device that has none)
    uses_device_calibration: ClassVar[bool] = False
    #: the only targets the method models (execution time, peak memory); None: any target
    only_targets: ClassVar[tuple[str, ...] | None] = None
    #: whether ``fit`` fits other regressors (a blend's members) and takes ``fitted`` (:class:`FittedModels`) for them
    fits_members: ClassVar[bool] = False

    def targets_modelled(self) -> tuple[str, ...] | None:
        """The targets the method models with these parameters (:attr:`only_targets`; None: any)."""
        return self.only_targets

    # -- features

    def _feature_columns(self, X: pd.DataFrame) -> list[str]:
        """``features`` if given, else every numeric column of ``X``."""
        chosen = getattr(self, "features", None)
        if chosen is not None:
            columns = [str(c) for c in chosen]
            require_columns(X, columns)
            return columns
        columns = numeric_columns(X)
        if not columns:
            raise InputError("X has no numeric feature columns")
        return columns

    def _fit_matrix(self, X: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
        """Remember the feature columns and their medians; return the imputed training matrix."""
        A = numeric_matrix(X, columns)
        self.feature_names_ = list(columns)
        self.n_features_in_ = len(columns)
        self.medians_ = column_medians(A)
        return impute(A, self.medians_)

    def missing_features(self, X: pd.DataFrame) -> list[list[str]]:
        """Per row of ``X``, the fitted feature columns of ``X`` it has no value for (NaN or ±inf): what
        :meth:`predict` would fill in with the training median, another model's value. Such rows are neither
        fitted on nor predicted (:func:`perfzoo.fitting.fit_split`, the prediction stage). A fitted column ``X``
        lacks altogether is :meth:`predict`'s error, not a row's gap."""
        names = [name for name in getattr(self, "feature_names_", []) if name in X.columns and _holds_values(X[name])]
        present = np.isfinite(numeric_matrix(X, names)) if names else np.ones((len(X), 0), dtype=bool)
        return [[name for name, ok in zip(names, row, strict=True) if not ok] for row in present]

    def _matrix(self, X: pd.DataFrame) -> np.ndarray:
        """Imputed feature matrix of ``X`` in the fitted column order."""
        check_is_fitted(self, "feature_names_")
        X = check_frame(X)
        require_columns(X, self.feature_names_)
        return impute(numeric_matrix(X, self.feature_names_), self.medians_)

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

    def _state_empty_by_definition(self) -> dict[str, Any]:
        """Fitted state that these parameters make empty whatever the data (what a fit gives), so that a
        document written before such a field existed still loads; a subclass names its own."""
        return {}

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
            "versions": saved_versions(self._payload_modules),
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
        state = {**reg._state_empty_by_definition(), **_from_json(doc["state"])}
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
        raise InputError(
            f"{source}: unknown regressor kind {kind!r}{suggest(str(kind), REGISTRY)} "
            f"(known: {', '.join(repr(k) for k in sorted(REGISTRY))})"
        )
    return cls.from_document(doc, source=source)


def feature_importances(reg: Regressor) -> pd.Series | None:
    """Importance per feature, largest first: tree importances, or |coefficient| of linear models.

    ``None`` for regressors without a per-feature importance (roofline, Gianniti, MLP).
    """
    check_is_fitted(reg, "feature_names_")
    return reg._importances()


def sorted_importances(names: Sequence[str], values: np.ndarray) -> pd.Series:
    """Importance per name as a Series, largest first (stable for ties)."""
    series = pd.Series(np.asarray(values, dtype=np.float64), index=list(names), name="importance")
    return series.sort_values(ascending=False, kind="stable")


# --------------------------------------------------------------------------- log-feature models


class LogFeatureRegressor(Regressor):
    """Features through sign-safe ``log1p`` and standardisation (mean/scale stored as JSON)."""

    def _fit_log_features(self, X: pd.DataFrame) -> np.ndarray:
        L = signed_log1p(self._fit_matrix(check_frame(X), self._feature_columns(X)))
        self.feature_mean_, self.feature_scale_ = mean_and_scale(L)
        return (L - self.feature_mean_) / self.feature_scale_

    def _log_features(self, X: pd.DataFrame) -> np.ndarray:
        return (signed_log1p(self._matrix(X)) - self.feature_mean_) / self.feature_scale_
