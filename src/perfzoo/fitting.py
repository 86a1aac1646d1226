"""Fit stage: train one regressor per fold of a split on one target, predict the held-out rows."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.dataset.build import feature_columns, finite_target_rows
from perfzoo.features.op_kinds import OP_ERROR_COLUMN, OP_FEATURES
from perfzoo.hardware import CALIBRATION_COLUMNS
from perfzoo.io import InputError, write_text
from perfzoo.regressors import REGISTRY, Regressor, make_regressor, regressor_from_document
from perfzoo.regressors.base import FittedModels, fit_on_complete_rows, incomplete_rows
from perfzoo.stats import all_metrics

MIN_TRAIN_ROWS = 3
# Config names that are a registered regressor with preset parameters.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "xgboost_grid": ("xgboost", {"search": True, "search_cv": 3}),
}
FEATURE_SETS = ("all", "model")
# Regressors that also see the operator aggregates (op_<kind>_*). The others keep the end-to-end features: with
# the aggregates, poly_lasso fitted about 4x slower, and bench/RESULTS.md ("Composed operator-level predictor")
# has the accuracy of linear, extra_trees and xgboost with and without them.
OPERATOR_FEATURE_REGRESSORS = frozenset(kind for kind, cls in REGISTRY.items() if cls.uses_operator_features)
WHAT_IT_MODELS = {"latency_ms": "execution time", "peak_mem_mb": "peak memory"}


def unsupported_reason(regressor: str, target: str, params: dict[str, Any] | None = None) -> str | None:
    """Why ``regressor`` (a config name, with the config's ``params``) does not apply to ``target`` (None when it
    does). Some methods model one quantity only (:meth:`Regressor.targets_modelled`): execution time (roofline
    bound, sum of per-layer times, sum over the operator trace, a blend with one of those) or peak memory (the
    simulated live tensor bytes of the step)."""
    targets = build_regressor(regressor, params).targets_modelled()
    if targets is not None and target not in targets:
        what = " and ".join(WHAT_IT_MODELS[t] for t in targets) or "no target (its members model different ones)"
        return f"{regressor} models {what}; it does not predict {target}"
    return None
ID_COLUMNS = ["row_id", "model_id", "device", "mode", "batch", "family", "label"]
PREDICTION_COLUMNS = ["split", "fold", "set", *ID_COLUMNS, "target", "regressor", "y_true", "y_pred",
                      "y_lo", "y_hi"]


def featurised_rows(data: pd.DataFrame) -> pd.Series:
    """Rows whose model could be featurised: an imported row with a ``feature_missing_reason`` has no model
    features and is left out of fitting (never given another model's features); profiled rows always count."""
    if "feature_missing_reason" not in data.columns:
        return pd.Series(True, index=data.index)
    return data["feature_missing_reason"].fillna("").astype(str) == ""


def regressor_inputs(data: pd.DataFrame, feature_set: str = "all", operator_features: bool = False,
                     device_calibration: bool = False) -> pd.DataFrame:
    """What a regressor sees: the numeric feature columns plus identifying columns it may group by.

    ``feature_set="model"`` keeps model features only (no hardware or roofline columns), for the
    feature ablation of Panner Selvam, "Performance Prediction Models for Deep Learning" (Table 6.6).
    ``operator_features`` adds the operator aggregates ``op_<kind>_*`` present in ``data``;
    ``device_calibration`` the devices' measured constants (:data:`perfzoo.hardware.CALIBRATION_COLUMNS`).
    """
    columns = feature_columns(data)
    if operator_features:
        columns += [c for c in OP_FEATURES if c in data.columns]
    if device_calibration:
        columns += [c for c in CALIBRATION_COLUMNS if c in data.columns]
    if feature_set == "model":
        columns = [c for c in columns if not c.startswith(("hw_", "roofline_"))]
    # GPU model of a device (device_transfer's group_col); why a config has no operator trace (composed)
    groups = [c for c in ("gpu", OP_ERROR_COLUMN) if c in data.columns]
    return data[[*columns, "device", "model_id", "mode", *groups]]


def _kind_and_preset(name: str) -> tuple[str, dict[str, Any]]:
    """The registry name and preset parameters a config name stands for (a registry name: no preset)."""
    return PRESETS.get(name, (name, {}))


def applies_device_calibration(name: str) -> bool:
    """Whether the regressor a config name stands for applies the devices' measured constants
    (:attr:`Regressor.uses_device_calibration`); False for an unknown name (building it says why)."""
    cls = REGISTRY.get(_kind_and_preset(name)[0])
    return bool(cls is not None and cls.uses_device_calibration)


def build_regressor(name: str, params: dict[str, Any] | None = None) -> Regressor:
    """A fresh regressor for a config name (a registry name or a preset such as ``xgboost_grid``)."""
    kind, preset = _kind_and_preset(name)
    return make_regressor(kind, **{**preset, **(params or {})})


def fit_split(
    data: pd.DataFrame, split: pd.DataFrame, target: str, regressor: str, params: dict[str, Any] | None = None,
    feature_set: str = "all", operator_features: bool = False, reusable: Iterable[Regressor] = (),
) -> tuple[pd.DataFrame, dict[str, Regressor], dict[str, Any]]:
    """(predictions on val/test rows of every fold, fitted model per fold, notes on skipped folds); the
    operator aggregates are features when ``operator_features`` or for :data:`OPERATOR_FEATURE_REGRESSORS`, the
    devices' measured constants for a regressor that applies them (:attr:`Regressor.uses_device_calibration`).
    A model of ``reusable`` fitted on the same rows with the same parameters as a fit asked here (a blend's member
    saved by the member's own fit job) is taken instead of fitting again; the notes count them."""
    if target not in data.columns:
        raise InputError(f"dataset has no target column {target!r}")
    finite = finite_target_rows(data, target)
    featurised = featurised_rows(data)
    usable = finite & featurised
    notes: dict[str, Any] = {"excluded_nonfinite_labels": int((~finite).sum()), "usable_rows": int(usable.sum()),
                             "excluded_unfeaturised_rows": int((finite & ~featurised).sum()),
                             "unfeaturised_models": sorted(set(data.loc[finite & ~featurised, "label"].astype(str))),
                             "skipped_folds": {}}
    data = data[usable].set_index("row_id", drop=False)
    ops = operator_features or regressor in OPERATOR_FEATURE_REGRESSORS
    calibration = applies_device_calibration(regressor)
    fitted = FittedModels(reusable)
    predictions, models = [], {}
    for fold, rows in split.groupby("fold", sort=True):
        rows = rows[rows["row_id"].isin(data.index)]
        train = data.loc[rows.loc[rows["set"] == "train", "row_id"]]
        held = rows[rows["set"] != "train"]
        if len(train) < MIN_TRAIN_ROWS or held.empty:
            notes["skipped_folds"][str(fold)] = f"{len(train)} training rows, {len(held)} held-out rows"
            continue
        test = data.loc[held["row_id"]]
        try:
            inputs = regressor_inputs(test, feature_set, ops, calibration)
            train_inputs = regressor_inputs(train, feature_set, ops, calibration)
            model = fit_complete_rows(regressor, params, train_inputs, train[target], notes, str(fold), fitted)
            pred = np.asarray(model.predict(inputs), float)
            lo, hi = own_intervals(model, inputs)
        except InputError as exc:  # e.g. a fold without the per-layer timings a method needs
            notes["skipped_folds"][str(fold)] = str(exc)
            continue
        incomplete = incomplete_rows(model, inputs)
        pred[incomplete], lo[incomplete], hi[incomplete] = np.nan, np.nan, np.nan  # counted as n_missing
        predictions.append(test[ID_COLUMNS].assign(
            split=split["split"].iloc[0], fold=str(fold), set=held["set"].to_numpy(), target=target,
            regressor=regressor, y_true=test[target].to_numpy(dtype=float), y_pred=np.asarray(pred, float),
            y_lo=lo, y_hi=hi))
        models[str(fold)] = model
    if fitted.reused:
        notes["reused_fits"] = fitted.reused
    frame = (pd.concat(predictions, ignore_index=True) if predictions
             else pd.DataFrame(columns=PREDICTION_COLUMNS))
    return frame[PREDICTION_COLUMNS], models, notes


def fit_complete_rows(regressor: str, params: dict[str, Any] | None, X: pd.DataFrame, y: pd.Series,
                      notes: dict[str, Any], fold: str, fitted: FittedModels | None = None) -> Regressor:
    """``regressor`` fitted on the training rows that have every feature it uses
    (:func:`perfzoo.regressors.base.fit_on_complete_rows`, through ``fitted``), the others counted and named in
    ``notes``: a regressor would fill in its training median there."""
    model, incomplete = fit_on_complete_rows(partial(build_regressor, regressor, params), X, y, fitted)
    if not incomplete.any():
        return model
    missing = sorted({name for names in model.missing_features(X[incomplete]) for name in names})
    notes.setdefault("excluded_rows_missing_features", {})[fold] = {"rows": int(incomplete.sum()),
                                                                    "features": missing}
    if (~incomplete).sum() < MIN_TRAIN_ROWS:
        raise InputError(f"{int((~incomplete).sum())} training rows have every feature {regressor} uses "
                         f"({', '.join(missing)} missing on the others)")
    return model


def fit_cell(
    data: pd.DataFrame, split: pd.DataFrame, split_name: str, target: str, regressor: str,
    params: dict[str, Any] | None = None, grid_search_splits: Sequence[str] = (), reusable: Iterable[Regressor] = (),
) -> tuple[pd.DataFrame, dict[str, Regressor], dict[str, Any]]:
    """The fit rule's cell (target, regressor, split): :func:`fit_split` (taking a fit of ``reusable`` where it is
    the same fit), or :func:`skipped_fit` with the reason when the regressor does not model the target
    (:func:`unsupported_reason`) or is ``xgboost_grid`` on a split outside ``grid_search_splits``."""
    if reason := unsupported_reason(regressor, target, params):
        return skipped_fit(reason)
    if regressor == "xgboost_grid" and split_name not in grid_search_splits:
        return skipped_fit(f"grid search runs on splits {grid_search_splits}")
    return fit_split(data, split, target, regressor, params, reusable=reusable)


def own_intervals(model: Regressor, inputs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The regressor's own 90 % intervals of held-out rows (``device_transfer``: conformal, calibrated by an
    inner leave-one-GPU-out), else NaN: the evaluate stage calibrates those on the held-out residuals of
    the whole split (:func:`perfzoo.evaluate.with_intervals`), which one fold alone cannot do."""
    if hasattr(model, "predict_interval"):
        lo, hi = model.predict_interval(inputs)
        return np.asarray(lo, float), np.asarray(hi, float)
    return np.full(len(inputs), np.nan), np.full(len(inputs), np.nan)


def skipped_fit(reason: str) -> tuple[pd.DataFrame, dict[str, Regressor], dict[str, Any]]:
    """The outputs of a (target, regressor, split) cell that is not fitted, with the reason as a note."""
    return pd.DataFrame(columns=PREDICTION_COLUMNS), {}, {"skipped_folds": {"all": reason}}


def save_models(path: str | Path, models: dict[str, Regressor], meta: dict[str, Any]) -> None:
    """All folds' fitted regressors in one JSON document (no pickle), written atomically."""
    doc = {"meta": meta, "folds": {fold: m.to_document() for fold, m in sorted(models.items())}}
    write_text(path, json.dumps(doc, sort_keys=True) + "\n")


def load_models(path: str | Path) -> tuple[dict[str, Regressor], dict[str, Any]]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: unreadable model file ({exc})") from None
    return {f: regressor_from_document(d, f"{path}:{f}") for f, d in doc["folds"].items()}, doc["meta"]


def ablation(data: pd.DataFrame, split: pd.DataFrame, target: str, regressor: str) -> pd.DataFrame:
    """Held-out accuracy with model features only vs with hardware features too (Panner Selvam, Table 6.6)."""
    rows = []
    for feature_set in FEATURE_SETS:
        predictions, _, notes = fit_split(data, split, target, regressor, feature_set=feature_set)
        held = predictions[predictions["set"] == "test"]
        test = held[np.isfinite(held["y_pred"].to_numpy(dtype=float))]  # a row lacking a feature: not predicted
        missing = {"n_missing": len(held) - len(test)} if len(test) < len(held) else {}
        rows.append({"target": target, "regressor": regressor, "split": split["split"].iloc[0] if len(split) else "",
                     "features": "model + hardware" if feature_set == "all" else "model only", "n": len(test),
                     **all_metrics(test["y_true"].to_numpy(), test["y_pred"].to_numpy()), **missing})
    return pd.DataFrame(rows)
