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
fitted and predict without them, as they are when they run on their own. A row where any member predicts no
positive finite number gets NaN (never a guess from the other members alone); :meth:`prediction_notes` passes
on each member's notes, naming the member. ``op_times_path`` (the measured per-operator times) goes to each
member that takes it, ``composed``'s per-byte priors; the fit rule does not pass it to the blend, whose ``composed``
keeps the pooled priors (``bench/RESULTS.md``, "composed's per-byte costs shrunk towards the measured ones").
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from sklearn.utils.validation import check_is_fitted

from perfzoo.io import InputError
from perfzoo.regressors.base import (
    REGISTRY,
    Regressor,
    check_frame,
    register_regressor,
    regressor_from_document,
    without_operator_features,
)

DEFAULT_MEMBERS = ("composed", "poly_lasso")


@register_regressor
class BlendRegressor(Regressor):
    """Geometric mean of ``members``' predictions (module docstring)."""

    kind = "composed_blend"
    uses_operator_features: ClassVar[bool] = True
    _required_state: ClassVar[tuple[str, ...]] = ("feature_names_", "member_kinds_")
    _payload_attrs = ("members_",)

    def __init__(self, members: tuple[str, ...] = DEFAULT_MEMBERS, log_target: bool = False,
                 op_times_path: str | None = None) -> None:
        self.members = members
        self.log_target = log_target
        self.op_times_path = op_times_path

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
        unknown = [m for m in members if m not in REGISTRY or m == self.kind]
        if len(members) < 2 or unknown or len(set(members)) < len(members):
            raise InputError(f"{self.kind}: members {members!r} must be two or more distinct other registered "
                             f"regressors{f' (not: {unknown})' if unknown else ''}")
        if self.log_target:
            raise InputError(f"{self.kind}: log_target must be false (each member has its own target transform)")

    @staticmethod
    def _inputs(member: type[Regressor] | Regressor, X: pd.DataFrame) -> pd.DataFrame:
        """``X`` as ``member`` sees it on its own: without the operator features unless it uses them."""
        return X if member.uses_operator_features else without_operator_features(X)

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> BlendRegressor:
        self._check_members()
        X = check_frame(X)
        self.members_ = [self._member(m).fit(self._inputs(REGISTRY[m], X), y) for m in self.members]
        self.member_kinds_ = list(self.members)
        self.feature_names_ = list(dict.fromkeys(f for m in self.members_ for f in m.feature_names_))
        self.n_features_in_ = len(self.feature_names_)
        return self

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
        usable = (np.isfinite(predictions) & (predictions > 0)).all(axis=1)
        out = np.full(len(predictions), np.nan)
        out[usable] = np.exp(np.log(predictions[usable]).mean(axis=1))
        return out

    def prediction_notes(self, X: pd.DataFrame) -> list[str]:
        """Each member's notes on ``X`` (e.g. ``composed``'s unseen operator kinds), prefixed by its kind."""
        notes = [f"{kind}: {note}" for kind, member in zip(self.member_kinds_, self.members_, strict=True)
                 if hasattr(member, "prediction_notes") for note in member.prediction_notes(self._inputs(member, X))]
        return list(dict.fromkeys(notes))

    # -- persistence: each member is stored as its own document

    def _dump_payload(self) -> dict[str, str]:
        return {"encoding": "perfzoo-regressors", "data": json.dumps([m.to_document() for m in self.members_])}

    def _load_payload(self, payload: dict[str, Any] | None, source: str) -> None:
        if not payload or payload.get("encoding") != "perfzoo-regressors":
            raise InputError(f"{source}: {self.kind} regressor without its members")
        self.members_ = [regressor_from_document(doc, f"{source} (member {i})")
                         for i, doc in enumerate(json.loads(payload["data"]))]
        if [m.kind for m in self.members_] != list(self.member_kinds_):
            raise InputError(f"{source}: {self.kind} members {[m.kind for m in self.members_]} do not match "
                             f"{list(self.member_kinds_)}")
