"""The fitted predictors a prediction uses: for each target, the file with the best held-out score, its
fold models, and the held-out ratios its interval is estimated from.

Choice of predictor. For each target, the row of ``results/evaluate/metrics.parquet`` with the lowest
MAPE on the ``random`` split (else on any split) whose ``results/fit/{target}/{regressor}/{split}
.models.json`` exists; for a model whose family was never profiled, the lowest MAPE on the
``leave_one_family_out`` split instead (the score of predicting families held out of training), with
that split's fitted models and residuals. The prediction is the mean of that file's fold models.

Intervals (nominal 90 %). Tree ensembles: 5th-95th percentile of the member (tree) predictions of all
folds. Regressors with their own calibrated intervals (``device_transfer``): those (mean over folds).
Other regressors: the 5th-95th percentile ratios r = y_pred / y_true on the held-out test rows of
the predictor's split, applied as [p / r95, p / r05]. Intervals always contain the point prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.io import InputError, read_parquet

TARGETS = (
    "latency_ms",
    "throughput",
    "peak_mem_mb",
    "mean_power_w",
    "energy_j",
    "energy_per_sample_j",
    "edp",
)


QUANTILES = (0.05, 0.95)


PREFERRED_SPLIT = "random"


#: the split whose scores choose the predictors of a model from a family that was never profiled
UNSEEN_FAMILY_SPLIT = "leave_one_family_out"


RUN_WORKFLOW = (
    "run `snakemake --cores all` (or `snakemake --cores all results/evaluate/metrics.parquet`) "
    "in the workflow directory first"
)


@dataclass
class Predictor:
    """The fitted models of one (target, regressor, split) file, with the data for its intervals."""

    target: str
    regressor: str
    split: str
    path: Path
    folds: dict[str, Any]
    meta: dict[str, Any]
    mape: float | None
    n_scored: int | None
    ratios: np.ndarray | None
    ratio_set: str

    @property
    def feature_names(self) -> list[str]:
        return sorted({c for m in self.folds.values() for c in getattr(m, "feature_names_", [])})

    @property
    def is_ensemble(self) -> bool:
        return all(hasattr(m, "predict_members") for m in self.folds.values())

    def predict(self, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        """(point, lo, hi, interval method): mean of the fold predictions and its nominal 90 % interval."""
        point = np.mean([np.asarray(m.predict(X), float) for m in self.folds.values()], axis=0)
        if self.is_ensemble:
            members = np.concatenate([np.asarray(m.predict_members(X), float) for m in self.folds.values()])
            lo, hi = np.quantile(members, QUANTILES, axis=0)
            method = f"5th-95th percentile of {members.shape[0]} tree predictions"
        elif all(hasattr(m, "predict_interval") for m in self.folds.values()):
            bounds = [m.predict_interval(X) for m in self.folds.values()]
            lo, hi = (np.mean([np.asarray(b[i], float) for b in bounds], axis=0) for i in (0, 1))
            method = "conformal 90 % interval (leave-one-device-out calibration residuals), mean over folds"
        elif self.ratios is not None and len(self.ratios):
            r05, r95 = np.quantile(self.ratios, QUANTILES)
            lo, hi = point / r95, point / r05
            method = (
                f"5th-95th percentile of y_pred/y_true on {len(self.ratios)} held-out {self.ratio_set} "
                f"rows of split {self.split}"
            )
        else:
            lo = hi = np.full_like(point, np.nan)
            method = "no held-out rows to estimate an interval"
        notes = [n for m in self.folds.values() if hasattr(m, "prediction_notes") for n in m.prediction_notes(X)]
        method = "; ".join([method, *dict.fromkeys(notes)])  # e.g. composed: unseen operator kinds, its fallback
        return point, np.fmin(lo, point), np.fmax(hi, point), method


def require_outputs(results: Path) -> None:
    for needed in ("evaluate/metrics.parquet", "dataset/dataset.parquet"):
        if not (results / needed).is_file():
            raise InputError(
                f"{results / needed}: not found, so there are no fitted predictors yet; {RUN_WORKFLOW}"
            )


# Predictors that need per-layer timings of the very model they predict, which a new model lacks.
NEEDS_PROFILED_LAYERS = ("gianniti_layer",)


def choose_file(
    metrics: pd.DataFrame, results: Path, target: str, preferred_split: str = PREFERRED_SPLIT
) -> tuple[str, str, float | None, int | None]:
    """(regressor, split, mape, n) of the best-scored existing predictor file of ``target``, by its score
    on ``preferred_split`` where that split was evaluated."""
    rows = metrics[
        (metrics["target"] == target)
        & np.isfinite(pd.to_numeric(metrics["mape"], errors="coerce"))
        & ~metrics["regressor"].isin(NEEDS_PROFILED_LAYERS)
    ]
    rows = rows[
        [
            (results / "fit" / target / r / f"{s}.models.json").is_file()
            for r, s in zip(rows["regressor"], rows["split"], strict=True)
        ]
    ]
    if len(rows):
        preferred = rows[rows["split"] == preferred_split]
        best = (preferred if len(preferred) else rows).sort_values(["mape", "regressor", "split"]).iloc[0]
        n = pd.to_numeric(best.get("n"), errors="coerce")
        return str(best["regressor"]), str(best["split"]), float(best["mape"]), None if pd.isna(n) else int(n)
    files = sorted(
        (
            p
            for p in (results / "fit" / target).glob("*/*.models.json")
            if p.parent.name not in NEEDS_PROFILED_LAYERS
        ),
        key=lambda p: (p.name != f"{preferred_split}.models.json", str(p)),
    )
    if files:  # fitted, but no held-out score (e.g. a split without test rows)
        return files[0].parent.name, files[0].name.removesuffix(".models.json"), None, None
    return "", "", None, None


def load_predictors(
    results: Path, data: pd.DataFrame, preferred_split: str = PREFERRED_SPLIT
) -> tuple[dict[str, Predictor], dict[str, str]]:
    """The chosen predictor of every target (best score on ``preferred_split`` where evaluated), and the
    reason for every target without one."""
    # lazy: perfzoo.fitting imports scikit-learn (~1.5 s CPU), which loads while the featurising child runs
    from perfzoo.fitting import load_models

    metrics = read_parquet(results / "evaluate" / "metrics.parquet")
    found: dict[str, Predictor] = {}
    missing: dict[str, str] = {}
    for target in TARGETS:
        regressor, split, score, n = (
            choose_file(metrics, results, target, preferred_split) if len(metrics) else ("", "", None, None)
        )
        if not regressor:
            missing[target] = _no_predictor_reason(results, data, target)
            continue
        path = results / "fit" / target / regressor / f"{split}.models.json"
        try:
            folds, meta = load_models(path)
        except InputError as exc:  # one unreadable predictor file: that target is missing, the rest stand
            missing[target] = str(exc)
            continue
        if not folds:
            missing[target] = f"{path} holds no fitted fold ({meta.get('config', {}).get('notes', '')})"
            continue
        ratios, ratio_set = _held_out_ratios(path.with_name(f"{split}.predictions.parquet"))
        found[target] = Predictor(target, regressor, split, path, folds, meta, score, n, ratios, ratio_set)
    return found, missing


def _no_predictor_reason(results: Path, data: pd.DataFrame, target: str) -> str:
    if target in data.columns and not (pd.to_numeric(data[target], errors="coerce") > 0).any():
        reasons = data.get("energy_missing_reason")
        why = (
            [r for r in reasons.dropna().unique() if str(r).strip()]
            if reasons is not None and target not in ("latency_ms", "throughput", "peak_mem_mb")
            else []
        )
        detail = f": {'; '.join(map(str, why))}" if len(why) else ""
        return f"no {target} measurement in the dataset{detail}"
    if not (results / "fit" / target).is_dir():
        return f"no fitted predictor: {target} is not among the config's fit.targets"
    return f"no fitted predictor under {results / 'fit' / target}/; {RUN_WORKFLOW}"


def _held_out_ratios(path: Path) -> tuple[np.ndarray | None, str]:
    """y_pred / y_true of the test rows (else validation rows) of a fit's held-out predictions."""
    if not path.is_file():
        return None, ""
    held = pd.read_parquet(path, columns=["set", "y_true", "y_pred"])
    for which in ("test", "val"):
        rows = held[held["set"] == which]
        y, p = rows["y_true"].to_numpy(float), rows["y_pred"].to_numpy(float)
        ok = np.isfinite(y) & np.isfinite(p) & (y > 0) & (p > 0)
        if ok.any():
            return p[ok] / y[ok], which
    return None, ""
