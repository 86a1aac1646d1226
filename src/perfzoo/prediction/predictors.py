"""The fitted predictors a prediction uses: for each target, the file with the best held-out score, its
fold models, and the held-out residuals its interval is calibrated on.

Choice of predictor. For each target, the regressor with the lowest MAPE over the held-out rows of the splits within
profiled families (:data:`IN_FAMILY_SPLITS`: ``random``, ``family_monte_carlo`` and ``stratified_kfold``, their rows
pooled; the random split alone holds 15 rows in the default run, too few to tell regressors apart) among those whose
``results/fit/{target}/{regressor}/random.models.json`` exists, with that file's fold models and residuals (else the
lowest MAPE of any split with a fitted file); for a model whose family was never profiled, the lowest MAPE over the
held-out rows of :data:`UNSEEN_FAMILY_SPLITS` pooled instead (``leave_one_family_out``, the score of predicting
families held out of training, and ``batch_extrapolation``: the user's batch is the user's choice), with the
``leave_one_family_out`` split's fitted models and residuals. The prediction is the mean of that file's fold models,
over those that give one (a fold model whose training rows never exercised a term the model needs gives none:
``memory_sim``); the record says how many did not. A row without a value for a feature the chosen predictor uses
(its fx graph, memory simulation or operator trace failed) gets no number from it, never the training median a
regressor would fill in: the next predictor of the same ranking whose features the row has predicts it, named
(:meth:`Predictor.predict`).

Intervals (nominal 90 %). Regressors with their own calibrated intervals (``device_transfer``): those
(mean over folds). Every other regressor: ``p × exp(±q)``, ``q`` the conformal quantile
(:func:`perfzoo.evaluate.calibrate`) of ``|log(y / y_pred)|`` over all held-out rows of the predictor's
split, the function whose per-fold (cross-conformal) intervals give the ``coverage90`` of
``results/evaluate/metrics.parquet``; the method text quotes that measured coverage. Intervals always
contain the point prediction; :mod:`perfzoo.prediction.bounds` widens them outside the profiled range.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.evaluate import (
    COVERAGE_BAND,
    INTERVAL_LEVEL,
    Calibration,
    calibrate,
    log_residuals,
    outside_coverage_band,
)
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


PREFERRED_SPLIT = "random"
#: splits whose held-out rows are configs of profiled families: pooled, their scores choose the predictor of a
#: model of a profiled family (whose fitted files are those of :data:`PREFERRED_SPLIT`)
IN_FAMILY_SPLITS = (PREFERRED_SPLIT, "family_monte_carlo", "stratified_kfold")


#: the split whose fitted files predict a model from a family that was never profiled
UNSEEN_FAMILY_SPLIT = "leave_one_family_out"
#: splits whose held-out rows, pooled, choose that predictor: whole families held out, and batches beyond the
#: profiled ones (a user's model is of a new family, asked at a batch of the user's choice)
UNSEEN_FAMILY_SPLITS = (UNSEEN_FAMILY_SPLIT, "batch_extrapolation")
#: the splits pooled to score the files of each split a choice prefers
POOLED_SPLITS = {PREFERRED_SPLIT: IN_FAMILY_SPLITS, UNSEEN_FAMILY_SPLIT: UNSEEN_FAMILY_SPLITS}


RUN_WORKFLOW = (
    "run `snakemake --cores all` (or `snakemake --cores all results/evaluate/metrics.parquet`) "
    "in the workflow directory first"
)


@dataclass(frozen=True)
class MeasuredCoverage:
    """The coverage of a predictor's intervals measured in the evaluate stage (``coverage90`` of the metrics
    table) on ``n`` held-out test rows; NaN with ``reason`` when not measured."""

    coverage: float = math.nan
    n: int = 0
    reason: str = "not in the metrics table"

    def text(self, split: str) -> str:
        if not math.isfinite(self.coverage):
            return f"coverage on split {split} not measured ({self.reason})"
        low, high = COVERAGE_BAND
        verdict = (f", outside the {low:.0%}–{high:.0%} band of a calibrated 90 % interval"
                   if outside_coverage_band(self.coverage) else "")
        return (f"measured coverage {self.coverage:.0%} of {self.n} held-out test rows of split {split}"
                f"{verdict}")


@dataclass(frozen=True)
class TargetPrediction:
    """One predictor's answer over the rows of a feature table: the point and its 90 % interval per row, the
    interval method as printed, and per row whose number it is (``regressor/split``) or why it has none ("" where
    it has one, or where the fold models gave none on their own). Unpacks as ``(point, lo, hi, method)``."""

    point: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    method: str
    sources: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    fallbacks: tuple[Predictor, ...] = ()
    """The next-best predictors some rows were predicted by (the prediction record names and hashes them)."""

    def __iter__(self) -> Iterator[Any]:
        return iter((self.point, self.lo, self.hi, self.method))

    def given_by(self, row: int, chosen: Predictor) -> Predictor:
        """The predictor whose number row ``row`` holds: ``chosen``, or the fallback that predicted it."""
        source = self.sources[row] if row < len(self.sources) else chosen.source
        return next((a for a in self.fallbacks if a.source == source), chosen)

    def why_missing(self, row: int) -> str:
        return self.missing[row] if row < len(self.missing) else ""


@dataclass
class Predictor:
    """The fitted models of one (target, regressor, split) file, with the calibration of its intervals."""

    target: str
    regressor: str
    split: str
    path: Path
    folds: dict[str, Any]
    meta: dict[str, Any]
    mape: float | None
    n_scored: int | None
    calibration: Calibration | None = None
    coverage: MeasuredCoverage = field(default_factory=MeasuredCoverage)
    scored_on: tuple[str, ...] = ()
    """The splits whose held-out rows ``mape`` pools (empty: ``split`` alone)."""
    alternatives: tuple[Callable[[], Predictor | None], ...] = ()
    """Loaders of the next-best predictors of the target, in order of their score: for rows this one cannot
    predict because a feature it uses is missing (:meth:`predict`)."""

    @property
    def source(self) -> str:
        return f"{self.regressor}/{self.split}"

    @property
    def score_text(self) -> str:
        """Where ``mape`` was measured: the split, or the pooled splits."""
        return " + ".join(self.scored_on or (self.split,))

    @property
    def feature_names(self) -> list[str]:
        return sorted({c for m in self.folds.values() for c in getattr(m, "feature_names_", [])})

    @property
    def has_own_intervals(self) -> bool:
        return bool(self.folds) and all(hasattr(m, "predict_interval") for m in self.folds.values())

    @property
    def interval_source(self) -> str:
        """How the intervals are made, in a few words (the prediction's provenance record)."""
        if self.has_own_intervals:
            return "the regressor's own conformal intervals"
        return f"conformal, held-out residuals of split {self.split}"

    @property
    def calibrated(self) -> Calibration:
        return self.calibration or Calibration(math.nan, 0, "no held-out predictions")

    def interval_text(self) -> str:
        """The interval method as printed: calibration, its rows, and the coverage measured on them."""
        cal = self.calibrated
        if not math.isfinite(cal.q):
            return f"no interval: {cal.reason} on split {self.split}"
        return (f"conformal {INTERVAL_LEVEL * 100:.0f} % interval: point ×/÷ {math.exp(cal.q):.3g}, the "
                f"conformal quantile of |log(measured/predicted)| over {cal.n} held-out rows of split "
                f"{self.split}; {self.coverage.text(self.split)}")

    def missing_features(self, X: pd.DataFrame) -> list[list[str]]:
        """Per row of ``X``, the features some fold model uses and the row has no value for."""
        per_fold = [m.missing_features(X) if hasattr(m, "missing_features") else [[] for _ in range(len(X))]
                    for m in self.folds.values()]  # a fold model need only predict (a stand-in has no features)
        return [sorted({name for names in row for name in names}) for row in zip(*per_fold, strict=True)]

    def predict(self, X: pd.DataFrame) -> TargetPrediction:
        """:meth:`predict_own` where every feature the fold models use is present. A row without one of them gets
        no number from this predictor (a regressor would fill in the training median: another model's value); it
        is predicted by the first of :attr:`alternatives` whose features it has, named in the method text and in
        the answer's ``sources`` and ``fallbacks``, else left NaN with the reason in its ``missing``. The answer
        is returned, not kept: a predictor may be asked again (power caps) before the first answer is read."""
        gaps = self.missing_features(X)
        point, lo, hi, method = self.predict_own(X)
        sources = [self.source] * len(X)
        missing = [
            f"{self.source} gives no prediction where {', '.join(g)} {'is' if len(g) == 1 else 'are'} missing "
            f"({missing_feature_reasons(X.iloc[i], g)}; a training median is never filled in)" if g else ""
            for i, g in enumerate(gaps)]
        blocked = np.array([bool(g) for g in gaps], dtype=bool)
        if not blocked.any():
            return TargetPrediction(point, lo, hi, method, tuple(sources), tuple(missing))
        own = [method] if not blocked.all() else []  # some row is this predictor's
        point, lo, hi = (np.where(blocked, np.nan, a) for a in (point, lo, hi))
        notes, fallbacks = list(dict.fromkeys(why for why in missing if why)), []
        for load in self.alternatives:
            rows = np.flatnonzero(blocked)
            if not len(rows):
                break
            alternative = load()
            if alternative is None:
                continue
            sub = X.iloc[rows]
            covered = np.array([not g for g in alternative.missing_features(sub)], dtype=bool)
            if not covered.any():
                continue
            a_point, a_lo, a_hi, a_method = alternative.predict_own(sub.iloc[np.flatnonzero(covered)])
            fallbacks.append(alternative)
            for k, row in enumerate(rows[covered]):
                point[row], lo[row], hi[row] = a_point[k], a_lo[k], a_hi[k]
                sources[row], missing[row] = alternative.source, ""
                blocked[row] = False
            score = "" if alternative.mape is None else f", {alternative.mape:.3g} % MAPE on {alternative.score_text}"
            notes.append(f"{int(covered.sum())} row(s) predicted by the fallback {alternative.source} (the next "
                         f"best whose features are present{score}): {a_method}")
        return TargetPrediction(point, lo, hi, "; ".join([*own, *notes]), tuple(sources), tuple(missing),
                                tuple(fallbacks))

    def predict_own(self, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        """(point, lo, hi, interval method): mean of the fold predictions and its nominal 90 % interval; per row,
        the mean over the fold models that give one (NaN where none does), noted where some do not."""
        point, missing = mean_of_finite([np.asarray(m.predict(X), float) for m in self.folds.values()])
        if self.has_own_intervals:
            bounds = [m.predict_interval(X) for m in self.folds.values()]
            lo, hi = (mean_of_finite([np.asarray(b[i], float) for b in bounds])[0] for i in (0, 1))
            method = (
                "conformal 90 % interval (leave-one-device-out calibration residuals), mean over folds; "
                + self.coverage.text(self.split)
            )
        else:  # NaN, with the reason in the text, when there were too few residuals to calibrate on
            lo, hi = self.calibrated.interval(point)
            method = self.interval_text()
        notes = [n for m in self.folds.values() if hasattr(m, "prediction_notes") for n in m.prediction_notes(X)]
        notes += [f"{k} of {len(self.folds)} fold models give no prediction; the point is the mean of the others"
                  for k in missing if 0 < k < len(self.folds)]
        method = "; ".join([method, *merge_fold_notes(notes)])  # e.g. composed: unseen operator kinds, fallback
        return point, np.minimum(lo, point), np.maximum(hi, point), method  # a missing interval stays NaN


#: where a feature row says why a group of its features is missing
_REASON_COLUMNS = (("graph_", "graph_error"), ("sim_", "sim_error"), ("op_", "op_trace_error"))


def missing_feature_reasons(row: pd.Series, names: list[str]) -> str:
    """Why ``names`` are missing in the feature ``row``: the reason its featurisation recorded for their group
    (the fx trace, the memory simulation, the operator trace), else "not computed"."""
    reasons = []
    for prefix, column in _REASON_COLUMNS:
        if any(name.startswith(prefix) for name in names):
            why = str(row.get(column) or "").strip()
            reasons.append(f"{column}: {why}" if why else f"{prefix}* not computed")
    rest = [n for n in names if not any(n.startswith(p) for p, _ in _REASON_COLUMNS)]
    if rest:
        reasons.append(f"{', '.join(rest)} not computed")
    return "; ".join(reasons)


def mean_of_finite(predictions: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the mean of the finite fold predictions (NaN where none is) and how many were not finite."""
    stacked = np.stack(predictions)
    finite = np.isfinite(stacked)
    n = finite.sum(axis=0)
    total = np.where(finite, stacked, 0.0).sum(axis=0)
    return np.divide(total, n, out=np.full(total.shape, np.nan), where=n > 0), len(predictions) - n


_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")
_SLOT = "\x00"  # where a number stood in a note


def merge_fold_notes(notes: list[str]) -> list[str]:
    """The fold models' notes, each once: notes that differ only in their numbers (the share of the step an
    unseen operator kind takes in each fold model's prediction) become one note with each number's range
    over the folds ("89-92 %"), in order of first appearance."""
    numbers: dict[str, list[list[str]]] = {}
    for note in notes:
        numbers.setdefault(_NUMBER.sub(_SLOT, note), []).append(_NUMBER.findall(note))
    merged = []
    for pattern, found in numbers.items():
        texts, ranges = pattern.split(_SLOT), [_range_text(column) for column in zip(*found, strict=True)]
        merged.append("".join(text + value for text, value in zip(texts, [*ranges, ""], strict=True)))
    return merged


def _range_text(values: tuple[str, ...]) -> str:
    low, high = min(values, key=float), max(values, key=float)
    return low if float(low) == float(high) else f"{low}-{high}"


def require_outputs(results: Path) -> None:
    for needed in ("evaluate/metrics.parquet", "dataset/dataset.parquet"):
        if not (results / needed).is_file():
            raise InputError(
                f"{results / needed}: not found, so there are no fitted predictors yet; {RUN_WORKFLOW}"
            )


# Predictors that need per-layer timings of the very model they predict, which a new model lacks.
NEEDS_PROFILED_LAYERS = ("gianniti_layer",)


Choice = tuple[str, str, float | None, int | None, tuple[str, ...]]
"""(regressor, split, mape, n, splits scored on) of a predictor file."""


def choose_file(
    metrics: pd.DataFrame, results: Path, target: str, preferred_split: str = PREFERRED_SPLIT
) -> Choice:
    """(regressor, split, mape, n, splits scored on) of the best-scored existing predictor file of ``target``:
    by its score on ``preferred_split`` where that split was evaluated, pooled over the splits
    :data:`POOLED_SPLITS` names for it (:func:`_pooled_scores`)."""
    return ranked_files(metrics, results, target, preferred_split)[0]


def ranked_files(
    metrics: pd.DataFrame, results: Path, target: str, preferred_split: str = PREFERRED_SPLIT
) -> list[Choice]:
    """Every scored existing predictor file of ``target`` as :func:`choose_file` ranks them, best first (one
    file with no held-out score where none is scored; ``("", "", None, None, ())`` where none exists)."""
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
        scored_on: tuple[str, ...] = ()
        if preferred_split in POOLED_SPLITS and len(preferred):
            preferred, scored_on = _pooled_scores(metrics, target, preferred, POOLED_SPLITS[preferred_split])
        ranked = (preferred if len(preferred) else rows).sort_values(["mape", "regressor", "split"])
        choices = []
        for _, row in ranked.iterrows():
            n = pd.to_numeric(row.get("n"), errors="coerce")
            choices.append((str(row["regressor"]), str(row["split"]), float(row["mape"]),
                            None if pd.isna(n) else int(n), scored_on))
        return choices
    files = sorted(
        (
            p
            for p in (results / "fit" / target).glob("*/*.models.json")
            if p.parent.name not in NEEDS_PROFILED_LAYERS
        ),
        key=lambda p: (p.name != f"{preferred_split}.models.json", str(p)),
    )
    if files:  # fitted, but no held-out score (e.g. a split without test rows)
        return [(files[0].parent.name, files[0].name.removesuffix(".models.json"), None, None, ())]
    return [("", "", None, None, ())]


def _pooled_scores(metrics: pd.DataFrame, target: str, candidates: pd.DataFrame, pooled: tuple[str, ...]
                   ) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """``candidates`` (rows of the preferred split, ``pooled[0]``) with ``mape`` and ``n`` pooled over the held-out
    rows of the splits of ``pooled`` that every candidate was scored on (MAPE weighted by each split's rows), and
    those splits. A split without row counts is left out, as is a split some candidate lacks."""
    scores = metrics[(metrics["target"] == target) & metrics["split"].isin(pooled)
                     & metrics["regressor"].isin(candidates["regressor"])]
    scores = scores.assign(mape=pd.to_numeric(scores["mape"], errors="coerce"),
                           n=pd.to_numeric(scores.get("n"), errors="coerce"))
    scores = scores[np.isfinite(scores["mape"]) & (scores["n"] > 0)]
    per_split = scores.groupby("split")["regressor"].nunique()
    splits = tuple(s for s in pooled if per_split.get(s, 0) == candidates["regressor"].nunique())
    if pooled[0] not in splits or len(splits) < 2:
        return candidates, ()
    scores = scores[scores["split"].isin(splits)]
    rows = scores.groupby("regressor")["n"].sum()
    pooled_scores = pd.DataFrame({"mape": (scores["mape"] * scores["n"]).groupby(scores["regressor"]).sum() / rows,
                                  "n": rows})
    return candidates.drop(columns=["mape", "n"], errors="ignore").merge(
        pooled_scores, left_on="regressor", right_index=True), splits


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
        choices = ranked_files(metrics, results, target, preferred_split) if len(metrics) else []
        if not choices or not choices[0][0]:
            missing[target] = _no_predictor_reason(results, data, target)
            continue
        loaded = _load_predictor(results, metrics, target, choices[0], load_models)
        if isinstance(loaded, str):  # one unreadable predictor file: that target is missing, the rest stand
            missing[target] = loaded
            continue
        loaded.alternatives = tuple(_lazily(results, metrics, target, choice, load_models) for choice in choices[1:])
        found[target] = loaded
    return found, missing


def _load_predictor(results: Path, metrics: pd.DataFrame, target: str, choice: Choice,
                    load_models: Callable[[Path], tuple[dict[str, Any], dict[str, Any]]]) -> Predictor | str:
    """The :class:`Predictor` of ``choice``, or why its file cannot be used."""
    regressor, split, score, n, scored_on = choice
    path = results / "fit" / target / regressor / f"{split}.models.json"
    try:
        folds, meta = load_models(path)
    except InputError as exc:
        return str(exc)
    if not folds:
        return f"{path} holds no fitted fold ({meta.get('config', {}).get('notes', '')})"
    calibration = held_out_calibration(path.with_name(f"{split}.predictions.parquet"))
    coverage = measured_coverage(metrics, target, regressor, split)
    return Predictor(target, regressor, split, path, folds, meta, score, n, calibration, coverage, scored_on)


def _lazily(results: Path, metrics: pd.DataFrame, target: str, choice: Choice,
            load_models: Callable[[Path], tuple[dict[str, Any], dict[str, Any]]]) -> Callable[[], Predictor | None]:
    """A loader of ``choice``'s predictor, read at its first call (None: its file cannot be used)."""
    cached: list[Predictor | None] = []

    def load() -> Predictor | None:
        if not cached:
            loaded = _load_predictor(results, metrics, target, choice, load_models)
            cached.append(None if isinstance(loaded, str) else loaded)
        return cached[0]

    return load


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


def held_out_calibration(path: Path) -> Calibration:
    """The conformal half-width over all held-out rows (validation and test, every fold) of a fit's
    predictions file."""
    if not path.is_file():
        return Calibration(math.nan, 0, f"no held-out predictions file {path.name}")
    held = pd.read_parquet(path, columns=["y_true", "y_pred"])
    return calibrate(log_residuals(held["y_true"], held["y_pred"]))


def measured_coverage(metrics: pd.DataFrame, target: str, regressor: str, split: str) -> MeasuredCoverage:
    """``coverage90`` of the (target, regressor, split) row of the metrics table, with its row count or the
    reason it is missing."""
    if "coverage90" not in metrics.columns:
        return MeasuredCoverage(reason="the metrics table has no coverage90 column")
    rows = metrics[
        (metrics["target"] == target) & (metrics["regressor"] == regressor) & (metrics["split"] == split)
    ]
    if rows.empty:
        return MeasuredCoverage(reason="no row in the metrics table")
    row = rows.iloc[0]
    coverage = pd.to_numeric(row.get("coverage90"), errors="coerce")
    n = pd.to_numeric(row.get("n_interval"), errors="coerce")
    reason = str(row.get("interval_missing") or "no held-out row has an interval")
    n_rows = 0 if pd.isna(n) else int(n)
    return MeasuredCoverage(float(coverage), n_rows, "" if pd.notna(coverage) else reason)
