"""``composed``'s per-call costs shrunk towards the device's measured tiny call, side by side with the pooled prior.

    PYTHONPATH=src python bench/call_prior.py RUN_DIR [--scale S] [--user MODEL INPUT CSV ...]

RUN_DIR is a finished ``make run``. ``composed`` prices each operator call of kind k at ``γ_k``, shrunk towards a
prior: the pooled fit's one per-call cost when the device's hardware record has no ``call_costs``, else the
device's measured tiny call of that kind (:mod:`perfzoo.profiling.call_costs`). This script takes the tiny calls
from RUN_DIR's hardware record where it has them, else measures them now on this machine (as the hardware rule
does; ``--scale`` multiplies them, a check of how much the fits depend on them), and refits ``composed`` on the
run's dataset and splits as the fit rule does, once without the device's tiny calls (the pooled prior) and once
with them. It prints the test MAPE per split with its 90 % interval, the leave-one-family-out folds' per-call
costs, and, for each ``--user`` model (its input shape and the CSV ``bench/user_model.py`` wrote with its
measurements), both fits' predictions (the mean of the leave-one-family-out fold models, as ``perfzoo predict``
gives for a family never profiled) against the measured latency. Nothing is tuned: both fits are the workflow's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SPLITS = ("leave_one_family_out", "batch_extrapolation", "random", "family_monte_carlo", "stratified_kfold")
SHOWN = ("n_module_calls", "op_elementwise_count", "op_matmul_count", "op_norm_count", "op_conv_count",
         "op_optimizer_count")


def tiny_calls(run: Path, device: str, scale: float) -> dict[str, float]:
    """µs per tiny call of each kind: the run's hardware record's, else measured now (times ``scale``)."""
    from perfzoo.profiling.call_costs import measure_call_costs

    record = json.loads((run / "results" / "hardware" / f"{device}.json").read_text())
    us = (record.get("call_costs") or {}).get("us")
    source = "the run's hardware record"
    if not us:
        us, source = measure_call_costs(int(record.get("cores_used") or 1))["us"], "measured now"
    print(f"tiny calls ({source}{f', x {scale}' if scale != 1 else ''}): "
          + ", ".join(f"{kind} {v * scale:.2f}" for kind, v in us.items()) + " µs")
    return {kind: v * scale for kind, v in us.items()}


def user_rows(run: Path, model: str, shape: str, measured: Path) -> tuple[pd.DataFrame, np.ndarray, list[str]]:
    """(the user model's feature rows as ``perfzoo predict`` builds them, measured latency, row names), one per
    config of a ``bench/user_model.py`` CSV."""
    table = pd.read_csv(measured)
    rows, names = [], []
    for case in table.itertuples():
        out = subprocess.run([sys.executable, "-m", "perfzoo.cli", "predict", model, "--batch", str(case.batch),
                              "--input", shape, "--mode", case.mode, "--json", "--no-server"],
                             capture_output=True, text=True, check=True, cwd=run)
        rows.append(pd.DataFrame([json.loads(out.stdout)["feature_rows"]["cpu"]]))
        names.append(f"{case.mode[:3]} b{case.batch}")
    return pd.concat(rows, ignore_index=True), table["meas_latency_ms"].to_numpy(float), names


def main() -> None:
    import perfzoo.fitting as fitting
    from perfzoo.evaluate import metrics_table, with_intervals
    from perfzoo.hardware import CALL_COST_COLUMNS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--user", nargs=3, action="append", default=[], metavar=("MODEL", "INPUT", "CSV"))
    args = parser.parse_args()
    run = args.run.resolve()
    results = run / "results"
    calls = tiny_calls(run, args.device, args.scale)
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    columns = {c: data["device"].map({args.device: calls[k]}) for k, c in CALL_COST_COLUMNS.items() if k in calls}
    variants = {"pooled prior": data.drop(columns=[c for c in CALL_COST_COLUMNS.values() if c in data.columns]),
                "device's tiny calls": data.assign(**columns)}
    noise = pd.read_parquet(results / "dataset" / "noise_floor.parquet")
    params = {"op_times_path": str(results / "features" / "op_times.parquet")}
    users = [(m, s, *user_rows(run, m, s, Path(c).resolve())) for m, s, c in args.user]
    pd.set_option("display.width", 250)
    for name, frame in variants.items():
        predictions, folds = [], {}
        for split in SPLITS:
            table = pd.read_parquet(results / "splits" / f"{split}.parquet")
            held, models, _ = fitting.fit_split(frame, table, "latency_ms", "composed", params)
            predictions.append(held)
            folds = models if split == "leave_one_family_out" else folds
        metrics = metrics_table(with_intervals(pd.concat(predictions, ignore_index=True)), noise)
        print(f"\ncomposed, {name}: test MAPE % per split [90 % interval]")
        print(metrics.set_index("split")[["mape", "mape_lo90", "mape_hi90"]].round(2).to_string())
        print("per-call costs (µs) of the leave-one-family-out folds (held-out family):")
        print(pd.DataFrame({f: (m.coefficients(args.device) * 1e3).reindex(list(SHOWN)).round(2)
                            for f, m in folds.items()}).T.to_string())
        for model, _, X, y, names in users:
            X = X.assign(**{c: calls.get(k, np.nan) for k, c in CALL_COST_COLUMNS.items()})
            predicted = np.mean([m.predict(X) for m in folds.values()], axis=0)
            error = (predicted / y - 1) * 100
            print(f"{model}: " + ", ".join(f"{n} {p:.2f} ms ({e:+.0f} %)" for n, p, e in zip(names, predicted, error,
                                                                                                strict=True))
                  + f"; measured {', '.join(f'{v:.2f}' for v in y)} ms; MAPE {np.mean(np.abs(error)):.1f} %, "
                  f"within 20 %: {int((np.abs(error) <= 20).sum())} of {len(y)}")


if __name__ == "__main__":
    main()
