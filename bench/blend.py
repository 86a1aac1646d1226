"""``composed_blend`` (the geometric mean of ``composed`` and ``poly_lasso``) beside its two members, offline on
finished default runs.

    python bench/blend.py RESULTS [RESULTS ...]

For every results folder: ``composed``, ``poly_lasso`` and ``composed_blend`` fitted on every fold of every split
of ``splits/`` on the run's own ``dataset/dataset.parquet`` (its features as the run had them; ``n_module_calls``,
``composed``'s per-step term, featurised by the current code for a run made before it; operator kinds added
since the run as 0, as none of its operators is of them), scored on the
pooled test rows as the evaluate rule does (MAPE %, coverage of the 90 % intervals calibrated on the split's
held-out residuals in brackets), with the run's noise floor and the run's best regressor and baseline per split.
``select`` is the mean MAPE of the selection splits (family_monte_carlo, stratified_kfold).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import pandas as pd  # noqa: E402
from composed_shrinkage import SELECTION_SPLITS, SPLITS, TARGET, with_module_calls  # noqa: E402
from composed_shrinkage import scores as composed_scores  # noqa: E402

from perfzoo.features.op_kinds import OP_FEATURES  # noqa: E402

REGRESSORS = ("composed", "poly_lasso", "composed_blend")


def scores(results: Path) -> pd.DataFrame:
    """One row per (regressor, split): MAPE, coverage and the run's noise floor
    (:func:`composed_shrinkage.scores` for each regressor)."""
    data = with_module_calls(results, pd.read_parquet(results / "dataset" / "dataset.parquet"))
    for column in OP_FEATURES:  # kinds added since the run: none of its operators is of them
        if column not in data.columns:
            data[column] = 0.0
    return pd.concat([composed_scores(results, {}, SPLITS, data, name).reset_index() for name in REGRESSORS],
                     ignore_index=True)


def run_best(results: Path) -> pd.DataFrame:
    """Per split: the run's best regressor (its evaluate/metrics.parquet)."""
    metrics = pd.read_parquet(results / "evaluate" / "metrics.parquet")
    metrics = metrics[(metrics["target"] == TARGET) & ~metrics["regressor"].str.startswith("baseline:")]
    best = metrics.loc[metrics.groupby("split")["mape"].idxmin()]
    return best.set_index("split").apply(lambda r: f"{r['mape']:.1f} ({r['regressor']})", axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path)
    args = parser.parse_args()
    pd.set_option("display.width", 250)
    for results in args.results:
        table = scores(results)
        cells = table.assign(cell=table["mape"].map("{:.1f}".format) + " ["
                             + (100 * table["coverage90"]).map("{:.0f}".format) + "]")
        wide = cells.pivot(index="regressor", columns="split", values="cell")[list(SPLITS)]
        mape = table.pivot(index="regressor", columns="split", values="mape")
        wide["select"] = mape[list(SELECTION_SPLITS)].mean(axis=1).map("{:.2f}".format)
        wide.loc["run's best"] = [*run_best(results).reindex(SPLITS), ""]
        floor = table.drop_duplicates("split").set_index("split")["noise_floor_mape"]
        wide.loc["noise floor"] = [*floor.reindex(SPLITS).map("{:.2f}".format), ""]
        rows = [*REGRESSORS, "run's best", "noise floor"]
        print(f"## {results}\n{wide.loc[rows].to_string()}\n", flush=True)


if __name__ == "__main__":
    main()
