"""The performance models of Gianniti, Zhang and Ardagna, "Performance Prediction of GPU-Based Deep
Learning Applications": end-to-end (time affine in batch size per model, :class:`GiannitiE2ERegressor`)
and per layer (``t_l = β0 + β1·c_l`` per layer category, summed over a network,
:class:`GiannitiLayerRegressor`), with the per-layer coefficient fit and its input tables.

Inputs of the per-layer model
-----------------------------
layer timings
    ``results/layers/<device>.parquet`` (:data:`perfzoo.profiling.layers.LAYER_TIMING_COLUMNS`): the
    median forward (``fw_ms``) and backward (``bw_ms``) time of every layer call of a sample of configs,
    measured on a CPU device with hooks (:func:`perfzoo.profiling.layers.measure_layers_on_cpu`).
layer features
    ``results/features/layers.parquet`` (:data:`perfzoo.features.meta.LAYER_COLUMNS`): the Gianniti forward and
    backward complexities ``c_fw``/``c_bw`` of every layer call, computed on the meta device.

Both tables list the layer calls of a (model_id, mode, batch) config in execution order; they are joined on
(model_id, mode, batch, name, occurrence), ``occurrence`` being the count of earlier calls of the same
module name (:func:`with_occurrence`).

Categories
----------
Those of the paper's coefficient table, Conv/FC, Norm, Pool S=1, Pool S>1, ReLU/Drop (the features'
``conv_fc``, ``norm``, ``pool_s1``, ``pool_s2``, ``relu_drop``), then the extra ones present in the data:
``attention``, ``embedding``, ``loss`` (the training loss row, ``type == "Loss"``, whose complexity is the
paper's Loss formula) and ``other`` (layers the complexity table does not cover, ``c = 0``: their model is
an intercept, the mean time). The backward model is fitted on training configs only.

Fit
---
Per category and direction, least squares of the measured time on ``[1, c]`` with both coefficients
constrained to be non-negative (``scipy.optimize.nnls`` on a column-scaled design: a negative intercept
or slope would predict negative times or faster layers for more work). Where the unconstrained solution
is non-negative the two coincide. A category whose complexity does not vary gets slope 0 and the mean
time. Times are the per-layer medians in ms, so ``β0`` is in ms and ``β1`` in ms per operation, as in the
paper's table.

Network time
------------
``t̂ = I · Σ_l t̂_l`` over the layer calls of the config, with ``I = 1`` iteration: the forward
terms for inference, forward + backward for training. :class:`GiannitiLayerRegressor` multiplies the sum by
a per-device (and, by default, per-mode) scale fitted on the training rows, so that it predicts the
measured end-to-end step time on any device, including GPUs whose layers were never timed: what the
layers of the timed CPU do not capture (work outside layer calls, the optimizer step, the hook overhead,
another device's speed) goes into that factor.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from scipy.optimize import nnls
from sklearn.utils.validation import check_is_fitted

from perfzoo.io import InputError, read_parquet
from perfzoo.regressors.base import Regressor, check_frame, register_regressor, require_columns

PAPER_CATEGORIES = ("conv_fc", "norm", "pool_s1", "pool_s2", "relu_drop")
EXTRA_CATEGORIES = ("attention", "embedding", "loss", "other")
CATEGORY_LABELS = {
    "conv_fc": "Conv/FC", "norm": "Norm", "pool_s1": "Pool S=1", "pool_s2": "Pool S>1",
    "relu_drop": "ReLU/Drop", "attention": "Attention", "embedding": "Embedding", "loss": "Loss",
    "other": "Other", "pooled": "All layers (pooled)",
}  # fmt: skip
POOLED = "pooled"
"""Key of the fit of all layers together, used for a category not seen in training."""
COEFFICIENT_COLUMNS = [
    "category", "beta0_fw_ms", "beta1_fw_ms_per_op", "beta0_bw_ms", "beta1_bw_ms_per_op", "n_layers",
    "n_layers_bw",
]  # fmt: skip
CONFIG_KEY = ["model_id", "mode", "batch"]
JOIN_KEY = [*CONFIG_KEY, "name", "occurrence"]
ROW_KEY = ["model_id", "mode", "batch", "device"]
LAYER_FEATURE_COLUMNS = [*CONFIG_KEY, "layer_idx", "name", "type", "category", "c_fw", "c_bw"]


# --------------------------------------------------------------------------- end-to-end model


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
        X = check_frame(X)
        require_columns(X, [self.batch_col, self.model_col], what="gianniti_e2e")
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
        require_columns(X, [self.model_col, *self.context_cols_], what="gianniti_e2e")
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


# --------------------------------------------------------------------------- per-layer model: tables


def with_occurrence(layers: pd.DataFrame) -> pd.DataFrame:
    """The features' layer table with ``occurrence`` (calls of the same name before this one, in
    ``layer_idx`` order) and ``category`` ``loss`` for the training loss row."""
    out = layers.sort_values([*CONFIG_KEY, "layer_idx"], kind="stable").reset_index(drop=True)
    out["occurrence"] = out.groupby([*CONFIG_KEY, "name"], sort=False).cumcount()
    out["category"] = np.where(out["type"] == "Loss", "loss", out["category"])
    return out


def category_order(categories: Sequence[str]) -> list[str]:
    """The paper's categories first, then the extra ones, then anything else alphabetically."""
    known = [*PAPER_CATEGORIES, *EXTRA_CATEGORIES]
    present = set(categories)
    return [c for c in known if c in present] + sorted(present - set(known))


def join_layer_times(layer_times: pd.DataFrame, layer_features: pd.DataFrame) -> pd.DataFrame:
    """Measured layer times joined with their complexities (ok rows only; inner join on
    model_id, mode, batch, name, occurrence)."""
    require_columns(layer_times, [*JOIN_KEY, "fw_ms", "bw_ms"], what="layer timing")
    require_columns(layer_features, LAYER_FEATURE_COLUMNS, what="layer feature")
    times = layer_times
    if "status" in times.columns:
        times = times[times["status"] == "ok"]
    times = times[times["name"].astype(str) != ""]
    features = with_occurrence(layer_features)[[*JOIN_KEY, "category", "c_fw", "c_bw"]]
    times = times.drop(columns=[c for c in ("category", "c_fw", "c_bw") if c in times.columns])
    times = times.astype({"batch": "int64", "occurrence": "int64"})
    features = features.astype({"batch": "int64", "occurrence": "int64"})
    return times.merge(features, on=JOIN_KEY, how="inner", validate="many_to_one")


def _nonnegative_line(c: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """``t ≈ β0 + β1·c`` by least squares with ``β0, β1 >= 0``."""
    c, t = np.asarray(c, dtype=np.float64), np.asarray(t, dtype=np.float64)
    if t.size == 0:
        return math.nan, math.nan
    scale = float(np.max(np.abs(c))) if c.size else 0.0
    if not scale > 0 or np.ptp(c) == 0:
        return max(float(np.mean(t)), 0.0), 0.0
    design = np.column_stack([np.ones_like(c), c / scale])
    (b0, b1), _ = nnls(design, t)
    return float(b0), float(b1 / scale)


def _fit_direction(joined: pd.DataFrame, time_col: str, c_col: str) -> dict[str, tuple[float, float, int]]:
    rows = joined[np.isfinite(joined[time_col].to_numpy(dtype=np.float64))]
    fits = {}
    for category, g in rows.groupby("category", sort=False):
        fits[str(category)] = (*_nonnegative_line(g[c_col].to_numpy(), g[time_col].to_numpy()), len(g))
    if len(rows):
        fits[POOLED] = (*_nonnegative_line(rows[c_col].to_numpy(), rows[time_col].to_numpy()), len(rows))
    return fits


def fit_joined(joined: pd.DataFrame) -> pd.DataFrame:
    """Coefficients (layout :data:`COEFFICIENT_COLUMNS`) from an already joined table."""
    fw = _fit_direction(joined, "fw_ms", "c_fw")
    bw = _fit_direction(joined[joined["mode"] == "training"], "bw_ms", "c_bw")
    rows = []
    for category in [*category_order([c for c in fw.keys() | bw.keys() if c != POOLED]), POOLED]:
        if category not in fw and category not in bw:
            continue
        b0f, b1f, nf = fw.get(category, (math.nan, math.nan, 0))
        b0b, b1b, nb = bw.get(category, (math.nan, math.nan, 0))
        rows.append([category, b0f, b1f, b0b, b1b, nf, nb])  # COEFFICIENT_COLUMNS order
    table = pd.DataFrame(rows, columns=COEFFICIENT_COLUMNS)
    return table.astype({"n_layers": "int64", "n_layers_bw": "int64"})


def fit_layer_coefficients(layer_times: pd.DataFrame, layer_features: pd.DataFrame) -> pd.DataFrame:
    """Per-category forward and backward linear models ``t = β0 + β1·c`` (Gianniti et al.'s coefficients).

    ``layer_times`` has one row per measured layer call (model_id, mode, batch, name, occurrence, fw_ms,
    bw_ms[, status]); ``layer_features`` is the features' layer table. Returns one row per category
    (the paper's categories first, then the extra ones present, then ``pooled``, the fit of all layers
    together) with columns ``category, beta0_fw_ms, beta1_fw_ms_per_op, beta0_bw_ms,
    beta1_bw_ms_per_op, n_layers`` and ``n_layers_bw`` (layer calls in the forward and backward fits;
    a direction without data has NaN coefficients). Raises :class:`InputError` when no measured layer
    matches a featurised one.
    """
    joined = join_layer_times(layer_times, layer_features)
    if joined.empty:
        raise InputError(
            "gianniti: no measured layer call matches the featurised layer table "
            "(different models, or layer names/occurrences that do not line up)"
        )
    return fit_joined(joined)


def coefficient_table(
    layer_times: pd.DataFrame | str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    layer_features: pd.DataFrame | str | os.PathLike[str],
) -> pd.DataFrame:
    """Gianniti et al.'s "Linear Regression Coefficients" table, per timed device, for the report.

    Fits :func:`fit_layer_coefficients` on all ok layer timings of each device (files
    ``results/layers/<device>.parquet``, a glob, a list of them, or a DataFrame with a ``device``
    column). Columns: device, category (the slide's labels), the four coefficients, n_layers,
    n_layers_bw. A device whose timings match no featurised layer is left out.
    """
    times = layer_times if isinstance(layer_times, pd.DataFrame) else load_layer_timings(layer_times)
    features = layer_features if isinstance(layer_features, pd.DataFrame) else read_parquet(layer_features)
    if "device" not in times.columns:
        times = times.assign(device="")
    tables = []
    for device, g in times.groupby("device", sort=True):
        joined = join_layer_times(g, features)
        if not joined.empty:
            tables.append(fit_joined(joined).assign(device=str(device)))
    columns = ["device", *COEFFICIENT_COLUMNS]
    if not tables:
        return pd.DataFrame(columns=columns)
    table = pd.concat(tables, ignore_index=True)[columns]
    table["category"] = table["category"].map(lambda c: CATEGORY_LABELS.get(c, c))
    return table


# --------------------------------------------------------------------------- files


def timing_paths(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Paths named by a path, a glob, or a list of either (sorted, without duplicates)."""
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    paths: list[str] = []
    for item in items:
        text = str(item)
        matches = sorted(glob.glob(text)) if glob.has_magic(text) else [text]
        paths += matches
    return sorted(dict.fromkeys(paths))


def load_layer_timings(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    """Concatenated layer timing files; ``device`` from the column, else the file name's stem."""
    paths = timing_paths(spec)
    if not paths:
        raise InputError(f"gianniti: no layer timing file matches {spec!r}")
    frames = []
    for path in paths:
        df = read_parquet(path)
        missing = [c for c in (*JOIN_KEY, "fw_ms", "bw_ms") if c not in df.columns]
        if missing:
            raise InputError(f"{path}: not a layer timing file, missing columns {missing}")
        if "device" not in df.columns:
            df = df.assign(device=Path(path).stem)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


_LAYER_CACHE: dict[tuple[str, int, int], pd.DataFrame] = {}


def _layer_sums_from_file(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Per-(config, category) layer counts and complexity sums of a layer feature file (cached per
    path, modification time and size)."""
    stat = Path(path).stat() if Path(path).exists() else None
    if stat is None:
        raise InputError(f"{path}: layer feature file not found")
    key = (str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _LAYER_CACHE:
        _LAYER_CACHE.clear()
        _LAYER_CACHE[key] = layer_sums(read_parquet(path))
    return _LAYER_CACHE[key]


def layer_sums(layer_features: pd.DataFrame) -> pd.DataFrame:
    """Per (model_id, mode, batch, category): ``n`` layer calls and the sums ``c_fw``, ``c_bw``."""
    require_columns(layer_features, LAYER_FEATURE_COLUMNS, what="layer feature")
    table = with_occurrence(layer_features)
    sums = table.groupby([*CONFIG_KEY, "category"], sort=True).agg(
        n=("c_fw", "size"), c_fw=("c_fw", "sum"), c_bw=("c_bw", "sum")
    )
    sums = sums.reset_index()
    return sums.astype({"batch": "int64", "n": "float64", "c_fw": "float64", "c_bw": "float64"})


# --------------------------------------------------------------------------- regressor


def _coefficient_dict(table: pd.DataFrame) -> dict[str, list[float]]:
    """``{category: [β0_fw, β1_fw, β0_bw, β1_bw, n_fw, n_bw]}`` (JSON-friendly)."""
    betas = COEFFICIENT_COLUMNS[1:5]
    return {
        str(r["category"]): [*(float(r[c]) for c in betas), int(r["n_layers"]), int(r["n_layers_bw"])]
        for r in table.to_dict("records")
    }


@register_regressor
class GiannitiLayerRegressor(Regressor):
    """Gianniti et al. per-layer model: the sum of per-layer linear models, times a fitted scale.

    ``fit(X, y)``: ``X`` needs ``model_id``, ``mode``, ``batch`` and ``device`` columns. The per-layer
    coefficients (:func:`fit_layer_coefficients`, one set per timed device) are fitted on the layer
    timings (``timings_path``: a path, glob or list) of the configs among X's rows: with
    ``timing_match="device"`` a timed device's timings of config k are used only when X has a row of
    config k on that device; ``"model"`` uses them whenever config k is in X on any device; ``"auto"``
    (default) is ``"device"`` unless that matches nothing (e.g. the timed device is held out), then
    ``"model"``; the choice is kept in ``timing_match_``. Then, for each training row, the layer sum
    ``s = Σ_l β0_c(l) + β1_c(l)·c_l`` over its layer calls (``layers_path``: the features' layer table;
    forward terms for inference, forward + backward for training) uses the coefficients of the row's
    device when its layers were timed, else those of ``reference_device_`` (the timed device with the
    most layer calls in the fit). The prediction is ``scale · s`` with ``scale = median(y / s)`` over the
    training rows of the same device and mode (``scale_by_mode=True``) or device; unseen keys fall back
    to the device's scale, then to the median over all training rows. With ``log_target=True`` the
    medians are geometric. A category missing from the coefficients uses the ``pooled`` fit; a
    direction never measured for a category (backward from inference-only timings) uses the pooled fit
    of that direction, else 0.

    Fitted state (JSON): ``coefficients_`` ({device: {category: [β0_fw, β1_fw, β0_bw, β1_bw, n_fw,
    n_bw]}}), ``reference_device_``, ``scales_`` ({"device\\x1fmode" or "device": scale}),
    ``global_scale_``, ``timing_match_``, ``n_timed_configs_``.
    """

    kind = "gianniti_layer"
    only_targets = ("latency_ms",)
    required_columns: ClassVar[tuple[str, ...]] = tuple(ROW_KEY)

    def __init__(
        self,
        layers_path: str = "results/features/layers.parquet",
        timings_path: str | Sequence[str] = "results/layers/*.parquet",
        timing_match: str = "auto",
        scale_by_mode: bool = True,
        log_target: bool = False,
    ) -> None:
        self.layers_path = layers_path
        self.timings_path = timings_path
        self.timing_match = timing_match
        self.scale_by_mode = scale_by_mode
        self.log_target = log_target

    # -- helpers

    @staticmethod
    def _key_tuples(frame: pd.DataFrame, with_device: bool) -> list[tuple[Any, ...]]:
        """(model_id, mode, batch[, device]) per row, as (str, str, int[, str])."""
        cols = [*CONFIG_KEY, "device"] if with_device else CONFIG_KEY
        keys = frame[cols].astype({"batch": "int64"}).astype({c: str for c in cols if c != "batch"})
        return list(keys.itertuples(index=False, name=None))

    def _select_timings(self, X: pd.DataFrame, timings: pd.DataFrame) -> tuple[pd.DataFrame, str]:
        if self.timing_match not in ("auto", "device", "model"):
            raise InputError(
                f"gianniti_layer: timing_match must be auto, device or model, got {self.timing_match!r}"
            )
        by_device = set(self._key_tuples(X, with_device=True))
        keys = self._key_tuples(timings, with_device=True)
        use = np.fromiter((k in by_device for k in keys), dtype=bool, count=len(keys))
        match = "device"
        if self.timing_match == "model" or (self.timing_match == "auto" and not use.any()):
            by_model = set(self._key_tuples(X, with_device=False))
            use = np.fromiter((k[:3] in by_model for k in keys), dtype=bool, count=len(keys))
            match = "model"
        return timings[use], match

    def _coefficients_for(self, device: str) -> dict[str, list[float]]:
        return self.coefficients_.get(device, self.coefficients_[self.reference_device_])

    def _sum_ms(self, sums: pd.DataFrame, coefficients: dict[str, list[float]], training: bool) -> float:
        pooled = coefficients.get(POOLED, [0.0, 0.0, 0.0, 0.0, 0, 0])
        total = 0.0
        columns = (sums["category"], sums["n"], sums["c_fw"], sums["c_bw"])
        for category, n, c_fw, c_bw in zip(*columns, strict=True):
            coef = coefficients.get(category, pooled)
            b0f, b1f = (coef[0], coef[1]) if math.isfinite(coef[0]) else (pooled[0], pooled[1])
            total += n * b0f + b1f * c_fw
            if training:
                b0b, b1b = (coef[2], coef[3]) if math.isfinite(coef[2]) else (pooled[2], pooled[3])
                if math.isfinite(b0b):
                    total += n * b0b + b1b * c_bw
        return total

    def _scale_key(self, device: str, mode: str) -> str:
        return f"{device}\x1f{mode}" if self.scale_by_mode else device

    def _summarise(self, ratios: np.ndarray) -> float:
        if self.log_target:
            return float(np.exp(np.median(np.log(ratios))))
        return float(np.median(ratios))

    # -- estimator API

    def layer_sum_ms(self, X: pd.DataFrame, layer_features: pd.DataFrame | None = None) -> np.ndarray:
        """Unscaled ``Σ_l t̂_l`` in ms per row of ``X`` (NaN for a config without layer rows).

        ``layer_features`` (a features layer table) replaces ``layers_path``, e.g. for a new model
        featurised on the fly.
        """
        check_is_fitted(self, "coefficients_")
        X = check_frame(X)
        require_columns(X, self.required_columns, what="gianniti_layer")
        if layer_features is not None:
            sums = layer_sums(layer_features)
        else:
            sums = _layer_sums_from_file(self.layers_path)
        groups = {key: g for key, g in sums.groupby(CONFIG_KEY, sort=False)}
        out = np.full(len(X), np.nan)
        rows = X[ROW_KEY].astype({"batch": "int64"}).itertuples(index=False, name=None)
        for i, (model_id, mode, batch, device) in enumerate(rows):
            g = groups.get((str(model_id), str(mode), int(batch)))
            if g is not None:
                out[i] = self._sum_ms(g, self._coefficients_for(str(device)), str(mode) == "training")
        return out

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> GiannitiLayerRegressor:
        X = check_frame(X)
        require_columns(X, self.required_columns, what="gianniti_layer")
        target = np.asarray(y, dtype=np.float64).ravel()
        if target.shape[0] != len(X):
            raise InputError(f"y has {target.shape[0]} values but X has {len(X)} rows")
        timings, match = self._select_timings(X, load_layer_timings(self.timings_path))
        features = read_parquet(self.layers_path)
        coefficients: dict[str, dict[str, list[float]]] = {}
        counts: dict[str, int] = {}
        for device, g in timings.groupby("device", sort=True):
            joined = join_layer_times(g, features)
            if not joined.empty:
                coefficients[str(device)] = _coefficient_dict(fit_joined(joined))
                counts[str(device)] = len(joined)
        if not coefficients:
            raise InputError(
                f"gianniti_layer: no layer timing in {self.timings_path!r} matches a training config "
                f"featurised in {self.layers_path!r}"
            )
        self.coefficients_ = coefficients
        self.reference_device_ = max(sorted(counts), key=lambda d: counts[d])
        self.timing_match_ = match
        self.n_timed_configs_ = int(timings[CONFIG_KEY].drop_duplicates().shape[0])
        self.feature_names_ = list(self.required_columns)
        self.n_features_in_ = len(self.feature_names_)
        self._fit_scales(X, target / self.layer_sum_ms(X))
        return self

    def _fit_scales(self, X: pd.DataFrame, ratios: np.ndarray) -> None:
        """``global_scale_`` and ``scales_`` (per device, and per device and mode) from the ratios of the
        training targets to their layer sums."""
        usable = np.isfinite(ratios) & (ratios > 0)
        if not usable.any():
            raise InputError(
                "gianniti_layer: no training row has a positive target and a featurised layer table"
            )
        devices = X["device"].astype(str).to_numpy()
        modes = X["mode"].astype(str).to_numpy()
        self.global_scale_ = self._summarise(ratios[usable])
        scales = {}
        for device in sorted(set(devices[usable])):
            rows = usable & (devices == device)
            scales[device] = self._summarise(ratios[rows])
            if self.scale_by_mode:
                for mode in sorted(set(modes[rows])):
                    scales[f"{device}\x1f{mode}"] = self._summarise(ratios[rows & (modes == mode)])
        self.scales_ = scales

    def predict(self, X: pd.DataFrame, layer_features: pd.DataFrame | None = None) -> np.ndarray:
        """Predicted end-to-end step time (the target's units) per row; a config without a layer table
        in ``layers_path`` raises :class:`InputError` naming it."""
        sums = self.layer_sum_ms(X, layer_features)
        missing = np.flatnonzero(~np.isfinite(sums))
        if missing.size:
            row = X.iloc[int(missing[0])]
            raise InputError(
                f"gianniti_layer: no layer table for model {row['model_id']} "
                f"({row['mode']}, batch {row['batch']}) "
                f"in {self.layers_path if layer_features is None else 'the given layer table'}"
                f"{f' and {missing.size - 1} more rows' if missing.size > 1 else ''}"
            )
        devices = X["device"].astype(str).to_numpy()
        modes = X["mode"].astype(str).to_numpy()
        factor = np.array([
            self.scales_.get(self._scale_key(d, m), self.scales_.get(d, self.global_scale_))
            for d, m in zip(devices, modes, strict=True)
        ], dtype=np.float64)  # fmt: skip
        return sums * factor

    def coefficients(self, device: str | None = None) -> pd.DataFrame:
        """The fitted coefficients of ``device`` (default: the reference device) in the paper's layout."""
        check_is_fitted(self, "coefficients_")
        device = self.reference_device_ if device is None else device
        if device not in self.coefficients_:
            raise InputError(
                f"gianniti_layer: no coefficients for device {device!r} "
                f"(timed devices: {', '.join(sorted(self.coefficients_))})"
            )
        rows = [[c, *v[:4], int(v[4]), int(v[5])] for c, v in self.coefficients_[device].items()]
        return pd.DataFrame(rows, columns=COEFFICIENT_COLUMNS)
