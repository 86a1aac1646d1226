"""Composed operator-level latency predictor vs the end-to-end regressors, offline on a finished run.

    python bench/composed.py RESULTS [RESULTS ...] [--cache DIR]

For every results folder of a finished default run: featurise the configs of its zoo manifest again with the
current code (operator aggregates ``op_*`` included; timed, cached under ``--cache``), join the aggregates to
its ``dataset/dataset.parquet``, fit on every fold of every split of ``splits/`` and score the pooled test
rows as the evaluate rule does. Printed beside each new row: the run's own best regressor, its best
baseline and its noise floor (``evaluate/metrics.parquet``, ``dataset/noise_floor.parquet``).

New rows: ``composed`` (relative-error weighting, the default), ``composed[none]`` (unweighted), and
``xgboost`` / ``extra_trees`` / ``linear`` refitted offline without (``-e2e``) and with (``+ops``) the operator
aggregates as features.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pandas as pd  # noqa: E402

from perfzoo.evaluate import metrics_table  # noqa: E402
from perfzoo.features.meta import featurise_manifest  # noqa: E402
from perfzoo.features.op_kinds import OP_ERROR_COLUMN, OP_FEATURES  # noqa: E402
from perfzoo.features.ops import op_table  # noqa: E402
from perfzoo.fitting import fit_split  # noqa: E402

TARGET = "latency_ms"
SPLITS = ("leave_one_family_out", "batch_extrapolation", "family_monte_carlo", "stratified_kfold", "random")
# (row name, registered regressor, parameters, with operator features)
CANDIDATES = (
    ("composed", "composed", {}, True),
    ("composed[mape]", "composed", {"weighting": "mape", "shrinkage": 0.0}, True),
    ("composed[none]", "composed", {"weighting": "none"}, True),
    ("linear-e2e", "linear", {}, False),
    ("linear+ops", "linear", {}, True),
    ("extra_trees-e2e", "extra_trees", {}, False),
    ("extra_trees+ops", "extra_trees", {}, True),
    ("xgboost-e2e", "xgboost", {}, False),
    ("xgboost+ops", "xgboost", {}, True),
)


def operator_features(results: Path, cache: Path) -> tuple[pd.DataFrame, float]:
    """The model table (with ``op_*``) of the run's manifest, and the seconds featurising took (NaN if cached)."""
    models_path = cache / f"{results.parent.name}-models.parquet"
    if models_path.exists():
        return pd.read_parquet(models_path), float("nan")
    manifest = pd.read_parquet(results / "zoo" / "manifest.parquet")
    started, tables = time.perf_counter(), []
    models, _ = featurise_manifest(manifest, 100, progress=False, op_tables=tables)
    seconds = time.perf_counter() - started
    cache.mkdir(parents=True, exist_ok=True)
    models.to_parquet(models_path)
    op_table(tables).to_parquet(cache / f"{results.parent.name}-ops.parquet")
    return models, seconds


def evaluate_run(results: Path, cache: Path) -> pd.DataFrame:
    models, seconds = operator_features(results, cache)
    print(f"{results}: featurised {len(models)} configs in {seconds:.1f} s "
          f"({(models[OP_ERROR_COLUMN].fillna('') != '').sum()} without an operator trace)")
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    data = data.drop(columns=[c for c in (*OP_FEATURES, OP_ERROR_COLUMN) if c in data.columns])
    with_ops = data.merge(models[["model_id", "mode", "batch", *OP_FEATURES, OP_ERROR_COLUMN]],
                          on=["model_id", "mode", "batch"], how="left", validate="one_to_one")
    predictions = []
    for split_name in SPLITS:
        split = pd.read_parquet(results / "splits" / f"{split_name}.parquet")
        for name, regressor, params, ops in CANDIDATES:
            frame, _, _ = fit_split(with_ops, split, TARGET, regressor, params, operator_features=ops)
            predictions.append(frame.assign(regressor=name))
    noise = pd.read_parquet(results / "dataset" / "noise_floor.parquet")
    new = metrics_table(pd.concat(predictions, ignore_index=True), noise)
    return new.assign(run=results.parent.name)


def reference(results: Path) -> pd.DataFrame:
    """Per split: the run's best regressor and best baseline (its evaluate/metrics.parquet)."""
    metrics = pd.read_parquet(results / "evaluate" / "metrics.parquet")
    metrics = metrics[metrics["target"] == TARGET]
    models = metrics[~metrics["regressor"].str.startswith("baseline:")]
    best = models.loc[models.groupby("split")["mape"].idxmin(), ["split", "regressor", "mape"]]
    best = best.rename(columns={"regressor": "run_best", "mape": "run_best_mape"})
    base = metrics[["split", "best_baseline", "best_baseline_mape", "noise_floor_mape"]].drop_duplicates("split")
    return best.merge(base, on="split")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/perfzoo-bench-composed"))
    args = parser.parse_args()
    pd.set_option("display.width", 200)
    for results in args.results:
        table = evaluate_run(results, args.cache).merge(reference(results), on="split")
        wide = table.pivot_table(index="regressor", columns="split", values="mape").round(1)
        print(wide[[s for s in SPLITS if s in wide.columns]].to_string())
        print(reference(results).round(1).to_string(index=False))


if __name__ == "__main__":
    main()
