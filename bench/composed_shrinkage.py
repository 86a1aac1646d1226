"""``composed`` with and without shrinkage of its per-kind costs, refitted offline on a finished default run.

    python bench/composed_shrinkage.py RESULTS [--variant NAME=JSON ...] [--splits SPLIT ...]

Refits ``composed`` on every fold of every split of ``RESULTS/splits/`` exactly as the fit rule does
(:func:`perfzoo.fitting.fit_split` on ``RESULTS/dataset/dataset.parquet``) and scores the held-out rows as
the evaluate rule does (:func:`perfzoo.evaluate.with_intervals`, :func:`perfzoo.evaluate.metrics_table`):
test MAPE % and, in brackets, the coverage % of the cross-conformal 90 % intervals. ``select`` is the mean
MAPE over family_monte_carlo and stratified_kfold, the splits the variants were chosen on; the other
splits are the test. Below: the run's best other regressor, best baseline and noise floor per split
(``RESULTS/evaluate/metrics.parquet``).

A run made before the ``n_module_calls`` feature existed (composed's default per-step term) gets it here:
each (model, mode) of ``RESULTS/zoo/manifest.parquet`` is featurised once on the meta device by the features
stage's own code (the count does not depend on the batch) and joined onto the dataset.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pandas as pd  # noqa: E402

from perfzoo.evaluate import BASELINE_PREFIX, metrics_table, with_intervals  # noqa: E402
from perfzoo.fitting import fit_split  # noqa: E402

TARGET = "latency_ms"
REGRESSOR = "composed"
SPLITS = ("leave_one_family_out", "batch_extrapolation", "random", "family_monte_carlo", "stratified_kfold")
SELECTION_SPLITS = ("family_monte_carlo", "stratified_kfold")
VARIANTS = {
    "unshrunk (shrinkage 0, the former default)": {"shrinkage": 0.0},
    "shrinkage cv (inner leave-one-model-out)": {"shrinkage": "cv"},
    "shrinkage 3": {"shrinkage": 3.0},
    "shrinkage 5 (default)": {},
    "shrinkage 10": {"shrinkage": 10.0},
    "pooled (shrinkage 1000)": {"shrinkage": 1000.0},
}


MODULE_CALLS = "n_module_calls"


def with_module_calls(results: Path, data: pd.DataFrame) -> pd.DataFrame:
    """The dataset with ``n_module_calls`` (featurised here when the run predates it)."""
    if MODULE_CALLS in data.columns:
        return data
    from perfzoo.config import load_config
    from perfzoo.features.meta import featurise_manifest  # lazy: torch

    classes = load_config(results.parent / "config.yaml")["zoo"]["num_classes"]
    manifest = pd.read_parquet(results / "zoo" / "manifest.parquet").drop_duplicates(["model_id", "mode"])
    models, _ = featurise_manifest(manifest.assign(batch=1), num_classes=classes, progress=False)
    counts = models[["model_id", "mode", MODULE_CALLS]].drop_duplicates(["model_id", "mode"])
    return data.merge(counts, on=["model_id", "mode"], how="left", validate="many_to_one")


def scores(results: Path, params: dict, splits: tuple[str, ...], data: pd.DataFrame,
           regressor: str = REGRESSOR, target: str = TARGET) -> pd.DataFrame:
    """Metrics of ``regressor`` (``composed``) with ``params`` on ``target`` (latency) on every split, as the fit and
    evaluate rules compute them."""
    predictions = [fit_split(data, pd.read_parquet(results / "splits" / f"{s}.parquet"), target, regressor,
                             params)[0] for s in splits]
    noise = pd.read_parquet(results / "dataset" / "noise_floor.parquet")
    table = metrics_table(with_intervals(pd.concat(predictions, ignore_index=True)), noise)
    return table[table["target"] == target].set_index("split")


def reference(results: Path) -> pd.DataFrame:
    """Per split: the run's best regressor other than composed, its best baseline and the noise floor."""
    metrics = pd.read_parquet(results / "evaluate" / "metrics.parquet")
    metrics = metrics[metrics["target"] == TARGET]
    others = metrics[~metrics["regressor"].str.startswith(BASELINE_PREFIX)
                     & (metrics["regressor"] != REGRESSOR)]
    best = others.loc[others.groupby("split")["mape"].idxmin(), ["split", "regressor", "mape"]]
    base = metrics[["split", "best_baseline", "best_baseline_mape", "noise_floor_mape"]]
    base = base.drop_duplicates("split")
    return best.merge(base, on="split").set_index("split").round(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                        help="composed parameters to score instead of the built-in variants")
    parser.add_argument("--splits", nargs="+", default=list(SPLITS))
    args = parser.parse_args()
    variants = (dict((v.split("=", 1)[0], json.loads(v.split("=", 1)[1])) for v in args.variant)
                if args.variant else VARIANTS)
    data = with_module_calls(args.results, pd.read_parquet(args.results / "dataset" / "dataset.parquet"))
    rows = {}
    for name, params in variants.items():
        table = scores(args.results, params, tuple(args.splits), data)
        cells = {s: f"{table.loc[s, 'mape']:.1f} [{100 * table.loc[s, 'coverage90']:.1f}]"
                 for s in args.splits}
        if set(SELECTION_SPLITS) <= set(args.splits):
            cells["select"] = f"{table.loc[list(SELECTION_SPLITS), 'mape'].mean():.2f}"
        rows[name] = cells
    pd.set_option("display.width", 250)
    print(pd.DataFrame(rows).T.to_string())
    if (args.results / "evaluate" / "metrics.parquet").exists():
        print(reference(args.results).to_string())


if __name__ == "__main__":
    main()
