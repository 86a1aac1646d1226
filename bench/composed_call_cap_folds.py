"""Offline experiment: ``composed``'s per-call costs bounded per fold, from the fold's training configs only.

    python bench/composed_call_cap_folds.py RUN_DIR none|Q       # RUN_DIR: a finished `make run`; Q e.g. 0.1

Each kind's cap is the ``Q`` quantile, over the fold's training configs, of each config's fastest measured call of
that kind (the run's raw per-operator traces, ``results/traces/*/*.ops.parquet``); the pooled fit's count
coefficient is bounded by the largest cap; ``scipy.optimize.lsq_linear`` in place of ``nnls`` (``none``: the
workflow's fit, reproduced). Prints the test MAPE of ``composed`` and ``composed_blend`` per split, selection
splits first. ``bench/RESULTS.md``, "The per-call cap per fold": not adopted.
"""
import glob
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import numpy as np
import pandas as pd
from scipy.optimize import lsq_linear
import perfzoo.regressors.composed as C
from perfzoo.fitting import fit_split
from perfzoo.io import read_parquet
from perfzoo.features.op_times import classify

RUN = os.path.abspath(sys.argv[1]); R = os.path.join(RUN, "results")
Q = None if sys.argv[2] == "none" else float(sys.argv[2])
raw = pd.concat([pd.read_parquet(f) for f in glob.glob(os.path.join(R, "traces", "*", "*.ops.parquet"))])
calls = classify(raw)
FAST = calls.groupby(["model_id", "mode", "batch", "kind"])["time_ms"].min().unstack("kind")
data = read_parquet(f"{R}/dataset/dataset.parquet")
reg = C.ComposedRegressor(); NB = reg._n_base
NAMES = [*reg._base_terms(), *C.OP_FEATURES]
COUNT_IDX = np.array([i for i, n in enumerate(NAMES) if n.startswith("op_") and n.endswith("_count")])
CAPS = {}
orig_fit, orig_nn = C.ComposedRegressor._fit, C._nonnegative_fit

def fit(self, X, y, kind_times=None):
    CAPS.clear()
    if Q is not None:
        keys = pd.MultiIndex.from_arrays([X["model_id"], X["mode"], X["batch"]])
        fast = FAST.reindex(keys)
        CAPS.update({k: float(v) for k, v in fast.quantile(Q).items() if np.isfinite(v)})
    return orig_fit(self, X, y, kind_times)

def capped(A, y, weighting, prior=None, strength=0.0):
    if not CAPS or A.shape[1] not in (len(NAMES), NB + 3):
        return orig_nn(A, y, weighting, prior, strength)
    idx = COUNT_IDX if A.shape[1] == len(NAMES) else np.array([NB + 2])
    w = 1.0 / y if weighting == "relative" else np.ones_like(y)
    if strength > 0 and prior is not None:
        ea, ey = C._shrinkage_rows(A * w[:, None], prior, strength)
        A, y = np.vstack([A * w[:, None], ea]), np.concatenate([y * w, ey]); w = np.ones_like(y)
    scale = np.abs(A).max(axis=0); scale[scale == 0] = 1.0
    ub = np.full(A.shape[1], np.inf)
    caps = (np.array([CAPS.get(NAMES[i][3:-6], np.inf) for i in idx]) if A.shape[1] == len(NAMES)
            else np.array([max(CAPS.values())]))
    ub[idx] = caps * scale[idx]
    res = lsq_linear(A / scale * w[:, None], y * w, bounds=(np.zeros(A.shape[1]), ub))
    return res.x / scale

C.ComposedRegressor._fit = fit
C._nonnegative_fit = capped
out = {}
for split in ["family_monte_carlo", "stratified_kfold", "leave_one_family_out", "batch_extrapolation", "random"]:
    s = read_parquet(f"{R}/splits/{split}.parquet")
    for reg_name in ("composed", "composed_blend"):
        pred, models, notes = fit_split(data, s, "latency_ms", reg_name)
        t = pred[pred.set == "test"]
        out[(split, reg_name)] = round(float((abs(t.y_pred / t.y_true - 1)).mean() * 100), 2)
print("q", Q, "caps(us)", {k: round(v * 1000, 2) for k, v in CAPS.items()})
for k, v in out.items(): print(k, v)
