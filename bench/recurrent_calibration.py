"""Offline experiment: cost kind ``recurrent`` (which no zoo family runs) from measured single-layer LSTM steps
instead of ``composed``'s pooled fit, and predict an LSTM user model with it. Not adopted (``bench/RESULTS.md``,
"Kind recurrent calibrated on measured LSTM steps").

The calibration steps are the two builders below, measured with ``bench/user_model.py`` after a default run:

    python bench/user_model.py --results R --config C --model bench/recurrent_calibration.py:narrow --input 32,32 --out cal_narrow_32x32.csv
    python bench/user_model.py --results R --config C --model bench/recurrent_calibration.py:wide --input 32,64 --out cal_wide_32x64.csv
    python bench/user_model.py --results R --config C --model bench/recurrent_calibration.py:narrow --input 128,32 --out cal_narrow_128x32.csv
    python bench/user_model.py --results R --config C --model examples/keyword_lstm.py:build --input 98,40 --out lstm.csv
    python bench/recurrent_calibration.py R C lstm.csv cal_*.csv

For each fold model of ``composed`` (the run's fitted files, as ``perfzoo predict`` loads them), the kind's time
per FLOP, per byte and per call is fitted (non-negative least squares, relative weighting) to what each
calibration step measured beyond the model's cost of its other operators and overhead; ``perfzoo.predict`` then
predicts the user model with that cost in place of the pooled one (``ComposedRegressor._contributions`` wrapped in
this process only). The calibration files name their step by ``cal_<builder>_<input>.csv``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
NUM_CLASSES = 100  # the default config's zoo.num_classes: the measured training step draws targets below it
RECURRENT = ("op_recurrent_flops", "op_recurrent_bytes", "op_recurrent_count")


class LastState(nn.Module):
    """A one-layer LSTM over (steps, features) and a linear head on the last step's state."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.lstm(x)[0][:, -1])


def narrow() -> nn.Module:
    """32 features, 64 hidden units."""
    return LastState(32, 64)


def wide() -> nn.Module:
    """64 features, 256 hidden units."""
    return LastState(64, 256)


def main() -> None:
    from this_checkout import use_this_checkout

    use_this_checkout()
    import numpy as np
    import pandas as pd
    from scipy.optimize import nnls

    from perfzoo.features.op_kinds import COSTED_KINDS
    from perfzoo.prediction import predict
    from perfzoo.regressors import composed

    results, config, user_csv, *calibration_csvs = sys.argv[1:]
    kind = COSTED_KINDS.index("recurrent")

    def feature_row(ref: str, shape: str, mode: str, batch: int) -> tuple[pd.DataFrame, float]:
        record = predict(ref, batch=batch, input_shape=shape, mode=mode, devices=["cpu"], results=results,
                         config=config).record
        return pd.DataFrame([record["feature_rows"]["cpu"]]), record["devices"]["cpu"]["quantities"]["latency_ms"]["value"]

    rows, measured = [], []
    for path in calibration_csvs:
        _, builder, shape = Path(path).stem.split("_")
        for r in pd.read_csv(path).dropna(subset=["meas_latency_ms"]).itertuples():
            rows.append(feature_row(f"{Path(__file__).resolve()}:{builder}", shape.replace("x", ","), r.mode,
                                    int(r.batch))[0])
            measured.append(float(r.meas_latency_ms))
    steps, times = pd.concat(rows, ignore_index=True), np.array(measured)
    contributions, costs_of, printed = composed.ComposedRegressor._contributions, {}, set()

    def calibrated_cost(model: composed.ComposedRegressor) -> np.ndarray:
        key = b"".join(np.asarray(c, dtype=float).tobytes() for c in model.coef_.values())  # ids are reused
        if key not in costs_of:
            overhead, costs, _, _ = contributions(model, steps)
            rest = overhead + np.delete(costs, kind, axis=1).sum(axis=1)
            design = steps[list(RECURRENT)].to_numpy(float)
            scale = np.where(design.max(axis=0) > 0, design.max(axis=0), 1.0)
            coef, _ = nnls(design / scale / times[:, None], (times - rest) / times)
            costs_of[key] = coef / scale
            fitted = rest + design @ costs_of[key]
            line = (f"fold model: recurrent {coef[0] / scale[0] * 1e9:.2f} ms/GFLOP, {coef[1] / scale[1] * 1e6:.3f} "
                    f"ms/MB, {coef[2] / scale[2] * 1e3:.2f} us/call; calibration rows fitted to "
                    f"{100 * np.mean(np.abs(fitted / times - 1)):.1f} % MAPE")
            if line not in printed:  # the fold models are loaded again for every prediction
                printed.add(line)
                print(line)
        return costs_of[key]

    def with_calibrated_recurrent(model: composed.ComposedRegressor, X: pd.DataFrame) -> tuple:
        overhead, costs, unseen, traced = contributions(model, X)
        if unseen[:, kind].any():
            cost = np.nan_to_num(X[list(RECURRENT)].to_numpy(float)) @ calibrated_cost(model)
            costs[:, kind] = np.where(unseen[:, kind], cost, costs[:, kind])
        return overhead, costs, unseen, traced

    user = pd.read_csv(user_csv)
    before = [feature_row("examples/keyword_lstm.py:build", "98,40", r.mode, int(r.batch))[1] for r in user.itertuples()]
    composed.ComposedRegressor._contributions = with_calibrated_recurrent
    after = [feature_row("examples/keyword_lstm.py:build", "98,40", r.mode, int(r.batch))[1] for r in user.itertuples()]
    table = user[["config", "meas_latency_ms"]].assign(pooled=before, calibrated=after)
    for column in ("pooled", "calibrated"):
        table[f"{column}_err_pct"] = 100 * (table[column] / table["meas_latency_ms"] - 1)
    print(table.round(3).to_string(index=False))
    for column in ("pooled", "calibrated"):
        errors = table[f"{column}_err_pct"].abs()
        print(f"{column}: MAPE {errors.mean():.1f} %, {int((errors <= 20).sum())} of {len(errors)} within 20 %")


if __name__ == "__main__":
    main()
