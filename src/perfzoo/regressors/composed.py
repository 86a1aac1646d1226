"""The composed predictor: a step's time as the sum of what its operators cost, plus a per-step overhead.

A config's step is traced on the meta device into aten operators (:mod:`perfzoo.features.ops`) and summed per
operator kind into ``op_<kind>_flops``, ``op_<kind>_bytes`` and ``op_<kind>_count``. Per device,

``t = (m + m_train·is_training)·n_module_calls + Σ_k (α_k·flops_k + β_k·bytes_k + γ_k·count_k)``
(``flops_k`` for the kinds that have FLOP formulas, :data:`perfzoo.features.ops.FLOP_KINDS`)

with every coefficient non-negative (``scipy.optimize.nnls`` on a column-scaled design): an operator never
makes a step faster, and the model stays additive in linear space, so it composes over any model's trace and
extrapolates in batch (FLOPs and bytes grow with batch, the per-call costs do not). ``α_k``
is a time per FLOP, ``β_k`` per byte moved to or from memory (the bytes an operator reads from cache are left
out, :data:`perfzoo.features.ops.CACHE_BYTES`: a recurrent layer's weights, read at every time step, are
not priced at memory bandwidth each time), ``γ_k`` per call (launch and dispatch cost).

Weighting
---------
``weighting="relative"`` (default) weights each row by ``1/y``, so the least squares minimises the squared
*relative* error, close to what MAPE averages; unweighted (``"none"``), the few slowest configs decide every
coefficient and small configs get large relative errors. ``"mape"`` minimises the mean absolute relative
error itself (a linear program, scipy's HiGHS); on the two default runs of ``bench/RESULTS.md`` it did not do
better than ``"relative"`` on one and better on the other, so the simpler least squares stays the default.

Shrinkage towards the pooled fit
--------------------------------
A kind that few training families run (attention, embedding, grouped convolutions) gets its cost from a
handful of configs, and with 40 free coefficients on ~80 rows the fit trades one kind's cost against
another's. ``shrinkage`` pulls each per-kind coefficient towards the pooled fit's coefficient of the same
statistic (one time per FLOP, per byte and per call for all kinds together, fitted first): a penalty
``strength·n·Σ_j (m_j·(c_j − pooled_j))²`` is added to the weighted least squares, ``m_j`` the mean
weighted contribution of a unit coefficient, so strength 1 prices moving a term's mean share of the step
as much as the same relative error on every row. 0 is the unshrunk fit, a large strength the pooled fit.
The default, :data:`DEFAULT_SHRINKAGE`, was chosen on the family Monte-Carlo and stratified k-fold splits of
two default runs (``bench/RESULTS.md``, "Composed with per-kind costs shrunk towards the pooled fit", which
says how and what it gives). ``shrinkage="cv"`` instead picks the strength per device from
:data:`SHRINKAGE_GRID` by an inner leave-one-model-out on the training rows (lowest MAPE of the held-out
models; needs ``model_id``); it picked no shrinkage for batch extrapolation on both runs, where the fixed
strength helps. ``weighting="mape"`` takes no shrinkage (``shrinkage=0``).

Per-byte costs shrunk towards the measured ones
-----------------------------------------------
Fitted on the end-to-end latency alone, the per-byte costs are shrunk towards the pooled per-byte cost, which
the zoo's many small operators set (their per-call costs land in it): about 3.7 GB/s on the CPU, where the
profile rule's per-operator timer measures 15-20 GB/s for operators that stream large tensors (VGG's optimizer
and fully connected layers: VGG held out was over-predicted by 74-95 %). With ``op_times_path`` (the ``op_times``
rule's table; the fit rule passes it), each kind's per-byte cost is instead shrunk towards the per-byte cost of
a non-negative fit of that kind's *measured* time on its FLOPs, bytes and calls in the training configs of the
device (:data:`MIN_TIMED_ROWS` or more configs that ran the kind; the fit of several devices together, used for a
device not seen in training, takes no device's measured costs); its per-FLOP and per-call costs are still
shrunk towards the pooled fit (the timer adds its own cost per call, and measured per-FLOP priors were worse on
every split). A device or kind without enough measured times keeps the pooled prior. The measured times are
labels read in ``fit`` only, never features. Compared side by side on six default runs in ``bench/RESULTS.md``,
"composed's per-byte costs shrunk towards the measured ones".

Per-call costs shrunk towards the device's tiny call
---------------------------------------------------
The zoo's operators at batch 1 touch 64 KB-1 MB each, so a fit on its latencies cannot tell a cost per call from
one per byte, and the pooled fit's per-call cost, the prior each ``γ_k`` was shrunk towards, is whatever that
trade-off gives: on one default run the leave-one-family-out folds put 14-27 µs on an elementwise call in eight
folds and 0.1 µs in the ninth, and a model of many small calls (a GRU's C++ loop: 1,283 elementwise calls per
inference step, the zoo at most 121) was predicted at three times its measured step. Where the device's hardware
record has the µs of a tiny call of the kind (``call_costs``, :mod:`perfzoo.profiling.call_costs`; the columns
:data:`perfzoo.hardware.CALL_COST_COLUMNS`, passed because :attr:`uses_device_calibration`), that is the kind's
per-call prior instead: what a call costs when its bytes and FLOPs are next to nothing is the device's, not the
zoo's. A kind or device without it keeps the pooled prior; the fit of several devices together takes no device's
(as for the per-byte priors). ``measured_call_kinds_`` names, per fit, the kinds that had one. Compared side by
side on a finished default run in ``bench/RESULTS.md``, "composed's per-call costs shrunk towards the device's
tiny call".

A term the training steps barely run
-----------------------------------
The penalty prices a coefficient's move by the term's mean share of the training steps, so a kind the training
configs run only in tiny amounts is barely held: with ViT's attention fused, the only softmax a zoo without its
transformer family runs is the loss's, on at most 51 KB, and one default run's fit put 17 ns per byte on it
(58 MB/s, 28 times its measured cost) at no visible cost in training, then over-predicted the transformer's
training steps, whose attention softmax reads 25 MB, by up to 3.6 times. ``min_prior_share`` (default
:data:`DEFAULT_MIN_PRIOR_SHARE`) prices every move as if the term made at least that share of the step at its
prior (``m_j ≥ min_prior_share / prior_j``): a term the training steps exercise keeps its own fit, one they
barely run stays near its prior. Chosen on the selection splits of five finished default runs (all terms,
0.1 %, against 0 and other floors; ``bench/RESULTS.md``, "A term the training steps barely run").

``step_terms`` names model features costed once per step, whatever the batch, each with an extra in
training (non-negative, like the rest). The default, :data:`DEFAULT_STEP_TERMS`, is ``n_module_calls``: each
``nn.Module`` call runs Python outside any operator, which a per-operator call cost would otherwise absorb and
then charge to every operator a recurrent layer loops over in C++. Other terms tried (``weight_bytes``,
``n_layers``, ...) are in ``bench/RESULTS.md``.

No constant
-----------
By default the step has no constant term (``constant_overhead=False``): a step that calls no module and runs no
operator costs nothing, and every per-step cost is one of the step terms or a per-call cost. With a constant
per step and another for training (``constant_overhead=True``, the former default), the fit cannot tell a
constant from the per-call costs on a zoo whose training steps all take 10 ms or more: it put 3.5 ms into the
training constant on one default run, and a small model's 2 ms training step was then predicted at 6 ms. On the
selection splits of three default runs the fit without the constant is better on all three, and so are
leave-one-family-out and batch extrapolation (``bench/RESULTS.md``, "Composed without a constant per step").

Kinds never seen in training
----------------------------
A kind with zero calls in every training row of a device has no fitted cost there; a row that uses it gets
that kind's cost from the pooled fit (all kinds summed into one flops, bytes and count), never zero, and
:meth:`ComposedRegressor.unseen_kinds` names the kind with its share of the predicted step.

Configs without an operator trace
---------------------------------
A row whose operator features are missing (the tracer could not follow an operator, ``op_trace_error``)
is predicted by the ``fallback`` end-to-end regressor fitted on the same training rows, and
:meth:`ComposedRegressor.fallback_rows` names the fallback and the reason; such training rows are left out
of the composed fit.

Fitted on measured operator times
---------------------------------
:class:`ComposedOpTimeRegressor` (``composed_optime``) fits each kind's cost on that kind's *measured* time
in the training configs' steps (``optime_<kind>_ms``, from the profile rule's per-operator timer,
:mod:`perfzoo.features.op_times`) instead of on the end-to-end latency alone, then a non-negative scale of
their sum (the timer's own cost) and the per-step overhead on the latency. It predicts exactly as
``composed`` does, from the operator features; the measured times are labels, read in ``fit`` only. It is not
the workflow's ``composed``: on the default zoo it was compared side by side (``bench/op_timing.py``,
``bench/RESULTS.md``, "Composed fitted on measured operator times").
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import linprog, nnls
from sklearn.utils.validation import check_is_fitted

from perfzoo.features.op_kinds import (
    COSTED_KINDS,
    OP_ERROR_COLUMN,
    OP_FEATURE_KINDS,
    OP_FEATURES,
    OP_STATS,
    OP_TIME_PREFIX,
)
from perfzoo.features.op_times import kind_time_labels
from perfzoo.hardware import CALIBRATION_COLUMNS, CALL_COST_COLUMNS
from perfzoo.io import InputError, read_parquet
from perfzoo.regressors.base import (
    REGISTRY,
    Regressor,
    check_frame,
    fit_on_complete_rows,
    group_labels,
    numeric_matrix,
    register_regressor,
    regressor_from_document,
    require_columns,
    sorted_importances,
    without_operator_features,
)

WEIGHTINGS = ("relative", "mape", "none")
ALL_DEVICES = "*"
"""Key of the fit on every device's rows together, used for a device not seen in training."""
OVERHEAD_TERMS = ("overhead", "overhead_training")
DEFAULT_SHRINKAGE = 5.0
"""Chosen on the selection splits (family_monte_carlo, stratified_kfold) of two default runs:
``bench/RESULTS.md``, "Composed with per-kind costs shrunk towards the pooled fit". On six later runs those splits
prefer 1 (with either prior) at a cost in batch extrapolation; not re-chosen yet (``bench/RESULTS.md``,
"composed's per-byte costs shrunk towards the measured ones")."""
DEFAULT_MIN_PRIOR_SHARE = 0.001
"""Share of the step a coefficient's term is priced at, at least, when it moves away from its prior (module
docstring, "A term the training steps barely run")."""
DEFAULT_STEP_TERMS = ("n_module_calls",)
"""A per-module-call cost: the Python each ``nn.Module`` call runs outside any operator. Chosen for that reason;
on the zoo's splits it is better on three default runs of five (``bench/RESULTS.md``, "Composed with a cost per
module call")."""
SHRINKAGE_GRID = (0.0, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
INNER_CV = "cv"
"""``shrinkage="cv"``: the strength from :data:`SHRINKAGE_GRID` with the lowest leave-one-model-out MAPE on
the training rows of each device."""
INNER_GROUP_COLUMN = "model_id"
COSTED_TIME_LABELS = tuple(f"{OP_TIME_PREFIX}{kind}_ms" for kind in COSTED_KINDS)
"""Measured time of each costed kind in one step (:func:`perfzoo.features.op_times.kind_time_labels`):
auxiliary labels that the per-byte priors (and :class:`ComposedOpTimeRegressor`'s per-kind models) are fitted on,
never features."""
TIME_LABEL_KEY = ("device", "model_id", "mode", "batch")

MIN_TIMED_ROWS = 3
"""Training configs with a measured time of a kind needed before that kind's measured per-byte cost is the prior
its fitted per-byte cost is shrunk towards (fewer: the pooled fit's)."""
# (operator features x kinds) and (operator features x statistics) indicator matrices
_KIND_OF = np.array([[OP_FEATURE_KINDS[f][0] == k for k in COSTED_KINDS] for f in OP_FEATURES], dtype=float)
_STAT_OF = np.array([[OP_FEATURE_KINDS[f][1] == st for st in OP_STATS] for f in OP_FEATURES], dtype=float)
_COUNT_COLUMN = np.array([OP_FEATURES.index(f"op_{k}_count") for k in COSTED_KINDS])
_IS_BYTES = np.array([OP_FEATURE_KINDS[f][1] == "bytes" for f in OP_FEATURES])


def _nonnegative_fit(A: np.ndarray, y: np.ndarray, weighting: str, prior: np.ndarray | None = None,
                     strength: float = 0.0, min_share: float = 0.0) -> np.ndarray:
    """Non-negative coefficients of ``y ≈ A·c`` under ``weighting`` (see the module docstring), each column
    of ``A`` scaled to unit maximum first for conditioning; with ``strength > 0``, each coefficient whose
    ``prior`` is finite is pulled towards it (:func:`_shrinkage_rows`)."""
    w = 1.0 / y if weighting == "relative" else np.ones_like(y)
    if strength > 0 and prior is not None:
        extra_A, extra_y = _shrinkage_rows(A * w[:, None], prior, strength, min_share)
        A, y = np.vstack([A * w[:, None], extra_A]), np.concatenate([y * w, extra_y])
        weighting, w = "none", np.ones_like(y)
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    B = A / scale
    if weighting == "mape":  # min Σ|y - B·c|/y, c ≥ 0: a linear program over (c, over, under)
        n, p = B.shape
        cost = np.concatenate([np.zeros(p), 1.0 / y, 1.0 / y])
        equality = np.hstack([B, -np.eye(n), np.eye(n)])
        result = linprog(cost, A_eq=equality, b_eq=y, bounds=(0, None), method="highs")
        if not result.success:
            raise InputError(f"composed: the least-relative-deviation fit failed ({result.message})")
        return result.x[:p] / scale
    coef, _ = nnls(B * w[:, None], y * w, maxiter=50 * A.shape[1])
    return coef / scale


def _shrinkage_rows(weighted: np.ndarray, prior: np.ndarray, strength: float, min_share: float = 0.0
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Penalty rows ``√(strength·n)·m_j·(c_j − prior_j)`` for the columns with a finite prior, appended to
    the weighted least squares: ``m_j`` is the mean weighted contribution of a unit coefficient of column
    ``j``, so the penalty prices moving a term's mean share of the step by as much as the same relative
    residual on every row (``strength`` 1: equal), and at least ``min_share / prior_j`` (a term priced as at
    least that share of the step at its prior; module docstring). ``weighted`` is the design with the fit's row
    weights applied."""
    columns = np.flatnonzero(np.isfinite(prior))
    mean_share = weighted.mean(axis=0)
    if min_share > 0:  # no floor where the prior is 0 or NaN (a per-step term)
        mean_share = np.maximum(mean_share, np.divide(min_share, prior, out=np.zeros_like(prior), where=prior > 0))
    rows = np.zeros((len(columns), weighted.shape[1]))
    rows[np.arange(len(columns)), columns] = np.sqrt(strength * len(weighted)) * mean_share[columns]
    return rows, rows[np.arange(len(columns)), columns] * prior[columns]


def _measured_kind_costs(ops: np.ndarray, kind_times: np.ndarray, weighting: str, min_rows: int
                         ) -> tuple[np.ndarray, list[str]]:
    """(per operator feature, the cost fitted on its kind's measured time: NaN for a kind not fitted; the kinds
    fitted) of ``ops`` (rows x operator features) and ``kind_times`` (rows x costed kinds): per kind, a
    non-negative fit of its measured time on its FLOPs, bytes and calls, over the rows that ran it and timed it
    above 0 (a NaN time: not timed), when there are ``min_rows`` or more."""
    costs = np.full(ops.shape[1], np.nan)
    fitted = []
    for j, kind in enumerate(COSTED_KINDS):
        timed = (ops[:, _COUNT_COLUMN[j]] > 0) & (np.nan_to_num(kind_times[:, j]) > 0)
        if timed.sum() < max(min_rows, 1):
            continue
        columns = _KIND_OF[:, j] > 0
        costs[columns] = _nonnegative_fit(ops[timed][:, columns], kind_times[timed, j], weighting)
        fitted.append(kind)
    return costs, fitted


@dataclass(frozen=True)
class _Design:
    """The design of the rows of a frame: ``matrix`` ([base terms..., op features...] per row, a missing value
    as 0), the rows with every operator feature (``has_ops``) and each row's present ``step_terms`` features
    (``has_step_terms``, rows x terms)."""

    matrix: np.ndarray
    has_ops: np.ndarray
    has_step_terms: np.ndarray

    @property
    def composable(self) -> np.ndarray:
        """Rows with a complete operator trace and every ``step_terms`` feature (the others: the fallback)."""
        return self.has_ops & self.has_step_terms.all(axis=1)


@dataclass(frozen=True)
class _FitData:
    """One fit's row-aligned arrays: the design matrix, the target in original units and the measured time of
    each costed kind (labels, never features; None without ``op_times_path``)."""

    design: np.ndarray
    target: np.ndarray
    kind_times: np.ndarray | None = None
    call_costs: np.ndarray | None = None
    """Per row and costed kind, the row's device's measured tiny call in ms (NaN: not measured)."""

    def subset(self, rows: np.ndarray) -> _FitData:
        """The same arrays for ``rows`` only (a boolean mask)."""
        times = None if self.kind_times is None else self.kind_times[rows]
        calls = None if self.call_costs is None else self.call_costs[rows]
        return _FitData(self.design[rows], self.target[rows], times, calls)


def _call_costs(X: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """(``X`` without the devices' measured constants, per row and costed kind the row's device's measured tiny
    call in ms: NaN for a kind not timed, a device without the measurement or a frame without the columns)."""
    costs = np.full((len(X), len(COSTED_KINDS)), np.nan)
    for j, kind in enumerate(COSTED_KINDS):
        column = CALL_COST_COLUMNS.get(kind)
        if column in X.columns:
            costs[:, j] = numeric_matrix(X, [column])[:, 0] / 1e3  # µs -> ms, the target's unit
    return X.drop(columns=[c for c in CALIBRATION_COLUMNS if c in X.columns]), costs


@register_regressor
class ComposedRegressor(Regressor):
    """Per-device sum of per-kind operator costs plus an overhead, non-negative, in linear space."""

    kind = "composed"
    only_targets = ("latency_ms",)
    uses_operator_features = True
    uses_device_calibration = True
    """Its per-call costs are shrunk towards the device's measured tiny call (module docstring)."""
    needs_measured_times = False
    """Refuse an ``op_times_path`` table without measured times (else: the pooled prior, module docstring)."""

    def __init__(self, group_col: str | None = "device", weighting: str = "relative", fallback: str = "linear",
                 log_target: bool = False, step_terms: tuple[str, ...] = DEFAULT_STEP_TERMS,
                 shrinkage: float | str = DEFAULT_SHRINKAGE, constant_overhead: bool = False,
                 op_times_path: str | None = None, min_prior_share: float = DEFAULT_MIN_PRIOR_SHARE) -> None:
        self.group_col = group_col
        self.weighting = weighting
        self.fallback = fallback
        self.log_target = log_target
        self.step_terms = step_terms
        self.shrinkage = shrinkage
        self.constant_overhead = constant_overhead
        self.op_times_path = op_times_path
        self.min_prior_share = min_prior_share

    # -- design

    @staticmethod
    def _training_flag(X: pd.DataFrame) -> np.ndarray:
        """1 for a training step, 0 for inference (the dataset's and the predictor's ``is_training``)."""
        require_columns(X, ["is_training"], what="composed")
        flag = numeric_matrix(X, ["is_training"])[:, 0]
        if np.isnan(flag).any():
            raise InputError(f"composed: is_training missing in {int(np.isnan(flag).sum())} row(s)")
        return flag

    @property
    def _n_base(self) -> int:
        """Columns of the design before the operator features."""
        return len(self._base_terms())

    def _base_terms(self) -> tuple[str, ...]:
        """The per-step terms before the operator features: the constants (with ``constant_overhead``), then each
        of ``step_terms`` and its training extra."""
        constants = OVERHEAD_TERMS if self.constant_overhead else ()
        return (*constants, *(f"{c}{suffix}" for c in self.step_terms for suffix in ("", "_training")))

    def _design(self, X: pd.DataFrame) -> _Design:
        """The design of ``X``'s rows (:class:`_Design`)."""
        ops = numeric_matrix(X, list(OP_FEATURES))
        flag = self._training_flag(X)
        base = [np.ones(len(X)), flag] if self.constant_overhead else []
        has_step_terms = np.ones((len(X), 0), dtype=bool)
        if self.step_terms:
            require_columns(X, list(self.step_terms), what="composed step_terms (model features)")
            per_step = numeric_matrix(X, list(self.step_terms))
            has_step_terms = np.isfinite(per_step)
            for column in np.nan_to_num(per_step).T:
                base += [column, column * flag]
        matrix = np.column_stack([*base, np.nan_to_num(ops)])
        return _Design(matrix, has_ops=~np.isnan(ops).any(axis=1), has_step_terms=has_step_terms)

    def _pooled(self, design: np.ndarray) -> np.ndarray:
        """[base terms..., Σ flops, Σ bytes, Σ count] of a design matrix."""
        nb = self._n_base
        return np.column_stack([design[:, :nb], design[:, nb:] @ _STAT_OF])

    def _groups(self, X: pd.DataFrame) -> np.ndarray:
        return group_labels(X, self.group_col, "composed group", pooled=ALL_DEVICES)

    # -- fit

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> ComposedRegressor:
        X, kind_times = self._split_time_labels(check_frame(X))
        self._fit(X, y, kind_times)
        return self

    def _split_time_labels(self, X: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray | None]:
        """(``X`` without any measured-time column, the measured time of each costed kind per row: NaN for a
        config without per-op times, None without ``op_times_path`` and without such columns in ``X``)."""
        if self.op_times_path is None and not any(c in X.columns for c in COSTED_TIME_LABELS):
            return X, None
        X = self._with_time_labels(X)
        kind_times = numeric_matrix(X, list(COSTED_TIME_LABELS))
        return X.drop(columns=[c for c in X.columns if str(c).startswith(OP_TIME_PREFIX)]), kind_times

    def _with_time_labels(self, X: pd.DataFrame) -> pd.DataFrame:
        """``X`` with the measured per-kind times of its configs joined from ``op_times_path`` (the
        ``op_times`` rule's table), unless ``X`` carries them already; a config without per-op times gets
        NaN (never zero)."""
        if self.op_times_path is None or all(c in X.columns for c in COSTED_TIME_LABELS):
            return X.assign(**{c: np.nan for c in COSTED_TIME_LABELS if c not in X.columns})
        require_columns(X, list(TIME_LABEL_KEY), what=f"{self.kind} with op_times_path")
        path = Path(self.op_times_path)
        times = _time_labels(str(path), path.stat().st_mtime_ns if path.exists() else 0)
        if times is None:
            if self.needs_measured_times:
                raise InputError(f"{self.kind}: {path} has no measured per-op times")
            return X.assign(**{c: np.nan for c in COSTED_TIME_LABELS})
        times = times.reindex(_label_key(X))
        return X.assign(**{c: times[c].to_numpy(dtype=float) for c in COSTED_TIME_LABELS})

    def _fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray, kind_times: np.ndarray | None = None) -> None:
        """Fit on ``X`` and ``y``; ``kind_times`` (rows x costed kinds, :class:`_FitData`) reach
        :meth:`_group_costs` only."""
        X, call_costs = _call_costs(check_frame(X))
        require_columns(X, OP_FEATURES, what="operator feature (from the features rule)")
        if self.weighting not in WEIGHTINGS:
            raise InputError(f"composed: unknown weighting {self.weighting!r} (expected one of {WEIGHTINGS})")
        self._check_penalty()
        if self.fallback not in REGISTRY or self.fallback == self.kind:
            raise InputError(f"composed: fallback {self.fallback!r} is not another registered regressor")
        target = self._encode_target(y, len(X))
        if self.log_target:
            target = np.exp(target)  # the sum of operator costs lives in original units
        if (target <= 0).any():
            raise InputError("composed: targets must be positive")
        designed = self._design(X)
        design, traced = designed.matrix, designed.composable
        data = _FitData(design, target, kind_times, call_costs)
        if not traced.any():
            raise InputError("composed: no training row has an operator trace (op_* features all missing)")
        self.feature_names_ = [*self._base_terms(), *OP_FEATURES]
        self.n_features_in_ = len(self.feature_names_)
        self.n_untraced_train_ = int((~traced).sum())
        groups = self._groups(X)
        if self.shrinkage == INNER_CV:
            require_columns(X, [INNER_GROUP_COLUMN], what="composed with shrinkage 'cv' (inner groups)")
            inner_groups = X[INNER_GROUP_COLUMN].astype(str).to_numpy()
        else:
            inner_groups = np.zeros(len(X))
        self.coef_, self.pooled_coef_, self.seen_kinds_, self.shrinkage_ = {}, {}, {}, {}
        self.measured_prior_kinds_, self.measured_call_kinds_ = {}, {}
        devices = sorted(set(groups[traced]))
        for group in [ALL_DEVICES, *devices]:
            rows = traced & ((groups == group) if group != ALL_DEVICES else True)
            strength = (self._inner_cv_strength(data.subset(rows), inner_groups[rows])
                        if self.shrinkage == INNER_CV else float(self.shrinkage))
            # the fit of several devices together (a device not seen in training) takes no device's measured costs
            self.coef_[group], self.pooled_coef_[group], self.seen_kinds_[group] = self._group_costs(
                group, data, rows, strength, measured_priors=group != ALL_DEVICES or len(devices) == 1)
            self.shrinkage_[group] = strength
        # never on the operator features; a row it would fill in a median for is left out (none complete: refused)
        self.fallback_model_ = fit_on_complete_rows(REGISTRY[self.fallback], _fallback_inputs(X), y)[0]

    def _group_costs(self, group: str, data: _FitData, rows: np.ndarray, strength: float, measured_priors: bool
                     ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(coefficients, pooled coefficients, kinds seen) of one group's ``rows``, fitted on the latency; the
        per-byte priors are the measured ones (where ``data`` has measured kind times) only if ``measured_priors``."""
        own = data.subset(rows)
        if not measured_priors:
            own = _FitData(own.design, own.target)
        pooled, prior, measured = self._prior(own)
        self.measured_prior_kinds_[group] = measured
        self.measured_call_kinds_[group] = [k for k, c in zip(COSTED_KINDS, _measured_calls(own), strict=True)
                                            if np.isfinite(c)]
        coef = _nonnegative_fit(data.design[rows], data.target[rows], self.weighting, prior, strength,
                                self.min_prior_share)
        calls = data.design[rows][:, self._n_base:][:, _COUNT_COLUMN].sum(axis=0)
        return coef, pooled, [k for k, n in zip(COSTED_KINDS, calls, strict=True) if n > 0]

    def _check_penalty(self) -> None:
        number = isinstance(self.shrinkage, int | float) and not isinstance(self.shrinkage, bool)
        valid = self.shrinkage == INNER_CV or (number and self.shrinkage >= 0)
        if not valid or (self.shrinkage != 0 and self.weighting == "mape"):
            raise InputError(f"composed: shrinkage {self.shrinkage!r} must be a number >= 0 or {INNER_CV!r}, "
                             "and 0 with weighting 'mape'")
        share = self.min_prior_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
            raise InputError(f"composed: min_prior_share {share!r} must be a number in [0, 1)")

    def _prior(self, data: _FitData) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(pooled coefficients, the value each coefficient is shrunk towards: NaN for the per-step terms, the
        kinds whose per-byte prior is their measured per-byte cost) of one fit's rows (module docstring)."""
        nb = self._n_base
        pooled = _nonnegative_fit(self._pooled(data.design), data.target, self.weighting)
        prior = np.concatenate([np.full(nb, np.nan), _STAT_OF @ pooled[nb:]])
        calls = _measured_calls(data)
        prior[nb + _COUNT_COLUMN[np.isfinite(calls)]] = calls[np.isfinite(calls)]
        if data.kind_times is None:
            return pooled, prior, []
        costs, measured = _measured_kind_costs(data.design[:, nb:], data.kind_times, self.weighting, MIN_TIMED_ROWS)
        per_byte = _IS_BYTES & np.isfinite(costs)
        prior[nb:][per_byte] = costs[per_byte]
        return pooled, prior, measured

    def _inner_cv_strength(self, data: _FitData, models: np.ndarray) -> float:
        """The shrinkage strength of :data:`SHRINKAGE_GRID` with the lowest MAPE when each model's rows are
        predicted by a fit on the other models' rows (kinds the others never ran costed by the pooled fit);
        the first of the grid with one model only."""
        if len(set(models)) < 2:
            return SHRINKAGE_GRID[0]
        design, target = data.design, data.target
        nb = self._n_base
        predicted = np.zeros((len(SHRINKAGE_GRID), len(target)))
        for model in sorted(set(models)):
            held, train = models == model, models != model
            pooled, prior, _ = self._prior(data.subset(train))  # once per held-out model
            never_ran = design[train][:, nb:][:, _COUNT_COLUMN].sum(axis=0) == 0
            of_unseen = _KIND_OF[:, never_ran].any(axis=1)
            for i, strength in enumerate(SHRINKAGE_GRID):
                coef = _nonnegative_fit(design[train], target[train], self.weighting, prior, strength,
                                        self.min_prior_share)
                coef[nb:] = np.where(of_unseen, _STAT_OF @ pooled[nb:], coef[nb:])
                predicted[i, held] = design[held] @ coef
        errors = np.mean(np.abs(predicted - target) / target, axis=1)
        return SHRINKAGE_GRID[int(np.argmin(errors))]

    # -- predict

    def _contributions(self, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(cost of the per-step terms per row, cost per row and kind, unseen-kind mask, traced mask)."""
        check_is_fitted(self, "coef_")
        self._check_terms()
        X = check_frame(X)
        require_columns(X, OP_FEATURES, what="operator feature (from the features rule)")
        designed = self._design(X)
        design, traced = designed.matrix, designed.composable
        groups = self._groups(X)
        nb = self._n_base
        overhead = np.zeros(len(X))
        costs = np.zeros((len(X), len(COSTED_KINDS)))
        unseen = np.zeros((len(X), len(COSTED_KINDS)), dtype=bool)
        for i, group in enumerate(groups):
            key = group if group in self.coef_ else ALL_DEVICES
            coef, pooled = np.asarray(self.coef_[key]), np.asarray(self.pooled_coef_[key])
            ops = design[i, nb:]
            overhead[i] = design[i, :nb] @ coef[:nb]
            never_seen = np.array([k not in self.seen_kinds_[key] for k in COSTED_KINDS])
            unseen[i] = never_seen & (ops[_COUNT_COLUMN] > 0)
            of_unseen = _KIND_OF[:, unseen[i]].any(axis=1)
            per_feature = np.where(of_unseen, ops * (_STAT_OF @ pooled[nb:]), ops * coef[nb:])
            costs[i] = per_feature @ _KIND_OF
        return overhead, costs, unseen, traced

    def _check_terms(self) -> None:
        """Refuse coefficients fitted on other per-step terms (a file written by another version of this class, or
        with other parameters)."""
        expected = [*self._base_terms(), *OP_FEATURES]
        if list(self.feature_names_) != expected:
            extra = sorted(set(self.feature_names_) ^ set(expected))
            raise InputError(f"{self.kind} fitted on other terms than its parameters give ({', '.join(extra)}; "
                             "written by another perfzoo version?); refit it with `snakemake --cores all`")

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        overhead, costs, _, traced = self._contributions(X)
        out = overhead + costs.sum(axis=1)
        if not traced.all():
            out[~traced] = self.fallback_model_.predict(_fallback_inputs(X.loc[~traced]))
        return out

    def unseen_kinds(self, X: pd.DataFrame) -> pd.DataFrame:
        """One row per (row of ``X``, operator kind never seen in training): ``row``, ``kind``, ``share`` of
        the predicted step (that kind's cost, estimated with the pooled coefficients, over the prediction)."""
        overhead, costs, unseen, traced = self._contributions(X)
        total = overhead + costs.sum(axis=1)
        rows, kinds = np.nonzero(unseen & traced[:, None])
        return pd.DataFrame({"row": X.index[rows], "kind": np.asarray(COSTED_KINDS)[kinds],
                             "share": costs[rows, kinds] / total[rows]})

    def missing_features(self, X: pd.DataFrame) -> list[list[str]]:
        """Per row of ``X``, the features it lacks that its prediction needs: none for a row composed from its
        operator trace, the fallback regressor's missing features for the others."""
        composable = self._design(check_frame(X)).composable
        fallback = self.fallback_model_.missing_features(_fallback_inputs(X))
        return [[] if ok else names for ok, names in zip(composable, fallback, strict=True)]

    def fallback_rows(self, X: pd.DataFrame) -> pd.DataFrame:
        """Rows predicted by the fallback regressor (no operator trace, or a ``step_terms`` feature
        missing): ``row``, ``fallback``, ``reason``."""
        designed = self._design(check_frame(X))
        untraced = ~designed.composable
        return pd.DataFrame({"row": X.index[untraced], "fallback": self.fallback,
                             "reason": self._untraced_reasons(X, designed)[untraced]})

    def _untraced_reasons(self, X: pd.DataFrame, designed: _Design) -> np.ndarray:
        """Why each row cannot be composed: the tracer's error, else the missing operator or step features
        (``designed``: ``X``'s design)."""
        errors = (X[OP_ERROR_COLUMN].fillna("").astype(str).to_numpy() if OP_ERROR_COLUMN in X.columns
                  else np.full(len(X), ""))
        missing_step = [", ".join(t for t, ok in zip(self.step_terms, row, strict=True) if not ok)
                        for row in designed.has_step_terms]
        reasons = [error or ("operator features missing" if not ops else f"{terms} missing")
                   for error, ops, terms in zip(errors, designed.has_ops, missing_step, strict=True)]
        return np.array(reasons, dtype=object)

    def prediction_notes(self, X: pd.DataFrame) -> list[str]:
        """One line per unseen kind and per fallback row of ``X``, for the prediction record."""
        notes = [f"operator kind {r.kind!r} never seen in training: {100 * r.share:.0f} % of the predicted step "
                 "(costed by the pooled fit)" for r in self.unseen_kinds(X).itertuples()]
        notes += [f"no operator trace ({r.reason}); predicted by the fallback {r.fallback!r}"
                  for r in self.fallback_rows(X).itertuples()]
        return list(dict.fromkeys(notes))

    def coefficients(self, group: str = ALL_DEVICES) -> pd.Series:
        """Fitted coefficients of one device (``"*"``: all devices), named by term."""
        check_is_fitted(self, "coef_")
        return pd.Series(np.asarray(self.coef_[group], dtype=float), index=self.feature_names_, name=group)

    def _importances(self) -> pd.Series:
        return sorted_importances(self.feature_names_, np.abs(np.asarray(self.coef_[ALL_DEVICES])))

    # -- persistence: the fallback regressor is stored as its own document

    _payload_attrs = ("fallback_model_",)

    def _dump_payload(self) -> dict[str, str]:
        return {"encoding": "perfzoo-regressor",
                "data": json.dumps(self.fallback_model_.to_document(), sort_keys=True)}

    def _load_payload(self, payload: dict[str, str] | None, source: str) -> None:
        if not payload or payload.get("encoding") != "perfzoo-regressor":
            raise InputError(f"{source}: composed regressor without its fallback regressor")
        self.fallback_model_ = regressor_from_document(json.loads(payload["data"]), f"{source} (fallback)")


def _measured_calls(data: _FitData) -> np.ndarray:
    """Per costed kind, the measured tiny call (ms) of the one device of ``data``'s rows; NaN for a kind whose rows
    do not all carry the same measurement (no device measured it, or the rows are of devices that differ: no one
    device's cost stands for them)."""
    if data.call_costs is None or not len(data.call_costs):
        return np.full(len(COSTED_KINDS), np.nan)
    first = data.call_costs[0]
    return np.where((data.call_costs == first).all(axis=0), first, np.nan)  # NaN != NaN: a missing value stays NaN


def _fallback_inputs(X: pd.DataFrame) -> pd.DataFrame:
    """``X`` as the fallback end-to-end regressor sees it: no operator features, no device's measured constants."""
    return without_operator_features(X).drop(columns=[c for c in CALIBRATION_COLUMNS if c in X.columns])


@functools.lru_cache(maxsize=4)
def _time_labels(path: str, mtime_ns: int) -> pd.DataFrame | None:
    """Measured per-kind times of the ``op_times`` table at ``path``, indexed by :data:`TIME_LABEL_KEY` (None when
    it has none): read once per file version, not once per fold (``mtime_ns`` keys the version)."""
    labels = kind_time_labels(read_parquet(path))
    if labels.empty:
        return None
    times = labels.set_axis(_label_key(labels))[list(COSTED_TIME_LABELS)]
    return times[~times.index.duplicated()]


def _label_key(frame: pd.DataFrame) -> pd.MultiIndex:
    """(device, model_id, mode, batch) of each row, with one dtype per level whatever the table's."""
    return pd.MultiIndex.from_arrays([frame[c].astype(float) if c == "batch" else frame[c].astype(str)
                                      for c in TIME_LABEL_KEY])


@register_regressor
class ComposedOpTimeRegressor(ComposedRegressor):
    """The composed predictor with each kind's cost fitted on *measured* operator times.

    Per device and kind ``k``: ``t_k ≈ α_k·flops_k + β_k·bytes_k + γ_k·count_k``, non-negative, fitted on the
    measured time of kind ``k`` in the training configs' steps (``optime_<kind>_ms``, rows with a trace and
    per-op times); a kind no training config ran is costed by the fit of all kinds' time pooled. Then the
    end-to-end latency ``y ≈ s·Σ_k t̂_k + o + o_train·is_training`` (non-negative): ``s`` absorbs the
    per-operator timer's own cost and ``o`` the per-step overhead outside any operator. Prediction is the
    parent's (``coef_`` holds ``s·(α, β, γ)`` and the overheads), so it never reads a measured time: the
    ``optime_`` columns are read in :meth:`fit` only.
    """

    kind = "composed_optime"
    needs_measured_times = True

    def __init__(self, group_col: str | None = "device", weighting: str = "relative", fallback: str = "linear",
                 log_target: bool = False, op_times_path: str | None = None) -> None:
        super().__init__(group_col, weighting, fallback, log_target, step_terms=(), shrinkage=0.0,
                         constant_overhead=True, op_times_path=op_times_path)

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> ComposedOpTimeRegressor:
        X = check_frame(X)
        if self.op_times_path is None:
            require_columns(X, COSTED_TIME_LABELS, what="measured per-kind time (results/features/op_times.parquet)")
        X, kind_times = self._split_time_labels(X)
        self._fit(X, y, kind_times)  # the checks and the fallback never see a label
        return self

    def _group_costs(self, group: str, data: _FitData, rows: np.ndarray, strength: float, measured_priors: bool
                     ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """The per-kind fits on the measured kind times of the group's rows that have them, whatever
        ``measured_priors``; a group without any (a GPU) keeps the end-to-end fit."""
        if data.kind_times is None:  # fit passes them; a caller that does not is a programming error
            raise InputError("composed_optime: fitted without the measured per-kind times (kind_times)")
        timed = rows & ~np.isnan(data.kind_times).any(axis=1)
        if timed.any():
            return self._fit_group(data.design, data.kind_times, data.target, timed, rows)
        if group == ALL_DEVICES:
            raise InputError("composed_optime: no training row has both an operator trace and per-op times")
        return super()._group_costs(group, data, rows, strength, measured_priors)

    def _fit_group(self, design: np.ndarray, kind_times: np.ndarray, target: np.ndarray, timed: np.ndarray,
                   traced: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(coefficients, pooled coefficients, kinds seen) of one device: per-kind fits on the measured kind
        times of the ``timed`` rows, then the scale and overhead on every ``traced`` row's latency."""
        all_design, all_target = design[traced], target[traced]
        nb = self._n_base
        ops, kind_times = design[timed, nb:], kind_times[timed]
        costs, seen = _measured_kind_costs(ops, kind_times, self.weighting, min_rows=1)
        per_feature = np.nan_to_num(costs, nan=0.0)  # placeholder: a kind not in ``seen`` is costed by the pooled fit
        total = kind_times.sum(axis=1)
        pooled_ops = _nonnegative_fit(ops @ _STAT_OF, total, self.weighting)
        predicted = all_design[:, nb:] @ per_feature
        scale_and_overhead = _nonnegative_fit(np.column_stack([predicted, all_design[:, :nb]]), all_target,
                                              self.weighting)
        scale, overhead = scale_and_overhead[0], scale_and_overhead[1:]
        return (np.concatenate([overhead, scale * per_feature]),
                np.concatenate([overhead, scale * pooled_ops]), seen)
