"""Device-transfer regressor: predict a workload's time on a GPU from its times on other GPUs.

The model (fitted jointly, by ridge least squares, on the logarithm of the target)::

    log t(w, d) = u(w) + sum_jk B_jk h_j(d) z_k(w) + c . r(w, d) + delta_d(w)

- ``u(w)``: one effect per workload (``workload_col``, e.g. model name and image size), estimated from
  every training device that ran it. A workload seen on no training device gets ``u`` from a ridge
  regression of the fitted effects on its (logged, degree-2) workload features.
- ``h(d)``: logged hardware features of the device (peak tensor FLOP/s at the row's precision, memory
  bandwidth, ...), ``z(w)``: ``1`` and the standardised logged workload features (FLOPs, activation
  and weight bytes, arithmetic intensity ...). The products ``h_j z_k`` let the device ratio depend on
  the workload's roofline position: a compute-bound workload follows peak FLOP/s, a memory-bound one
  follows bandwidth. ``r(w, d)``: logged per-row features (e.g. batch size). Workload features that may
  be zero (``interaction_features``, e.g. operator FLOPs, bytes and calls per kind) join ``z`` in these
  products only, through sign-safe ``log1p`` and standardised; the workload effects, the few-shot
  correction and the reference regression below keep ``workload_features`` alone.
- ``delta_d(w) = a_d + b_d . z(w)``: few-shot calibration of a device from its own training rows,
  ridge-shrunk towards zero (``shot_alpha``), so a device with k = 5 or 20 measured configs gets a
  correction fitted on exactly those rows, and a device without rows (k = 0) gets none.

A few-shot device (at most ``few_shot_max_rows`` rows) is also predicted by *reference regression*, a
low-rank completion of the (workload x device) matrix of log times::

    log t(w, d) = log t(w, b) + c + sum_{e != b} beta_e (log t(w, e) - log t(w, b)) + gamma . z(w)

over the fully profiled devices ``e`` that ran ``w``, with ``b`` the reference device whose constant
offset fits the k shots best (leave-one-out), and ``beta, gamma`` ridge-shrunk towards zero, i.e. towards
"one constant factor on the best reference device"; the ridge strength is chosen from
``reference_alphas`` by the closed-form leave-one-out error on the k shots alone. One such model is
fitted per set of reference devices that ran a workload (a workload missing on one device uses the
others). The prediction is ``w`` times that plus ``1 - w`` times the model above (geometric blend); a
workload run on no fully profiled device gets the model above alone. ``w = reference_weight`` when
given; by default it is chosen from ``reference_weights`` by the inner leave-one-device-out below (the
training devices, each reduced to k shots, predicted by each blend): no row of the new device is used.

``u`` is removed by the within-workload transformation (each column and the target minus its mean over
the workload's rows), so ``B`` and ``c`` come from how times *differ between devices* for the same
workload: the fixed-effects estimator of a two-way panel model.

Intervals are split-conformal (Vovk, Gammerman and Shafer, "Algorithmic Learning in a Random World";
Lei et al., "Distribution-Free Predictive Inference for Regression") on log residuals: each fully
profiled training device is held out in turn (with k of its rows kept in training, to mimic a device
with k shots), the model is refitted on the rest, and the ``ceil((n+1)·level)/n`` quantile of the
absolute held-out log residuals is the half-width of the interval ``[ŷ·exp(-q), ŷ·exp(q)]``. The
held-out device is predicted exactly as a new device with k shots would be (reference regression
included), so the residuals mimic the test situation; this is done once per k a predicted device may
have (each few-shot device's row count, and 0 for a device not in training), and each device gets the
interval and blend weight of its own k. With at
least ``min_scaled_shots`` shots, each residual is divided by its device's error scale (the
leave-one-out error of the reference regression on its shots) and the new device's half-width is that
quantile times its own scale (normalised conformal scores), so a device whose shots the other devices
explain badly gets a wider interval.

A device without rows (k = 0) whose hardware features (``device_features`` and the anchor) lie outside
those of the fully profiled devices is predicted by extrapolation, which no held-out training device
calibrates: its interval is widened at both ends by the factor it lies outside (the largest over the
features), the rule :mod:`perfzoo.prediction.bounds` applies to a model outside the profiled range. (An
H200 predicted from four workstation GPUs, 2.25x beyond their peak FLOP/s, came out 2.3x too fast with a
1.39x half-width: bench/RESULTS.md.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import pandas as pd

from perfzoo.io import InputError
from perfzoo.regressors.base import Regressor, check_frame, register_regressor, require_columns, signed_log1p
from perfzoo.stats import conformal_halfwidth, mean_and_scale


def _ridge(A: np.ndarray, y: np.ndarray, penalty: np.ndarray) -> np.ndarray:
    """Solve ``min |A b - y|^2 + sum penalty_i b_i^2``."""
    gram = A.T @ A + np.diag(penalty)
    return np.linalg.solve(gram, A.T @ y)


def _group_means(values: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Mean of the rows of ``values`` per group code, shape ``(n_groups, columns)``."""
    sums = np.zeros((n_groups, values.shape[1]))
    np.add.at(sums, codes, values)
    counts = np.bincount(codes, minlength=n_groups).astype(np.float64)
    return sums / counts[:, None]


def _loo_ridge(A: np.ndarray, y: np.ndarray, penalty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ridge coefficients and the closed-form leave-one-out residuals ``e_i / (1 - H_ii)``."""
    inverse = np.linalg.pinv(A.T @ A + np.diag(penalty))
    coef = inverse @ A.T @ y
    leverage = np.einsum("ij,jk,ik->i", A, inverse, A)
    return coef, (y - A @ coef) / np.maximum(1.0 - leverage, 1e-9)


def _reference_design(T: np.ndarray, refs: Sequence[int], base: int, Z: np.ndarray) -> np.ndarray:
    """``[1, log t(base), log t(e) - log t(base) for e in refs other than base, z]`` (``T``: reference x
    rows); the coefficient of ``log t(base)`` is the slope's deviation from 1."""
    diffs = [T[e] - T[base] for e in refs if e != base]
    return np.column_stack([np.ones(len(Z)), T[base], *diffs, Z])


def _blends(roofline: np.ndarray, reference: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """``(1 - w) roofline + w reference`` per weight (columns); the roofline value where reference is NaN."""
    w = np.asarray(weights, dtype=np.float64)[None, :]
    blend = (1 - w) * roofline[:, None] + w * reference[:, None]
    return np.where(np.isnan(reference)[:, None], roofline[:, None], blend)


def _poly2(Z: np.ndarray) -> np.ndarray:
    """``[1, z, z_i z_j (i <= j)]`` for standardised workload features."""
    n, q = Z.shape
    cols = [np.ones((n, 1)), Z]
    cols += [(Z[:, i] * Z[:, j])[:, None] for i in range(q) for j in range(i, q)]
    return np.hstack(cols)


def _checked_columns(X: pd.DataFrame, columns: Sequence[str], positive: bool) -> np.ndarray:
    """The named columns as floats; a missing or non-finite value (or, with ``positive``, one <= 0) is an error
    naming the column, how many rows lack a valid value and the first of them."""
    out = np.empty((len(X), len(columns)))
    for j, name in enumerate(columns):
        values = pd.to_numeric(X[name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~(np.isfinite(values) & ((values > 0) if positive else True))
        if bad.any():
            first = X.index[np.flatnonzero(bad)[0]]
            raise InputError(
                f"device_transfer: column {name!r} needs {'positive ' if positive else ''}finite values; "
                f"{int(bad.sum())} rows lack one (first: row {first!r})"
            )
        out[:, j] = values
    return out


@register_regressor
class DeviceTransferRegressor(Regressor):
    """Workload effect + hardware x workload interactions + few-shot device correction (see module doc)."""

    kind = "device_transfer"
    _required_state: ClassVar[tuple[str, ...]] = (
        "feature_names_", "coef_", "z_mean_", "z_scale_", "h_mean_", "workload_ids_", "workload_effects_",
        "effect_coef_", "shot_devices_", "shot_coef_", "shot_refs_", "ref_devices_", "ref_residuals_",
        "ref_log_times_", "reference_models_", "x_mean_", "x_scale_", "hw_log_range_", "calibrations_",
    )

    def __init__(
        self,
        workload_features: Sequence[str] = ("flops", "activation_bytes", "weight_bytes"),
        device_features: Sequence[str] = ("hw_peak_gflops",),
        anchor_feature: str | None = "hw_mem_bw_gbs",
        row_features: Sequence[str] = ("batch",),
        interaction_features: Sequence[str] = (),
        workload_col: str = "model_id",
        device_col: str = "device",
        group_col: str | None = None,
        few_shot_max_rows: int = 50,
        interaction_degree: int = 1,
        alpha: float = 1.0,
        shot_alpha: float = 5.0,
        reference_weight: float | None = None,
        reference_weights: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
        reference_alphas: Sequence[float] = (1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e5),
        min_reference_shots: int = 3,
        min_scaled_shots: int = 10,
        interval_level: float = 0.9,
        log_target: bool = True,
    ) -> None:
        self.workload_features = workload_features
        self.device_features = device_features
        self.anchor_feature = anchor_feature
        self.row_features = row_features
        self.interaction_features = interaction_features
        self.workload_col = workload_col
        self.device_col = device_col
        self.group_col = group_col
        self.few_shot_max_rows = few_shot_max_rows
        self.interaction_degree = interaction_degree
        self.alpha = alpha
        self.shot_alpha = shot_alpha
        self.reference_weight = reference_weight
        self.reference_weights = reference_weights
        self.reference_alphas = reference_alphas
        self.min_reference_shots = min_reference_shots
        self.min_scaled_shots = min_scaled_shots
        self.interval_level = interval_level
        self.log_target = log_target

    # -- inputs

    def _logged(self, X: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
        """``log`` of the named columns; a missing, non-positive or non-finite value is an error."""
        return np.log(_checked_columns(X, columns, positive=True))

    def _interaction_logged(self, X: pd.DataFrame) -> np.ndarray:
        """Sign-safe ``log1p`` of the ``interaction_features`` (zero allowed); a missing or non-finite value
        is an error."""
        return signed_log1p(_checked_columns(X, self.interaction_features, positive=False))

    def _interaction_workload(self, X: pd.DataFrame, Z: np.ndarray) -> np.ndarray:
        """``Z`` and the standardised interaction features: the workload side of ``h_j z_k``."""
        return np.hstack([Z, (self._interaction_logged(X) - self.x_mean_) / self.x_scale_])

    def _anchor(self, X: pd.DataFrame) -> np.ndarray:
        """``log`` of the anchor column (its coefficient is fixed at -1), zeros without an anchor."""
        if self.anchor_feature is None:
            return np.zeros(len(X))
        return self._logged(X, [self.anchor_feature])[:, 0]

    def _hardware_logged(self, X: pd.DataFrame) -> np.ndarray:
        """``log`` of the device features and the anchor: the hardware whose profiled range bounds a transfer."""
        return self._logged(X, [*self.device_features, *([self.anchor_feature] if self.anchor_feature else [])])

    def _beyond_hardware_range(self, X: pd.DataFrame) -> np.ndarray:
        """Per row, how far (natural log, largest over the hardware features) its device lies outside the
        fully profiled devices' range; 0 inside."""
        h = self._hardware_logged(X)
        lo, hi = self.hw_log_range_
        return np.maximum(np.maximum(h - hi, lo - h), 0.0).max(axis=1, initial=0.0)

    def _parts(self, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Standardised workload features, centred device features (over the anchor) and row features."""
        Z = (self._logged(X, self.workload_features) - self.z_mean_) / self.z_scale_
        H = self._logged(X, self.device_features) - self._anchor(X)[:, None] - self.h_mean_
        R = self._logged(X, self.row_features)
        return Z, H, R

    def _design(self, Z: np.ndarray, H: np.ndarray, R: np.ndarray) -> np.ndarray:
        """Columns ``h_j z_k`` (``z`` = ``[1, z]`` or its degree-2 expansion) and the row features."""
        Z1 = _poly2(Z) if self.interaction_degree == 2 else np.hstack([np.ones((len(Z), 1)), Z])
        inter = (H[:, :, None] * Z1[:, None, :]).reshape(len(Z), -1)
        return np.hstack([inter, R])

    def _check(self, X: pd.DataFrame) -> None:
        cols = [*self.workload_features, *self.interaction_features, *self.device_features,
                *self.row_features, self.workload_col, self.device_col,
                *([self.anchor_feature] if self.anchor_feature else [])]
        require_columns(check_frame(X), cols, what="device_transfer")
        if not 0 < self.interval_level < 1:
            raise InputError(f"device_transfer: interval_level must lie in (0, 1), got {self.interval_level}")

    def _few_shot_mask(self, X: pd.DataFrame) -> np.ndarray:
        """Rows of devices with at most ``few_shot_max_rows`` rows: used only for their own calibration."""
        devices = X[self.device_col].astype(str)
        counts = devices.map(devices.value_counts())
        few = (counts <= self.few_shot_max_rows).to_numpy()
        return few if not few.all() else np.zeros(len(X), dtype=bool)

    # -- fit

    def _fit_core(self, X: pd.DataFrame, t: np.ndarray) -> None:
        """Fit ``B``/``c`` and workload effects on the fully profiled devices, then few-shot corrections."""
        full = ~self._few_shot_mask(X)
        Xf, tf = X[full], t[full]
        Zraw = self._logged(Xf, self.workload_features)
        self.z_mean_, self.z_scale_ = mean_and_scale(Zraw)
        self.x_mean_, self.x_scale_ = mean_and_scale(self._interaction_logged(Xf))
        self.h_mean_ = (self._logged(Xf, self.device_features) - self._anchor(Xf)[:, None]).mean(axis=0)
        hardware = self._hardware_logged(Xf)
        self.hw_log_range_ = np.vstack([hardware.min(axis=0), hardware.max(axis=0)])
        Z, H, R = self._parts(Xf)
        A = self._design(self._interaction_workload(Xf, Z), H, R)
        target = tf + self._anchor(Xf)
        ids, codes = np.unique(Xf[self.workload_col].astype(str).to_numpy(), return_inverse=True)
        A_mean = _group_means(A, codes, len(ids))
        t_mean = _group_means(target[:, None], codes, len(ids))[:, 0]
        self.coef_ = _ridge(A - A_mean[codes], target - t_mean[codes], np.full(A.shape[1], float(self.alpha)))
        self.workload_ids_ = [str(i) for i in ids]
        self.workload_effects_ = t_mean - A_mean @ self.coef_
        P = _poly2(_group_means(Z, codes, len(ids)))
        penalty = np.r_[0.0, np.full(P.shape[1] - 1, float(self.alpha))]
        self.effect_coef_ = _ridge(P, self.workload_effects_, penalty)
        self.shot_devices_, self.shot_refs_ = [], np.zeros(0, int)
        self.shot_coef_ = np.zeros((0, Z.shape[1] + 2))
        self.reference_models_ = []
        residual = t - self._predict_components(X)[0]
        self._store_reference_residuals(X[full], residual[full])
        self.ref_log_times_ = self._reference_table(X[full], tf)
        self._fit_shots(X, residual)
        self._fit_reference_models(X[~full], t[~full])

    def _store_reference_residuals(self, X: pd.DataFrame, residual: np.ndarray) -> None:
        """In-sample log residual of each (fully profiled device, workload): what hardware leaves out."""
        self.ref_devices_ = sorted(set(X[self.device_col].astype(str)))
        self.ref_residuals_ = self._reference_table(X, residual)

    def _reference_table(self, X: pd.DataFrame, values: np.ndarray) -> np.ndarray:
        """``values`` of the fully profiled rows as a (reference device x workload) table, NaN where unrun."""
        lookup = {w: i for i, w in enumerate(self.workload_ids_)}
        table = np.full((len(self.ref_devices_), len(self.workload_ids_)), np.nan)
        rows = X[self.device_col].astype(str).map({d: i for i, d in enumerate(self.ref_devices_)}).to_numpy()
        table[rows, X[self.workload_col].astype(str).map(lookup).to_numpy()] = values
        return table

    def _workload_index(self, X: pd.DataFrame) -> np.ndarray:
        """Column of each row's workload in the reference tables (-1: run on no fully profiled device)."""
        lookup = {w: i for i, w in enumerate(self.workload_ids_)}
        return np.array([lookup.get(w, -1) for w in X[self.workload_col].astype(str)], dtype=np.int64)

    def _reference_times(self, X: pd.DataFrame) -> np.ndarray:
        """Log times of each row's workload on every reference device (reference x rows; NaN where unrun)."""
        idx = self._workload_index(X)
        T = self.ref_log_times_[:, np.maximum(idx, 0)]
        T[:, idx < 0] = np.nan
        return T

    def _fit_reference_models(self, X: pd.DataFrame, t: np.ndarray) -> None:
        """Reference regression of every few-shot device, one model per set of reference devices."""
        if not len(X) or self.reference_weight == 0:
            return
        available = ~np.isnan(self.ref_log_times_)
        patterns = {tuple(np.flatnonzero(col)) for col in available.T} - {()}
        devices = X[self.device_col].astype(str).to_numpy()
        T, Z = self._reference_times(X), self._parts(X)[0]
        for d in sorted(set(devices)):
            rows = devices == d
            for refs in sorted(patterns):
                usable = rows & ~np.isnan(T[list(refs)]).any(axis=0)
                if usable.sum() >= max(self.min_reference_shots, 2):
                    model = self._fit_reference_model(T[:, usable], Z[usable], t[usable], refs)
                    self.reference_models_.append({"device": d, **model})

    def _fit_reference_model(self, T: np.ndarray, Z: np.ndarray, y: np.ndarray, refs: Sequence[int]) -> dict:
        """Best base device by leave-one-out constant offset, then the ridge strength by leave-one-out."""
        n = len(y)
        def loo_offset_error(e: int) -> float:
            gap = y - T[e]
            return float(np.mean(np.abs(gap - (gap.sum() - gap) / (n - 1))))
        base = min(refs, key=loo_offset_error)
        A = _reference_design(T, refs, base, Z)
        best = None
        for alpha in self.reference_alphas:
            coef, loo = _loo_ridge(A, y - T[base], np.r_[0.0, np.full(A.shape[1] - 1, float(alpha))])
            error = float(np.mean(np.abs(loo)))
            if best is None or error < best[0]:
                best = (error, coef)
        return {"refs": [int(e) for e in refs], "base": int(base), "coef": best[1], "n_shots": n,
                "loo_abs_error": best[0]}

    def _device_scales(self) -> dict[str, float]:
        """Leave-one-out mean absolute log error on its shots of each few-shot device's reference model
        (the one with the most reference devices, then the most shots): the device's error scale. Only
        models fitted on at least ``min_scaled_shots`` shots count (fewer give too noisy a scale)."""
        scales: dict[str, tuple[int, int, float]] = {}
        for m in self.reference_models_:
            if int(m["n_shots"]) < self.min_scaled_shots:
                continue
            key = (len(m["refs"]), int(m["n_shots"]), float(m["loo_abs_error"]))
            if m["device"] not in scales or key[:2] > scales[m["device"]][:2]:
                scales[m["device"]] = key
        return {d: key[2] for d, key in scales.items() if key[2] > 0}

    def _reference_predictions(self, X: pd.DataFrame, device: str) -> np.ndarray:
        """Reference-regression log times of ``device``'s rows (NaN where no model applies)."""
        T, Z = self._reference_times(X), self._parts(X)[0]
        out = np.full(len(X), np.nan)
        have = ~np.isnan(T)
        for model in self.reference_models_:
            if model["device"] != device:
                continue
            refs = list(model["refs"])
            rows = have[refs].all(axis=0) & (have.sum(axis=0) == len(refs))
            if rows.any():
                A = _reference_design(T[:, rows], refs, int(model["base"]), Z[rows])
                out[rows] = T[int(model["base"]), rows] + A @ np.asarray(model["coef"])
        return out

    def _reference_column(self, X: pd.DataFrame, ref: int) -> np.ndarray:
        """Residual of each row's workload on reference device ``ref`` (0 where it never ran there)."""
        if ref < 0:
            return np.zeros(len(X))
        lookup = {w: i for i, w in enumerate(self.workload_ids_)}
        idx = np.array([lookup.get(w, -1) for w in X[self.workload_col].astype(str)], dtype=np.int64)
        col = np.where(idx >= 0, self.ref_residuals_[ref, np.maximum(idx, 0)], np.nan)
        return np.nan_to_num(col, nan=0.0)

    def _fit_shots(self, X: pd.DataFrame, residual: np.ndarray) -> None:
        """Per-device ridge correction of the residuals: ``a_d + b_d . z`` (intercept lightly penalised)
        plus, for a few-shot device, ``g_d`` times the residual of the same workload on the reference
        device (the fully profiled device whose residuals fit the device's rows best)."""
        devices = X[self.device_col].astype(str).to_numpy()
        Z = (self._logged(X, self.workload_features) - self.z_mean_) / self.z_scale_
        Z1 = np.hstack([np.ones((len(Z), 1)), Z])
        penalty = np.r_[0.1, np.full(Z.shape[1], float(self.shot_alpha)), 1.0]
        self.shot_devices_ = sorted(set(devices))
        coefs, refs = [], []
        for d in self.shot_devices_:
            rows = devices == d
            candidates = [-1] if d in self.ref_devices_ else list(range(len(self.ref_devices_)))
            best = None
            for ref in candidates:
                A = np.hstack([Z1[rows], self._reference_column(X[rows], ref)[:, None]])
                coef = _ridge(A, residual[rows], penalty)
                sse = float(np.sum((A @ coef - residual[rows]) ** 2))
                if best is None or sse < best[0]:
                    best = (sse, ref, coef)
            refs.append(best[1])
            coefs.append(best[2])
        self.shot_coef_, self.shot_refs_ = np.vstack(coefs), np.array(refs, dtype=np.int64)

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> DeviceTransferRegressor:
        self._check(X)
        t = self._encode_target(y, len(X))
        self.feature_names_ = [*self.workload_features, *self.interaction_features, *self.device_features,
                               *self.row_features]
        self.n_features_in_ = len(self.feature_names_)
        self.calibrations_ = self._calibrations(X, t)
        self._fit_core(X, t)
        return self

    # the calibration of the largest number of shots (0 without a few-shot device): what a fully profiled
    # device is predicted with, and what a single calibration was before there was one per k
    @property
    def interval_halfwidth_(self) -> float:
        return float(self.calibrations_[-1]["halfwidth"])

    @property
    def scaled_halfwidth_(self) -> float:
        return float(self.calibrations_[-1]["scaled_halfwidth"])

    @property
    def reference_weight_(self) -> float:
        return float(self.calibrations_[-1]["weight"])

    def _calibrations(self, X: pd.DataFrame, t: np.ndarray) -> list[dict]:
        """One conformal calibration (:meth:`_conformal`) per number of shots a predicted device may have:
        each few-shot device's own row count, and 0 for a device not in training, in increasing order.
        A device is predicted with the calibration of its own k, so one partly profiled device in the
        data does not set the interval (and blend weight) of another with a different k."""
        few = self._few_shot_mask(X)
        counts = pd.Series(X[self.device_col].astype(str).to_numpy()[few]).value_counts()
        by_shots: dict[int, list[str]] = {0: []}
        for device, n in counts.items():
            by_shots.setdefault(int(n), []).append(str(device))
        out = []
        for k in sorted(by_shots):
            halfwidth, scaled, weight = self._conformal(X, t, k)
            out.append({"shots": k, "devices": sorted(by_shots[k]), "halfwidth": halfwidth,
                        "scaled_halfwidth": scaled, "weight": weight})
        return out

    def _row_calibrations(self, X: pd.DataFrame) -> list[dict]:
        """The calibration of each row's device: its own k for a few-shot device, k = 0 for a device not in
        training, the largest k for a fully profiled one (as a single calibration had it)."""
        by_device = {d: c for c in self.calibrations_ for d in c["devices"]}
        unseen, largest = self.calibrations_[0], self.calibrations_[-1]
        trained = set(self.shot_devices_)
        return [by_device.get(d) or (largest if d in trained else unseen) for d in X[self.device_col].astype(str)]

    def _candidate_weights(self) -> list[float]:
        return [float(self.reference_weight)] if self.reference_weight is not None else \
            [float(w) for w in self.reference_weights]

    def _conformal(self, X: pd.DataFrame, t: np.ndarray, shots: int) -> tuple[float, float, float]:
        """Inner leave-one-group-out absolute log residuals -> conformal half-width (inf if < 2 groups),
        the half-width of the residuals divided by their device's error scale (NaN without shots), and
        the blend weight (of :meth:`_candidate_weights`) with the lowest mean absolute inner residual.

        Groups are the fully profiled devices (or their ``group_col`` value, e.g. the GPU model when one
        GPU appears under two software versions). For a device with k = ``shots`` rows, each inner held-out
        group keeps k random rows of each of its devices in training, and each
        residual is also divided by the leave-one-out error of its device's reference model on those k
        rows (normalised conformal scores; Papadopoulos et al., "Normalized nonconformity measures for
        regression conformal prediction"), so that a device whose shots are fitted badly gets a wider
        interval (only with at least ``min_scaled_shots`` shots).
        """
        few = self._few_shot_mask(X)
        devices = X[self.device_col].astype(str).to_numpy()
        groups = X[self.group_col or self.device_col].astype(str).to_numpy()
        names = np.unique(groups[~few])
        weights = self._candidate_weights()
        if len(names) < 2:
            return math.inf, math.nan, weights[len(weights) // 2]
        rng = np.random.default_rng(0)
        residuals, scales = [], []
        for name in names:
            held = np.flatnonzero((groups == name) & ~few)
            kept = [rng.choice(rows, size=min(shots, len(rows) - 1), replace=False)
                    for d in np.unique(devices[held]) for rows in [held[devices[held] == d]]] if shots else []
            test = np.setdiff1d(held, np.concatenate(kept)) if kept else held
            train = np.setdiff1d(np.flatnonzero(~few), test)
            inner = DeviceTransferRegressor(**self.get_params())
            inner._fit_core(X.iloc[train], t[train])
            roofline, reference = inner._predict_components(X.iloc[test])
            residuals.append(np.abs(t[test, None] - _blends(roofline, reference, weights)))
            scales.append(pd.Series(devices[test]).map(inner._device_scales()).to_numpy(dtype=np.float64))
        residual, scale = np.concatenate(residuals), np.concatenate(scales)
        best = int(np.argmin(residual.mean(axis=0)))
        level, known = float(self.interval_level), np.isfinite(scale)
        return (conformal_halfwidth(residual[:, best], level),
                conformal_halfwidth(residual[known, best] / scale[known], level) if known.any() else math.nan,
                weights[best])

    # -- predict

    def _predict_components(self, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Log times by the roofline model (with few-shot corrections) and by reference regression (NaN
        where it does not apply)."""
        Z, H, R = self._parts(X)
        lookup = {w: i for i, w in enumerate(self.workload_ids_)}
        idx = np.array([lookup.get(w, -1) for w in X[self.workload_col].astype(str)], dtype=np.int64)
        effects = _poly2(Z) @ self.effect_coef_
        seen = idx >= 0
        effects[seen] = self.workload_effects_[idx[seen]]
        out = effects + self._design(self._interaction_workload(X, Z), H, R) @ self.coef_ - self._anchor(X)
        shot_rows = {d: i for i, d in enumerate(self.shot_devices_)}
        Z1 = np.hstack([np.ones((len(Z), 1)), Z])
        devices = X[self.device_col].astype(str).to_numpy()
        for d in set(devices) & set(shot_rows):
            rows = devices == d
            i = shot_rows[d]
            A = np.hstack([Z1[rows], self._reference_column(X[rows], int(self.shot_refs_[i]))[:, None]])
            out[rows] += A @ self.shot_coef_[i]
        reference = np.full(len(X), np.nan)
        for d in set(devices) & {m["device"] for m in self.reference_models_}:
            rows = np.flatnonzero(devices == d)
            reference[rows] = self._reference_predictions(X.iloc[rows], d)
        return out, reference

    def _predict_log(self, X: pd.DataFrame) -> np.ndarray:
        roofline, reference = self._predict_components(X)
        weights = np.array([c["weight"] for c in self._row_calibrations(X)], dtype=np.float64)
        out = np.empty(len(X))
        for weight in np.unique(weights):
            rows = weights == weight
            out[rows] = _blends(roofline[rows], reference[rows], [float(weight)])[:, 0]
        return out

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        self._check(X)
        return self._decode_target(self._predict_log(X))

    def predict_interval(self, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper ends of the conformal ``interval_level`` interval of every row."""
        if not self.log_target:
            raise InputError("device_transfer: intervals need log_target=True")
        self._check(X)
        z = self._predict_log(X)
        calibrations = self._row_calibrations(X)
        q = np.array([c["halfwidth"] for c in calibrations], dtype=np.float64)
        scaled = np.array([c["scaled_halfwidth"] for c in calibrations], dtype=np.float64)
        scale = X[self.device_col].astype(str).map(self._device_scales()).to_numpy(dtype=np.float64)
        known = np.isfinite(scale) & ~np.isnan(scaled)
        q[known] = scaled[known] * scale[known]
        unseen = ~X[self.device_col].astype(str).isin(self.shot_devices_).to_numpy()
        q[unseen] += self._beyond_hardware_range(X[unseen])
        return np.exp(z - q), np.exp(z + q)

    # -- persistence

    def _state_empty_by_definition(self) -> dict[str, np.ndarray]:
        """Without ``interaction_features`` their standardisation (``x_mean_``, ``x_scale_``) is of zero
        columns, as the fit computes it."""
        if self.interaction_features:
            return {}
        x_mean, x_scale = mean_and_scale(np.empty((1, 0)))
        return {"x_mean_": x_mean, "x_scale_": x_scale}
