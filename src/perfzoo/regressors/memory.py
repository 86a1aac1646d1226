"""Peak memory from the meta-device simulation of the step, calibrated per device on profiled rows."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

import numpy as np
import pandas as pd
from sklearn.linear_model import QuantileRegressor
from sklearn.utils.validation import check_is_fitted

from perfzoo.hardware import DEPTHWISE_TEMPORARY_FACTOR
from perfzoo.io import InputError
from perfzoo.regressors.base import (
    Regressor,
    check_frame,
    group_labels,
    numeric_matrix,
    register_regressor,
    require_columns,
)

MIB = 2.0**20


def term_contributions(D: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Per row of the design ``D`` and term, what the term adds with coefficients ``coef`` (one per term, or one
    row of them per row of ``D``): 0 where the row does not exercise the term, even when it has no coefficient
    (NaN); NaN where the row exercises a term without one, or a feature is missing."""
    return np.where(D == 0, 0.0, D * coef)


@register_regressor
class MemorySimRegressor(Regressor):
    """``peak_mem_mb ≈ a_t·[training] + b·heap_peak + (c + c_t·[training])·activation + d·√op_kinds
    + e·onednn_conv + f·cl_depthwise_weight``.

    The ``sim_*`` features come from :func:`perfzoo.features.memory.simulate_peak_memory` (bytes, used in
    MiB): the peak footprint of the profiled step's tensor storages, replayed on the meta device, in a model of
    glibc's heap (``sim_heap_peak_bytes``, :mod:`perfzoo.features.heap`: the live peak plus the freed blocks the
    heap keeps resident; on nine finished default runs it gave a lower error than the live peak on the selection
    splits, leave-one-family-out and batch extrapolation, bench/RESULTS.md, "A deterministic model of glibc's
    heap"), the activation and temporary bytes live at the live peak, the number of distinct operators the step
    ran and whether a convolution runs on oneDNN (PyTorch runs small ones on its own kernel). The square root of
    the operator count was chosen over the count itself after comparing both on the splits of the default CPU zoo
    (bench/memory_sim.py, on the former label that counted library code: kernels share it, so the code a
    step touches grows less than in proportion to its distinct operators). The
    coefficients are fitted per device (``group_col``) by median regression with weights ``1 / y``, which
    minimises the mean absolute percentage error on the training rows and is robust to outliers; a device
    with fewer than ``min_group_rows`` training rows (or not seen in training) uses the coefficients
    fitted on all rows.

    There is no constant term: a step that allocates nothing and runs no operator adds nothing to the
    label, which is measured above a baseline taken in the same process. With a free constant, the
    constant and the operator term are not identified by the few families of a zoo (a held-out family
    of small models then inherits tens of MiB of someone else's constant; bench/RESULTS.md, "memory_sim
    without a constant"). Training has its own activation coefficient ``c_t``: activations saved for the
    backward pass and freed during it leave the allocator's heap fragmented, so the resident set grows
    faster with them than in inference.

    What the calibration absorbs, on the CPU, whose label is the profiling worker's peak resident set without
    file-backed pages, above its baseline taken after ``gc`` and before the model is built
    (:class:`perfzoo.profiling.core.ResidentPeak`; library code mapped from disk is not in it, so the terms below
    count only memory the process allocates): ``a_t`` the autograd engine's and the backward and optimizer kernels'
    own state in training; ``e`` oneDNN's convolution primitives and their JIT-generated kernels (anonymous memory;
    a step whose convolutions PyTorch runs on its own im2col kernel creates none: a ``Conv1d`` over 12 x 256 at
    batch 1); ``d`` per-operator state that grows with the distinct operators a step runs (kernel caches, the
    allocator's arenas); ``c`` the workspaces that kernels allocate internally in proportion to the activations
    (convolution reorders, im2col buffers, GEMM packing) and the allocator's fragmentation; ``f`` the temporary
    oneDNN's backward-weights pass allocates for a depthwise convolution with a channels-last gradient (ConvNeXt's
    blocks; ``sim_cl_depthwise_weight_bytes``): its blocked layout pads each channel's kernel, about 257 times the
    weight bytes on AVX-512, 65 on AVX2, and on the default CPU zoo the fitted ``f`` comes out at about 200-260 on
    every fold that holds such a family (bench/RESULTS.md, "ConvNeXt's depthwise temporary as a memory_sim term").
    Where the device's hardware record has the factor measured (the column
    :data:`perfzoo.hardware.DEPTHWISE_TEMPORARY_FACTOR`, passed because :attr:`uses_device_calibration`; the
    hardware rule measures it on a CPU, :mod:`perfzoo.profiling.temporaries`), that row's ``f`` is the measured
    factor, not fitted: a zoo whose only such family is held out cannot identify ``f``, and the factor belongs to
    the device, not to the family. ``b`` stays near 1 (weights, gradients and optimizer state are allocated as
    simulated). A term no training row exercises (all zero, e.g. when the only family with such convolutions is held
    out, on a device without the measured factor) has no coefficient (NaN): its cost is unknown, so a row that
    needs it gets no prediction and :meth:`prediction_notes` names the term, while a row without it is priced as
    usual. On CUDA, whose label is ``max_memory_reserved``, the same terms absorb the caching allocator's rounding
    and cuBLAS/cuDNN workspaces. A row without simulated features (a model the simulation failed on) gets no
    prediction (NaN), never an imputed one. Only the ``peak_mem_mb`` target is meaningful. The model is additive in
    bytes, so ``log_target`` (a parameter of every regressor) must stay false. The fitted state records its term names
    (``terms_``); a file fitted with other terms is refused on loading.
    """

    kind = "memory_sim"
    only_targets = ("peak_mem_mb",)
    FEATURES: ClassVar[tuple[str, ...]] = ("sim_heap_peak_bytes", "sim_activation_bytes", "sim_op_kinds",
                                           "sim_onednn_conv", "sim_cl_depthwise_weight_bytes")
    TERMS: ClassVar[tuple[str, ...]] = ("training", "heap_peak_mib", "activation_mib", "training_activation_mib",
                                        "sqrt_op_kinds", "onednn_conv", "cl_depthwise_weight_mib")
    MEASURED_TERMS: ClassVar[dict[str, str]] = {"cl_depthwise_weight_mib": DEPTHWISE_TEMPORARY_FACTOR}
    """Terms whose coefficient a row takes from a measured device constant, where the row has one."""
    _required_state: ClassVar[tuple[str, ...]] = ("feature_names_", "terms_", "global_coef_", "group_coefs_")
    uses_device_calibration = True

    def __init__(self, group_col: str | None = "device", min_group_rows: int = 24,
                 log_target: bool = False) -> None:
        self.group_col = group_col
        self.min_group_rows = min_group_rows
        self.log_target = log_target

    def _design(self, X: pd.DataFrame) -> np.ndarray:
        """One row of :data:`TERMS` per row of ``X`` (NaN where a simulated feature is missing)."""
        X = check_frame(X)
        require_columns(X, [*self.FEATURES, "mode"], what="memory_sim")
        peak, activation, op_kinds, onednn_conv, cl_depthwise = numeric_matrix(X, self.FEATURES).T
        training = (X["mode"].astype(str) == "training").to_numpy(dtype=float)
        return np.column_stack([training, peak / MIB, activation / MIB, training * activation / MIB,
                                np.sqrt(op_kinds), onednn_conv, cl_depthwise / MIB])

    def _groups(self, X: pd.DataFrame) -> np.ndarray:
        return group_labels(X, self.group_col, "memory_sim group")

    def _measured(self, X: pd.DataFrame) -> np.ndarray:
        """Per row and term, the measured coefficient (:data:`MEASURED_TERMS`), NaN where the row has none (the
        column is absent, or NaN: a device without the measurement)."""
        out = np.full((len(X), len(self.TERMS)), np.nan)
        for term, column in self.MEASURED_TERMS.items():
            if column in X.columns:
                out[:, self.TERMS.index(term)] = numeric_matrix(X, [column])[:, 0]
        return out

    @staticmethod
    def median_fit(D: np.ndarray, y: np.ndarray, measured: np.ndarray | None = None) -> np.ndarray:
        """Coefficients minimising the sum of |y - D·c| / y (the MAPE of the training rows), where a finite
        ``measured[i, j]`` stands for ``c[j]`` on row ``i``; NaN for a term that is 0 (or measured) on every row
        (the fit cannot tell its cost)."""
        constants = np.full(D.shape, np.nan) if measured is None else measured
        known = np.isfinite(constants)
        offset = (D * np.where(known, constants, 0.0)).sum(axis=1)
        free = np.where(known, 0.0, D)
        exercised = (free != 0).any(axis=0)
        coef = np.full(D.shape[1], np.nan)
        if exercised.any():
            solver = QuantileRegressor(quantile=0.5, alpha=0.0, fit_intercept=False, solver="highs")
            coef[exercised] = solver.fit(free[:, exercised], y - offset, sample_weight=1.0 / y).coef_
        return coef

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> MemorySimRegressor:
        if self.log_target:
            raise InputError("memory_sim adds bytes (its fit already minimises the relative error); "
                             "log_target must be false")
        D, groups, measured = self._design(X), self._groups(X), self._measured(X)
        target = np.asarray(y, dtype=np.float64).ravel()
        if target.shape[0] != len(D):
            raise InputError(f"y has {target.shape[0]} values but X has {len(D)} rows")
        usable = np.isfinite(D).all(axis=1) & np.isfinite(target) & (target > 0)
        if usable.sum() < len(self.TERMS):
            raise InputError(f"memory_sim: {int(usable.sum())} training rows with simulated features and a "
                             f"positive target; it needs at least {len(self.TERMS)}")
        self.feature_names_ = list(self.FEATURES)
        self.terms_ = list(self.TERMS)
        self.n_features_in_ = len(self.FEATURES)
        self.global_coef_ = self.median_fit(D[usable], target[usable], measured[usable])
        self.group_coefs_ = {
            str(g): self.median_fit(D[rows], target[rows], measured[rows])
            for g in sorted(set(groups[usable])) if (rows := usable & (groups == g)).sum() >= self.min_group_rows
        }
        self.n_unusable_rows_ = int((~usable).sum())
        return self

    def coefficients(self, group: str) -> pd.Series:
        """The fitted coefficient of every term for ``group`` (the global ones for an unseen group; NaN for a term
        no training row exercised); a row with a measured constant uses it instead (:meth:`row_coefficients`)."""
        check_is_fitted(self, "global_coef_")
        self._check_terms()
        return pd.Series(self.group_coefs_.get(group, self.global_coef_), index=list(self.TERMS))

    def _check_terms(self) -> None:
        """Refuse coefficients fitted on other terms (a file written by another version of this class)."""
        if list(self.terms_) != list(self.TERMS):
            raise InputError(f"memory_sim fitted on terms {', '.join(self.terms_)}, not {', '.join(self.TERMS)} "
                             "(written by another perfzoo version?); refit it with `snakemake --cores all`")

    def row_coefficients(self, X: pd.DataFrame) -> np.ndarray:
        """Per row of ``X`` the coefficient of every term: its device's fitted ones, a measured constant where the
        row has one."""
        check_is_fitted(self, "global_coef_")
        self._check_terms()
        groups, measured = self._groups(X), self._measured(X)
        coef = np.array([self.group_coefs_.get(g, self.global_coef_) for g in groups], dtype=np.float64)
        coef = coef.reshape(len(X), len(self.TERMS))
        return np.where(np.isfinite(measured), measured, coef)

    def contributions(self, X: pd.DataFrame) -> np.ndarray:
        """Per row of ``X`` and term, the MiB the term adds: 0 where the row does not exercise it, NaN where a
        simulated feature is missing or the term has no coefficient (:meth:`unpriced_terms`)."""
        return term_contributions(self._design(X), self.row_coefficients(X))

    def unpriced_terms(self, X: pd.DataFrame) -> list[list[str]]:
        """Per row of ``X`` the terms it exercises that have no coefficient: no training row of its device's fit
        exercised them and the row has no measured constant for them."""
        D, coef = self._design(X), self.row_coefficients(X)
        unpriced = np.isfinite(D) & (D != 0) & ~np.isfinite(coef)
        return [[term for term, missing in zip(self.TERMS, row, strict=True) if missing] for row in unpriced]

    def prediction_notes(self, X: pd.DataFrame) -> list[str]:
        """One line per term that leaves rows of ``X`` without a prediction, for the prediction record."""
        rows = Counter(term for terms in self.unpriced_terms(X) for term in terms)
        measured = {term: f" and the device has no {column!r}" for term, column in self.MEASURED_TERMS.items()}
        return [f"memory_sim term {term!r} is exercised by {n} row(s) but by no training row{measured.get(term, '')}: "
                "its cost is unknown, no prediction" for term, n in rows.items()]

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return self.contributions(X).sum(axis=1)  # NaN where a feature is missing or a term is unpriced
