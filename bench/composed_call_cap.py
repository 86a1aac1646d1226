"""Offline experiment: ``composed`` with an upper bound on every kind's per-call cost (µs), on a finished run.

    PYTHONPATH=src python bench/composed_call_cap.py RUN_DIR [CAP_US | measured | folds:Q]     # RUN_DIR: a finished `make run`

Refits ``composed`` (the workflow's defaults) on the run's dataset and splits with each count coefficient
(``op_<kind>_count``, and the pooled fit's) bounded to ``[0, CAP_US]`` (``scipy.optimize.lsq_linear`` in
place of ``nnls``; no cap: the workflow's fit, reproduced exactly), prints the test MAPE per split, then fits
on every usable row and predicts the two user models' configs (their feature rows as
``perfzoo.predict(...).record["feature_rows"]`` gives them) against the measurements of ``bench/user_model.py``
in ``MEASURED`` (run K's bench, same machine). Not a method of the
workflow: the cap is a number chosen by hand (``bench/RESULTS.md``, "A cap on composed's per-call cost").

``measured``: each kind's cap is the 1 % quantile of its call times in the run's per-operator traces, over every
config (held-out families too). ``folds:Q``: a cap the workflow could use, from each fit's training configs only:
the ``Q`` quantile, over those configs, of each config's fastest call of the kind; ``composed_blend`` is scored
beside ``composed`` (``bench/RESULTS.md``, "The per-call cap per fold"). Either way the pooled fit's count
coefficient is bounded by the largest kind's cap.
"""
import os
import sys

import numpy as np
import pandas as pd
from scipy.optimize import lsq_linear

import perfzoo.regressors.composed as C
from perfzoo.fitting import fit_split
from perfzoo.io import read_parquet

from perfzoo.prediction import predict

RUN = os.path.abspath(sys.argv[1])
R = os.path.join(RUN, "results")
USERS = [("examples/sequence_model.py:build", "12,256", "gru"), ("examples/keyword_lstm.py:build", "98,40", "lstm")]


def user_rows() -> pd.DataFrame:
    """The feature rows ``perfzoo predict`` builds for each (user model, mode, batch) on the run's cpu device."""
    here, rows = os.getcwd(), []
    os.chdir(RUN)
    try:
        for model, shape, name in USERS:
            for mode in ("inference", "training"):
                for b in (1, 8, 32):
                    p = predict(model, batch=b, input_shape=shape, mode=mode, devices=["cpu"], results="results",
                                config="config.yaml")
                    rows.append({**p.record["feature_rows"]["cpu"], "user": name, "umode": mode, "ubatch": b})
    finally:
        os.chdir(here)
    return pd.DataFrame(rows)

data = read_parquet(f'{R}/dataset/dataset.parquet')
# the features the workflow joins in the fit rule? check op columns
orig = C._nonnegative_fit
CAP_ARG = sys.argv[2] if len(sys.argv) > 2 else None
FOLD_QUANTILE = float(CAP_ARG.split(":", 1)[1]) if CAP_ARG and CAP_ARG.startswith("folds:") else None
CAP_US = (None if CAP_ARG is None else "folds" if FOLD_QUANTILE is not None
          else CAP_ARG if CAP_ARG == "measured" else float(CAP_ARG))


def measured_calls() -> pd.DataFrame:
    """Every measured call of the run's per-operator traces, with its operator kind."""
    import glob

    from perfzoo.features.op_times import classify

    return classify(pd.concat([pd.read_parquet(f)
                               for f in glob.glob(os.path.join(R, "traces", "*", "*.ops.parquet"))]))


def measured_caps() -> dict[str, float]:
    """Per operator kind, the 1 % quantile of its measured call times in the run's per-operator traces (µs):
    the fixed cost of a call with next to no data. Over every config of the run (held-out families too)."""
    calls = measured_calls()
    return (calls["time_ms"] * 1000).groupby(calls["kind"]).quantile(0.01).to_dict()


def fastest_calls() -> pd.DataFrame:
    """Per config (model_id, mode, batch) and kind, its fastest measured call (µs)."""
    calls = measured_calls()
    return (calls.groupby(["model_id", "mode", "batch", "kind"])["time_ms"].min() * 1000).unstack("kind")


def fit_with_fold_caps(self, X, y, kind_times=None):
    """``composed``'s fit with :data:`KIND_CAPS` set from the training configs of ``X`` (``folds:Q``)."""
    KIND_CAPS.clear()
    fastest = FASTEST.reindex(pd.MultiIndex.from_arrays([X["model_id"], X["mode"], X["batch"]]))
    KIND_CAPS.update({k: float(v) for k, v in fastest.quantile(FOLD_QUANTILE).items() if np.isfinite(v)})
    return ORIGINAL_FIT(self, X, y, kind_times)


def capped(A, y, weighting, prior=None, strength=0.0):
    if CAP_US is None or (CAP_US == "folds" and not KIND_CAPS) or A.shape[1] not in (len(CURRENT_NAMES), NB + 3):
        return orig(A, y, weighting, prior, strength)
    idx = COUNT_IDX if A.shape[1] == len(CURRENT_NAMES) else np.array([NB + 2])
    w = 1.0 / y if weighting == "relative" else np.ones_like(y)
    if strength > 0 and prior is not None:
        extra_A, extra_y = C._shrinkage_rows(A * w[:, None], prior, strength)
        A, y = np.vstack([A * w[:, None], extra_A]), np.concatenate([y * w, extra_y])
        w = np.ones_like(y)
    scale = np.abs(A).max(axis=0); scale[scale == 0] = 1.0
    B = A / scale
    ub = np.full(A.shape[1], np.inf)
    if CAP_US in ("measured", "folds"):
        if A.shape[1] == len(CURRENT_NAMES):
            caps = np.array([KIND_CAPS.get(CURRENT_NAMES[i][3:-6], np.inf) for i in idx])
        else:  # the pooled fit: every kind together, bounded by the largest kind's cap
            caps = np.array([max(KIND_CAPS.values())])
        ub[idx] = caps / 1000.0 * scale[idx]
    else:
        ub[idx] = CAP_US / 1000.0 * scale[idx]  # latency in ms: cap in ms per call, scaled
    res = lsq_linear(B * w[:, None], y * w, bounds=(np.zeros(A.shape[1]), ub))
    return res.x / scale

reg = C.ComposedRegressor()
NB = reg._n_base
CURRENT_NAMES = [*reg._base_terms(), *C.OP_FEATURES]
COUNT_IDX = np.array([i for i, n in enumerate(CURRENT_NAMES) if n.startswith('op_') and n.endswith('_count')])
KIND_CAPS = measured_caps() if CAP_US == "measured" else {}
print("caps (µs):", {k: round(v, 2) for k, v in KIND_CAPS.items()})
C._nonnegative_fit = capped
if CAP_US == "folds":
    FASTEST, ORIGINAL_FIT = fastest_calls(), C.ComposedRegressor._fit
    C.ComposedRegressor._fit = fit_with_fold_caps
out = {}
for split in ['leave_one_family_out', 'batch_extrapolation', 'random', 'family_monte_carlo', 'stratified_kfold']:
    s = read_parquet(f'{R}/splits/{split}.parquet')
    for regressor in ('composed', 'composed_blend') if CAP_US == "folds" else ('composed',):
        pred, models, notes = fit_split(data, s, 'latency_ms', regressor)
        t = pred[pred.set == 'test']
        out[split if regressor == 'composed' else f'{split} {regressor}'] = round(
            float((abs(t.y_pred / t.y_true - 1)).mean() * 100), 2)
print('cap', CAP_ARG if CAP_US == "folds" else CAP_US, out)

# user models: fit on every usable row, predict the GRU and LSTM configs
from perfzoo.dataset.build import finite_target_rows
from perfzoo.fitting import featurised_rows, regressor_inputs
MEASURED = {('gru','inference',1):3.9,('gru','inference',8):9.6,('gru','inference',32):29.3,('gru','training',1):29.1,('gru','training',8):51.6,('gru','training',32):127.7,
            ('lstm','inference',1):1.1,('lstm','inference',8):2.9,('lstm','inference',32):9.9,('lstm','training',1):3.4,('lstm','training',8):10.1,('lstm','training',32):54.9}
usable = finite_target_rows(data, 'latency_ms') & featurised_rows(data)
train = data[usable]
model = C.ComposedRegressor().fit(regressor_inputs(train, 'all', True), train['latency_ms'])
u = user_rows()
pred = model.predict(u)
u['pred'] = pred; u['meas'] = [MEASURED[(r.user, r.umode, r.ubatch)] for r in u.itertuples()]
u['err'] = 100 * (u.pred / u.meas - 1)
print(u[['user','umode','ubatch','meas','pred','err']].round(1).to_string())
print(u.groupby('user').err.apply(lambda s: s.abs().mean()).round(1).to_dict())
g = model.coefficients('cpu') if hasattr(model, 'coefficients') else None
if g is not None:
    print({k: round(v*1000, 2) for k, v in g.items() if k.endswith('_count') and v > 0})
