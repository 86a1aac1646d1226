"""``composed``'s per-byte costs shrunk towards the pooled fit or towards the measured per-operator times, side by side.

    python bench/composed_prior.py RESULTS [RESULTS ...] [--strengths 1 2 3 5] [--cv] [--out FILE.csv]

For each finished default run (``RESULTS`` = a ``results/`` folder with ``dataset/``, ``splits/`` and
``features/op_times.parquet``), refits ``composed`` on every fold of every split exactly as the fit rule does
(``bench/composed_shrinkage.py``'s :func:`scores`: :func:`perfzoo.fitting.fit_split`, then the evaluate rule's
metrics) with each shrinkage strength, once with the pooled prior (no ``op_times_path``: the former default)
and once with the measured per-byte priors (``op_times_path`` = the run's ``op_times`` table, what the fit rule
passes). Prints test MAPE % per run, split and variant, ``select`` (the mean over family_monte_carlo and
stratified_kfold, the splits variants are chosen on), and the mean over runs; ``composed_blend`` (its composed
member with and without the measured priors) at the default strength.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import pandas as pd  # noqa: E402
from composed_shrinkage import SELECTION_SPLITS, SPLITS, scores, with_module_calls  # noqa: E402

from perfzoo.regressors.composed import DEFAULT_SHRINKAGE, INNER_CV  # noqa: E402


def variants(strengths: list[float], cv: bool, op_times: str) -> dict[tuple[str, str], tuple[str, dict]]:
    """(prior, strength) -> (regressor, parameters)."""
    out = {}
    for strength in [*strengths, *([INNER_CV] if cv else [])]:
        shrinkage = {"shrinkage": strength}
        out[("pooled", str(strength))] = ("composed", shrinkage)
        out[("measured", str(strength))] = ("composed", {**shrinkage, "op_times_path": op_times})
    out[("pooled", "blend")] = ("composed_blend", {})
    out[("measured", "blend")] = ("composed_blend", {"op_times_path": op_times})
    return out


def run_table(results: Path, strengths: list[float], cv: bool) -> pd.DataFrame:
    """One run's test MAPE per (prior, strength) and split, with ``select``."""
    data = with_module_calls(results, pd.read_parquet(results / "dataset" / "dataset.parquet"))
    rows = {}
    for key, (regressor, params) in variants(strengths, cv, str(results / "features" / "op_times.parquet")).items():
        table = scores(results, params, SPLITS, data, regressor=regressor)
        rows[key] = {**table["mape"].to_dict(), "select": table.loc[list(SELECTION_SPLITS), "mape"].mean()}
    frame = pd.DataFrame(rows).T[[*SPLITS, "select"]]
    frame.index.names = ["prior", "strength"]
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--strengths", type=float, nargs="+", default=[1.0, 2.0, 3.0, DEFAULT_SHRINKAGE])
    parser.add_argument("--cv", action="store_true", help="also the inner leave-one-model-out strength")
    parser.add_argument("--out", type=Path, help="write every run's table here (CSV)")
    args = parser.parse_args()
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 20)
    tables = {}
    for results in args.results:
        tables[str(results)] = run_table(results, args.strengths, args.cv)
        print(f"== {results}\n{tables[str(results)].round(2).to_string()}\n", flush=True)
    runs = pd.concat(tables, names=["run"])
    if args.out:
        runs.to_csv(args.out)
    print(f"== mean over {len(tables)} run(s)\n{runs.groupby(level=['prior', 'strength'], sort=False).mean().round(2)}")
    better = (runs.xs("measured", level="prior") < runs.xs("pooled", level="prior")).groupby(level="strength",
                                                                                             sort=False).sum()
    print(f"\n== runs where the measured prior is lower, of {len(tables)}\n{better.to_string()}")


if __name__ == "__main__":
    main()
