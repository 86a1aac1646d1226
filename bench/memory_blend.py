"""``memory_blend`` (``memory_sim`` and ``poly_lasso``, the latter within the profiled batches) beside its two
members and the ungated geometric mean, offline on finished default runs.

    python bench/memory_blend.py RESULTS [RESULTS ...] [--out CSV]

For every results folder: each regressor fitted on every fold of every split of ``splits/`` on the run's own
``dataset/dataset.parquet`` exactly as the fit rule does, the devices' measured constants passed where the regressor
applies them, and scored on the pooled test rows as the evaluate rule does (``composed_shrinkage.scores``):
peak-memory MAPE % and, in brackets, the coverage % of the cross-conformal 90 % intervals. ``select`` is the mean
MAPE of the selection splits (family_monte_carlo, stratified_kfold); ``geometric mean, ungated`` is ``memory_blend``
with ``within_batches=()``. The last block is the mean over runs; ``--out`` writes every (run, regressor, split) row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

sys.path.insert(0, str(ROOT / "bench"))

import pandas as pd  # noqa: E402
from composed_shrinkage import scores as split_scores  # noqa: E402

TARGET = "peak_mem_mb"
SPLITS = ("leave_one_family_out", "batch_extrapolation", "random", "family_monte_carlo", "stratified_kfold")
SELECTION_SPLITS = ("family_monte_carlo", "stratified_kfold")
VARIANTS = {"memory_sim": ("memory_sim", {}), "poly_lasso": ("poly_lasso", {}),
            "geometric mean, ungated": ("memory_blend", {"within_batches": ()}),
            "memory_blend": ("memory_blend", {})}


def scores(results: Path) -> pd.DataFrame:
    """One row per (variant, split): MAPE, coverage and the run's noise floor."""
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    return pd.concat([split_scores(results, params, SPLITS, data, regressor, TARGET).reset_index().assign(
        variant=name, run=results.parent.name) for name, (regressor, params) in VARIANTS.items()], ignore_index=True)


def wide(table: pd.DataFrame) -> pd.DataFrame:
    """Variants x splits: "MAPE [coverage]", and the selection splits' mean MAPE."""
    cells = table.assign(cell=table["mape"].map("{:.2f}".format) + " ["
                         + (100 * table["coverage90"]).map("{:.0f}".format) + "]")
    out = cells.pivot(index="variant", columns="split", values="cell")[list(SPLITS)]
    mape = table.pivot(index="variant", columns="split", values="mape")
    out["select"] = mape[list(SELECTION_SPLITS)].mean(axis=1).map("{:.2f}".format)
    return out.loc[list(VARIANTS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pd.set_option("display.width", 250)
    tables = []
    for results in args.results:
        table = scores(results)
        tables.append(table)
        floor = table["noise_floor_mape"].iloc[0]
        print(f"## {results} (memory noise floor {floor:.2f} %)\n{wide(table).to_string()}\n", flush=True)
    every = pd.concat(tables, ignore_index=True)
    mean = every.groupby(["variant", "split"], as_index=False)[["mape", "coverage90"]].mean()
    print(f"## mean over {len(args.results)} runs\n{wide(mean).to_string()}")
    if args.out:
        columns = ["run", "variant", "split", "n", "mape", "coverage90", "noise_floor_mape"]
        every[[c for c in columns if c in every.columns]].round(4).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
