"""Fit stage: train one regressor per fold of a split on one target, predict the held-out rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.dataset import feature_columns, finite_target_rows
from perfzoo.io import InputError, write_text
from perfzoo.regressors import Regressor, make_regressor

MIN_TRAIN_ROWS = 3
ID_COLUMNS = ["row_id", "model_id", "device", "mode", "batch", "family", "label"]
PREDICTION_COLUMNS = ["split", "fold", "set", *ID_COLUMNS, "target", "regressor", "y_true", "y_pred"]


def regressor_inputs(data: pd.DataFrame) -> pd.DataFrame:
    """What a regressor sees: the numeric feature columns plus identifying columns it may group by."""
    return data[[*feature_columns(data), "device", "model_id", "mode"]]


def fit_split(
    data: pd.DataFrame, split: pd.DataFrame, target: str, regressor: str, params: dict[str, Any] | None = None,
) -> tuple[pd.DataFrame, dict[str, Regressor], dict[str, Any]]:
    """(predictions on val/test rows of every fold, fitted model per fold, notes on skipped folds)."""
    if target not in data.columns:
        raise InputError(f"dataset has no target column {target!r}")
    usable = finite_target_rows(data, target)
    notes: dict[str, Any] = {"excluded_nonfinite_labels": int((~usable).sum()), "skipped_folds": {}}
    data = data[usable].set_index("row_id", drop=False)
    predictions, models = [], {}
    for fold, rows in split.groupby("fold", sort=True):
        rows = rows[rows["row_id"].isin(data.index)]
        train = data.loc[rows.loc[rows["set"] == "train", "row_id"]]
        held = rows[rows["set"] != "train"]
        if len(train) < MIN_TRAIN_ROWS or held.empty:
            notes["skipped_folds"][str(fold)] = f"{len(train)} training rows, {len(held)} held-out rows"
            continue
        model = make_regressor(regressor, **(params or {})).fit(regressor_inputs(train), train[target])
        test = data.loc[held["row_id"]]
        pred = model.predict(regressor_inputs(test))
        predictions.append(test[ID_COLUMNS].assign(
            split=split["split"].iloc[0], fold=str(fold), set=held["set"].to_numpy(), target=target,
            regressor=regressor, y_true=test[target].to_numpy(dtype=float), y_pred=np.asarray(pred, float)))
        models[str(fold)] = model
    frame = (pd.concat(predictions, ignore_index=True) if predictions
             else pd.DataFrame(columns=PREDICTION_COLUMNS))
    return frame[PREDICTION_COLUMNS], models, notes


def save_models(path: str | Path, models: dict[str, Regressor], meta: dict[str, Any]) -> None:
    """All folds' fitted regressors in one JSON document (no pickle), written atomically."""
    doc = {"meta": meta, "folds": {fold: m.to_document() for fold, m in sorted(models.items())}}
    write_text(path, json.dumps(doc, sort_keys=True) + "\n")


def load_models(path: str | Path) -> tuple[dict[str, Regressor], dict[str, Any]]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: unreadable model file ({exc})") from None
    return {f: Regressor.from_document(d, source=f"{path}:{f}") for f, d in doc["folds"].items()}, doc["meta"]
