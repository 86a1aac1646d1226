"""A blend: the geometric mean of the predictions of several regressors, each fitted on the same rows.

``composed_blend`` (:class:`BlendRegressor`) blends ``composed`` (per-kind operator costs summed over the trace,
:mod:`perfzoo.regressors.composed`) with ``poly_lasso`` (a sparse polynomial in the log of the end-to-end
features, :mod:`perfzoo.regressors.linear`) by default. The two err in different ways: ``composed`` extrapolates
to unseen families and batches but its few physical terms miss what a model's own family shares;
``poly_lasso`` interpolates within profiled families and extrapolates badly. On the selection splits
(family_monte_carlo, stratified_kfold) of six finished default runs, their geometric mean was below both in
every run (``bench/RESULTS.md``, "composed blended with poly_lasso"); on leave-one-family-out and batch
extrapolation it is worse than ``composed`` alone, and the evaluate and predict stages choose per split.

A member that takes operator features (:attr:`Regressor.uses_operator_features`) is given them; the others are
fitted and predict without them, as they are when they run on their own (likewise the devices' measured constants,
:attr:`Regressor.uses_device_calibration`). A row where any member that counts on it predicts no positive finite
number gets NaN (never a guess from the other members alone), and so does a row that lacks a feature of any member,
counted or not (:meth:`missing_features`); :meth:`prediction_notes` passes
on each member's notes, naming the member. ``op_times_path`` (the measured per-operator times) goes to each
member that takes it, ``composed``'s per-byte priors; the fit rule does not pass it to the blend, whose ``composed``
keeps the pooled priors (``bench/RESULTS.md``, "composed's per-byte costs shrunk towards the measured ones").

``memory_blend`` (:class:`MemoryBlendRegressor`) blends ``memory_sim`` (the simulated step's peak, calibrated per
device, :mod:`perfzoo.regressors.memory`) with ``poly_lasso`` for peak memory the same way, with one rule more:
``poly_lasso`` has a say only on a row whose device and mode had training rows at batches on both sides of the
row's (``within_batches``), since a polynomial in the log features runs away outside the batches it was fitted on;
elsewhere the row is ``memory_sim``'s. On seven finished default runs the blend was below ``memory_sim`` on the
selection splits in every run (family_monte_carlo 6.21 → 5.16 % on average, stratified_kfold 6.28 → 5.15) and on
leave-one-family-out (7.68 → 6.49); on batch extrapolation, where every held-out batch lies above the training
ones, it is ``memory_sim`` (``bench/RESULTS.md``, "memory_sim blended with poly_lasso within the profiled batches").
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from sklearn.utils.validation import check_is_fitted

from perfzoo.config import BLEND_MEMBERS
from perfzoo.hardware import CALIBRATION_COLUMNS
from perfzoo.io import InputError
from perfzoo.regressors.base import (
    REGISTRY,
    FittedModels,
    Regressor,
    check_frame,
    numeric_matrix,
    register_regressor,
    regressor_from_document,
    require_columns,
    without_operator_features,
)

DEFAULT_MEMBERS = BLEND_MEMBERS["composed_blend"]
MEMORY_MEMBERS = BLEND_MEMBERS["memory_blend"]


@register_regressor
class BlendRegressor(Regressor):
    """Geometric mean of ``members``' predictions (module docstring); a member named in ``within_batches`` counts
    only on rows inside the batches its (device, mode) was fitted on (:meth:`inside_fitted_batches`)."""

    kind = "composed_blend"
    uses_operator_features: ClassVar[bool] = True
    fits_members: ClassVar[bool] = True
    _required_state: ClassVar[tuple[str, ...]] = ("feature_names_", "member_kinds_", "batch_ranges_")
    _payload_attrs = ("members_",)

    def __init__(self, members: tuple[str, ...] = DEFAULT_MEMBERS, log_target: bool = False,
                 op_times_path: str | None = None, within_batches: tuple[str, ...] = ()) -> None:
        self.members = members
        self.log_target = log_target
        self.op_times_path = op_times_path
        self.within_batches = within_batches

    def _member(self, kind: str) -> Regressor:
        """A new member of ``kind``, given ``op_times_path`` when it takes one (``composed``'s measured priors)."""
        cls = REGISTRY[kind]
        takes_times = self.op_times_path is not None and "op_times_path" in cls._get_param_names()
        return cls(op_times_path=self.op_times_path) if takes_times else cls()

    def targets_modelled(self) -> tuple[str, ...] | None:
        """The targets every member models (a blend needs each member's number)."""
        self._check_members()
        limited = [t for t in (REGISTRY[m]().targets_modelled() for m in self.members) if t is not None]
        if not limited:
            return None
        return tuple(t for t in limited[0] if all(t in other for other in limited[1:]))

    def _check_members(self) -> None:
        members = list(self.members)
        unknown = [m for m in members if m not in REGISTRY or issubclass(REGISTRY[m], BlendRegressor)]
        if len(members) < 2 or unknown or len(set(members)) < len(members):
            raise InputError(f"{self.kind}: members {members!r} must be two or more distinct registered regressors "
                             f"that are not blends{f' (not: {unknown})' if unknown else ''}")
        if self.log_target:
            raise InputError(f"{self.kind}: log_target must be false (each member has its own target transform)")
        strangers = [m for m in self.within_batches if m not in members]
        if strangers:
            raise InputError(f"{self.kind}: within_batches names {strangers!r}, which are not among the members "
                             f"{members!r}")

    @staticmethod
    def _inputs(member: type[Regressor] | Regressor, X: pd.DataFrame) -> pd.DataFrame:
        """``X`` as ``member`` sees it on its own: without the operator features unless it uses them, without the
        devices' measured constants unless it applies them."""
        X = X if member.uses_operator_features else without_operator_features(X)
        if member.uses_device_calibration:
            return X
        return X.drop(columns=[c for c in CALIBRATION_COLUMNS if c in X.columns])

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray, fitted: FittedModels | None = None) -> BlendRegressor:
        """Each member fitted on ``X`` as it sees it, through ``fitted`` (a member fitted before on the same rows with
        the same parameters, e.g. by its own fit job, is taken as it is)."""
        self._check_members()
        X = check_frame(X)
        fitted = fitted if fitted is not None else FittedModels()
        self.members_ = [fitted.fit(self._member(m), self._inputs(REGISTRY[m], X), y) for m in self.members]
        self.member_kinds_ = list(self.members)
        self.feature_names_ = list(dict.fromkeys(f for m in self.members_ for f in m.feature_names_))
        self.n_features_in_ = len(self.feature_names_)
        self.batch_ranges_ = self._batch_ranges(X) if self.within_batches else {}
        return self

    @staticmethod
    def _groups_and_batches(X: pd.DataFrame) -> tuple[list[str], np.ndarray]:
        """Per row of ``X``, its "device|mode" and its batch."""
        require_columns(X, ["device", "mode", "batch"], what="a blend with within_batches")
        groups = (X["device"].astype(str) + "|" + X["mode"].astype(str)).tolist()
        return groups, numeric_matrix(X, ["batch"])[:, 0]

    def _batch_ranges(self, X: pd.DataFrame) -> dict[str, list[float]]:
        """Per "device|mode" of the training rows, their smallest and largest batch."""
        groups, batches = self._groups_and_batches(X)
        spans = pd.Series(batches, dtype=float).groupby(groups).agg(["min", "max"])
        return {str(group): [float(low), float(high)] for group, (low, high) in spans.iterrows()}

    def inside_fitted_batches(self, X: pd.DataFrame) -> np.ndarray:
        """Per row of ``X``: whether training rows of its device and mode lie at its batch or on both sides of it
        (a device or mode without training rows is outside)."""
        check_is_fitted(self, "batch_ranges_")
        groups, batches = self._groups_and_batches(X)
        return np.array([group in self.batch_ranges_
                         and self.batch_ranges_[group][0] <= batch <= self.batch_ranges_[group][1]
                         for group, batch in zip(groups, batches, strict=True)], dtype=bool)

    def member_weights(self, X: pd.DataFrame) -> np.ndarray:
        """Rows x members: 1 where the member's prediction enters the row's geometric mean, 0 where it does not
        (a member of ``within_batches`` on a row outside its fitted batches)."""
        weights = np.ones((len(X), len(self.member_kinds_)))
        if self.within_batches:
            outside = ~self.inside_fitted_batches(X)
            for j, kind in enumerate(self.member_kinds_):
                if kind in self.within_batches:
                    weights[outside, j] = 0.0
        return weights

    def member_predictions(self, X: pd.DataFrame) -> np.ndarray:
        """Rows x members: each member's prediction of ``X``'s rows."""
        check_is_fitted(self, "members_")
        X = check_frame(X)
        return np.column_stack([np.asarray(m.predict(self._inputs(m, X)), dtype=float) for m in self.members_])

    def missing_features(self, X: pd.DataFrame) -> list[list[str]]:
        """Per row of ``X``, the features some member needs and the row lacks (every member's number is needed)."""
        check_is_fitted(self, "members_")
        per_member = [m.missing_features(self._inputs(m, X)) for m in self.members_]
        return [list(dict.fromkeys(name for names in row for name in names)) for row in zip(*per_member, strict=True)]

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        predictions = self.member_predictions(X)
        weights = self.member_weights(X)
        counted = weights > 0
        usable = ((np.isfinite(predictions) & (predictions > 0)) | ~counted).all(axis=1)
        logs = np.log(np.where(counted & usable[:, None], predictions, 1.0))
        out = np.full(len(predictions), np.nan)
        out[usable] = np.exp((weights * logs).sum(axis=1)[usable] / weights.sum(axis=1)[usable])
        return out

    def prediction_notes(self, X: pd.DataFrame) -> list[str]:
        """Each member's notes on ``X`` (e.g. ``composed``'s unseen operator kinds), prefixed by its kind."""
        notes = [f"{kind}: {note}" for kind, member in zip(self.member_kinds_, self.members_, strict=True)
                 if hasattr(member, "prediction_notes") for note in member.prediction_notes(self._inputs(member, X))]
        return list(dict.fromkeys(notes))

    # -- persistence: each member is stored as its own document

    def _dump_payload(self) -> dict[str, str]:
        documents = [m.to_document() for m in self.members_]
        return {"encoding": "perfzoo-regressors", "data": json.dumps(documents, sort_keys=True)}

    def _load_payload(self, payload: dict[str, Any] | None, source: str) -> None:
        if not payload or payload.get("encoding") != "perfzoo-regressors":
            raise InputError(f"{source}: {self.kind} regressor without its members")
        self.members_ = [regressor_from_document(doc, f"{source} (member {i})")
                         for i, doc in enumerate(json.loads(payload["data"]))]
        if [m.kind for m in self.members_] != list(self.member_kinds_):
            raise InputError(f"{source}: {self.kind} members {[m.kind for m in self.members_]} do not match "
                             f"{list(self.member_kinds_)}")


@register_regressor
class MemoryBlendRegressor(BlendRegressor):
    """``memory_sim`` and ``poly_lasso``, the latter within the fitted batches only (module docstring)."""

    kind = "memory_blend"
    uses_operator_features: ClassVar[bool] = False
    uses_device_calibration: ClassVar[bool] = True

    def __init__(self, members: tuple[str, ...] = MEMORY_MEMBERS, log_target: bool = False,
                 op_times_path: str | None = None, within_batches: tuple[str, ...] = ("poly_lasso",)) -> None:
        super().__init__(members, log_target, op_times_path, within_batches)
