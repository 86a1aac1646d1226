"""Benchmark: ``device_transfer``'s blend weight for a few-shot GPU chosen on that GPU's own shots.

``device_transfer`` blends its roofline model and its reference regression with one weight, chosen by an inner
leave-one-GPU-out on the training GPUs (each reduced to k shots): no row of the new GPU is used. The
alternative scored here: the weight whose blend of the two components has the lowest leave-one-out error on
the new GPU's k shots (each shot predicted by the core refitted without it; the reference regression's and
the few-shot correction's shots are those of the full fit, so the estimate is slightly optimistic).
Per held-out GPU, k = 5 and 20, five draws: MAPE of the inner-LOGO weight, of the shots' weight, and of every
fixed weight (the last two read the test labels: what a choice would be worth, not a method).

Usage: ``PYTHONPATH=src python bench/blend_weight_loo.py [--dirs DIR ...] [--few-shot-max-rows N] [GPU ...]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
import device_transfer as dt  # noqa: E402 - the benchmark's loader, shots and GPU table

from perfzoo.regressors.transfer import DeviceTransferRegressor, _blends  # noqa: E402
from perfzoo.stats import mape  # noqa: E402

WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def shots_weight(reg: DeviceTransferRegressor, train: pd.DataFrame, shots: pd.DataFrame) -> float:
    """The weight of :data:`WEIGHTS` with the lowest leave-one-out mean absolute log error on the shots (the
    inner-LOGO weight where fewer than 3 shots have a reference prediction)."""
    roof, ref = [], []
    for i in shots.index:
        inner = DeviceTransferRegressor(**{**reg.get_params(), "reference_weight": None})
        rest = train.drop(index=i)
        inner._fit_core(rest, np.log(rest["latency_ms"].to_numpy()))
        a, b = inner._predict_components(shots.loc[[i]])
        roof.append(a[0])
        ref.append(b[0])
    y, roof, ref = np.log(shots["latency_ms"].to_numpy()), np.array(roof), np.array(ref)
    ok = ~np.isnan(ref)
    if ok.sum() < 3:
        return reg.reference_weight_
    errors = [np.mean(np.abs(y[ok] - ((1 - w) * roof[ok] + w * ref[ok]))) for w in WEIGHTS]
    return WEIGHTS[int(np.argmin(errors))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpus", nargs="*", help="GPUs to hold out (default: every GPU)")
    parser.add_argument("--dirs", nargs="+", type=Path, default=[Path("../shared/data/timm-benchmark")])
    parser.add_argument("--few-shot-max-rows", type=int, default=50)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    data = dt.load(*args.dirs)
    rows = []
    for gpu in args.gpus or sorted(data["gpu"].unique()):
        held = data["gpu"] == gpu
        for k in (5, 20):
            for seed in range(5):
                shots = dt.shot_rows(data, held, k, np.random.default_rng(seed))
                train, test = data[~held | data.index.isin(shots)], data[held & ~data.index.isin(shots)]
                reg = dt.fit_method(train, "device_transfer", dt.Setup(few_shot_max_rows=args.few_shot_max_rows))
                roof, ref = reg._predict_components(test)
                y = test["latency_ms"].to_numpy()
                score = {w: mape(y, np.exp(_blends(roof, ref, [w])[:, 0])) for w in WEIGHTS}
                w_shots = shots_weight(reg, train, data.loc[shots])
                rows.append({"gpu": gpu, "k": k, "weight (inner LOGO)": reg.reference_weight_,
                             "weight (shots)": w_shots, "inner LOGO": mape(y, np.exp(_blends(
                                 roof, ref, [reg.reference_weight_])[:, 0])),
                             "shots": score[w_shots], **{f"w = {w}": v for w, v in score.items()}})
                print(rows[-1], flush=True)
    table = pd.DataFrame(rows).groupby(["gpu", "k"]).mean().reset_index()
    print(table.round(2).to_markdown(index=False))
    print(f"{time.perf_counter() - start:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
