"""Measured per-operator times on a finished run: what the op timing costs, how much of each held-out family's
step is in kinds seen in training, and the composed predictor fitted on op timings vs the current one.

    python bench/op_timing.py RESULTS [--labels OTHER_RESULTS]

``RESULTS`` is the results folder of a run whose profile rule recorded per-operator times
(``traces/<device>/*.ops.parquet``, ``features/op_times.parquet``, ``dataset/``, ``splits/``). Printed:

1. per device, the seconds the per-op steps took (the traces' metadata), and the step under the timer and the
   sum of its operators' times against the end-to-end median (``latency_ms``);
2. per held-out family of leave_one_family_out, the median share of its measured step in kinds its training
   families ran, in kinds they never ran (named), and outside any operator (``evaluate/op_coverage.parquet``
   when present, else computed);
3. test MAPE of ``composed`` (per-kind costs fitted on end-to-end latencies), ``composed_optime`` (fitted on
   the measured per-kind times, then scaled, plus an overhead) and ``linear`` on the same rows of
   leave_one_family_out, batch_extrapolation and random, beside the best naive baseline and the noise floor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from perfzoo.evaluate import metrics_table  # noqa: E402
from perfzoo.features.op_kinds import COSTED_KINDS, OP_TIME_PREFIX  # noqa: E402
from perfzoo.features.op_times import family_coverage, kind_time_labels  # noqa: E402
from perfzoo.fitting import ID_COLUMNS, featurised_rows, regressor_inputs  # noqa: E402
from perfzoo.regressors import make_regressor  # noqa: E402
from perfzoo.regressors.baselines import baseline_predictions  # noqa: E402
from perfzoo.regressors.composed import ComposedOpTimeRegressor  # noqa: E402

TARGET = "latency_ms"
SPLITS = ("leave_one_family_out", "batch_extrapolation", "random")
KEY = ["device", "model_id", "mode", "batch"]


def op_timing_cost(results: Path, data: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Per device: seconds of per-op steps, configs timed, and the timed steps against the end-to-end median."""
    rows = []
    for device_dir in sorted((results / "traces").iterdir()):
        metas = [json.loads(p.read_text()) for p in sorted(device_dir.glob("*.meta.json"))]
        timing = [m.get("op_timing") or {} for m in metas]
        profiled = sum(m["finished"] - m["started"] for m in metas)
        ok = table[(table["device"] == device_dir.name) & (table["status"] == "ok")].drop_duplicates(
            ["config_id"])
        joined = ok.merge(data[KEY + [TARGET]], on=KEY)
        rows.append({"device": device_dir.name, "profiling_s": profiled,
                     "op_timing_s": sum(t.get("seconds", 0.0) for t in timing),
                     "configs_timed": sum(t.get("configs_timed", 0) for t in timing),
                     "configs_without": int(table[(table["device"] == device_dir.name)
                                                  & (table["status"] != "ok")]["config_id"].nunique()),
                     "step_under_timer/e2e": float(np.median(joined["step_ms"] / joined[TARGET])),
                     "ops_sum/e2e": float(np.median(joined["ops_ms"] / joined[TARGET])),
                     "ops_sum/step_under_timer": float(np.median(joined["ops_ms"] / joined["step_ms"]))})
    return pd.DataFrame(rows)


def kind_call_agreement(table: pd.DataFrame, models: pd.DataFrame) -> pd.DataFrame:
    """Per costed kind: configs where the measured calls per step equal the meta trace's ``op_<kind>_count``,
    and the median measured/meta ratio (the kinds are named from the same rules, so they should agree)."""
    ok = table[(table["status"] == "ok") & table["kind"].isin(COSTED_KINDS)]
    counts = models.melt(id_vars=["model_id", "mode", "batch"],
                         value_vars=[f"op_{k}_count" for k in COSTED_KINDS], var_name="kind", value_name="meta")
    counts["kind"] = counts["kind"].str.removeprefix("op_").str.removesuffix("_count")
    configs = ok.drop_duplicates(["device", "config_id"])[["device", "config_id", "model_id", "mode", "batch"]]
    both = (configs.merge(counts, on=["model_id", "mode", "batch"])
            .merge(ok[["device", "config_id", "kind", "calls"]], on=["device", "config_id", "kind"], how="left")
            .fillna({"calls": 0.0}))
    both = both[(both["meta"] > 0) | (both["calls"] > 0)]
    return both.groupby("kind").apply(lambda g: pd.Series({
        "configs": len(g), "equal": float((g["calls"] == g["meta"]).mean()),
        "median measured/meta": float((g["calls"] / g["meta"]).median())}), include_groups=False).reset_index()


def with_labels(data: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    return data.merge(kind_time_labels(table), on=KEY, how="left", validate="one_to_one")


def fold_predictions(data: pd.DataFrame, split: pd.DataFrame) -> pd.DataFrame:
    """Held-out predictions of the three regressors on every fold (the same rows for each)."""
    data = data[featurised_rows(data) & np.isfinite(data[TARGET])].set_index("row_id", drop=False)
    out = []
    for fold, rows in split.groupby("fold", sort=True):
        rows = rows[rows["row_id"].isin(data.index)]
        train = data.loc[rows.loc[rows["set"] == "train", "row_id"]]
        held = rows[rows["set"] != "train"]
        test = data.loc[held["row_id"]]
        labels = train[[c for c in train.columns if c.startswith(OP_TIME_PREFIX)]]
        train_inputs, test_inputs = regressor_inputs(train, "all", True), regressor_inputs(test, "all", True)
        fitted = {"composed": make_regressor("composed").fit(train_inputs, train[TARGET]),
                  "composed_optime": ComposedOpTimeRegressor().fit(train_inputs.join(labels), train[TARGET]),
                  "linear": make_regressor("linear").fit(regressor_inputs(train), train[TARGET])}
        for name, model in fitted.items():
            inputs = regressor_inputs(test) if name == "linear" else test_inputs
            out.append(test[ID_COLUMNS].assign(
                split=split["split"].iloc[0], fold=str(fold), set=held["set"].to_numpy(), target=TARGET,
                regressor=name, y_true=test[TARGET].to_numpy(float), y_pred=np.asarray(model.predict(inputs)),
                y_lo=np.nan, y_hi=np.nan))
    return pd.concat(out, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--labels", type=Path, help="results folder of another run of the same zoo and device "
                        "whose dataset, noise floor and splits to fit and score on (e.g. one measured on an idle "
                        "machine); the per-operator times stay those of RESULTS")
    args = parser.parse_args()
    results = args.results
    labels_from = args.labels or results
    pd.set_option("display.width", 220)
    pd.set_option("display.max_colwidth", 120)
    data = pd.read_parquet(labels_from / "dataset" / "dataset.parquet")
    table = pd.read_parquet(results / "features" / "op_times.parquet")
    print(op_timing_cost(results, data, table).round(3).to_markdown(index=False), "\n")
    models = pd.read_parquet(results / "features" / "models.parquet")
    print(kind_call_agreement(table, models).round(3).to_markdown(index=False), "\n")

    lofo = pd.read_parquet(labels_from / "splits" / "leave_one_family_out.parquet")
    coverage_path = results / "evaluate" / "op_coverage.parquet"
    coverage = (pd.read_parquet(coverage_path) if coverage_path.exists() and not args.labels
                else family_coverage(table, lofo, data))
    print(coverage.drop(columns=["split"]).round(3).to_markdown(index=False), "\n")

    labelled = with_labels(data, table)
    print(f"rows: {len(labelled)}, with per-op times: "
          f"{int(labelled[f'{OP_TIME_PREFIX}message'].fillna('missing').eq('').sum())}")
    noise = pd.read_parquet(labels_from / "dataset" / "noise_floor.parquet")
    predictions = []
    for name in SPLITS:
        split = pd.read_parquet(labels_from / "splits" / f"{name}.parquet")
        predictions += [fold_predictions(labelled, split), baseline_predictions(data, split, TARGET)]
    metrics = metrics_table(pd.concat([p for p in predictions if len(p)], ignore_index=True), noise)
    metrics = metrics[~metrics["regressor"].str.startswith("baseline:")]
    wide = metrics.pivot_table(index="regressor", columns="split", values="mape").round(1)
    print(wide[[s for s in SPLITS if s in wide.columns]].to_markdown())
    extra = metrics.drop_duplicates("split")[["split", "n", "best_baseline", "best_baseline_mape",
                                               "noise_floor_mape"]]
    print(extra.round(1).to_markdown(index=False))


if __name__ == "__main__":
    main()
