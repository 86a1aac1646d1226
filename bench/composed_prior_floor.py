"""``composed`` with a floor on the share its shrinkage prices a term at (``min_prior_share``), side by side.

    python bench/composed_prior_floor.py RESULTS [RESULTS ...] [--floors 0 0.0003 0.001 0.002] [--out FILE.csv]

For each finished default run (``RESULTS`` = a ``results/`` folder with ``dataset/``, ``splits/`` and
``features/op_times.parquet``), refits ``composed`` on every fold of every split as the fit rule does
(``bench/composed_shrinkage.py``'s :func:`scores`, with the run's measured per-operator times as the fit rule
passes them) at each floor, and ``composed_blend`` with its composed member at 0 and at the default floor.
Prints test MAPE % per run, split and variant, ``select`` (the mean over family_monte_carlo and
stratified_kfold, the splits the floor is chosen on) and the mean over runs.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import pandas as pd  # noqa: E402
from composed_shrinkage import SELECTION_SPLITS, SPLITS, scores, with_module_calls  # noqa: E402

from perfzoo.regressors.composed import DEFAULT_MIN_PRIOR_SHARE, ComposedRegressor  # noqa: E402


@contextlib.contextmanager
def default_floor(share: float) -> Iterator[None]:
    """``ComposedRegressor``'s default ``min_prior_share`` set to ``share`` (a blend builds its member with the
    defaults); the last positional default is that parameter."""
    if list(inspect.signature(ComposedRegressor).parameters)[-1] != "min_prior_share":
        raise RuntimeError("ComposedRegressor's last parameter is no longer min_prior_share: update default_floor")
    defaults = ComposedRegressor.__init__.__defaults__
    ComposedRegressor.__init__.__defaults__ = (*defaults[:-1], share)
    try:
        yield
    finally:
        ComposedRegressor.__init__.__defaults__ = defaults


def run_table(results: Path, floors: list[float]) -> pd.DataFrame:
    """One run's test MAPE per (regressor, floor) and split, with ``select``."""
    data = with_module_calls(results, pd.read_parquet(results / "dataset" / "dataset.parquet"))
    op_times = str(results / "features" / "op_times.parquet")
    rows = {}
    for share in floors:
        params = {"op_times_path": op_times, "min_prior_share": share}
        rows[("composed", share)] = scores(results, params, SPLITS, data)["mape"]
    for share in (0.0, DEFAULT_MIN_PRIOR_SHARE):
        with default_floor(share):
            rows[("composed_blend", share)] = scores(results, {"op_times_path": op_times}, SPLITS, data,
                                                     regressor="composed_blend")["mape"]
    frame = pd.DataFrame(rows).T[list(SPLITS)]
    frame["select"] = frame[list(SELECTION_SPLITS)].mean(axis=1)
    frame.index.names = ["regressor", "min_prior_share"]
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--floors", type=float, nargs="+", default=[0.0, 0.0003, DEFAULT_MIN_PRIOR_SHARE, 0.002])
    parser.add_argument("--out", type=Path, help="write every run's table here (CSV)")
    args = parser.parse_args()
    tables = {str(r): run_table(r, args.floors) for r in args.results}
    pd.set_option("display.width", 250)
    for name, table in tables.items():
        print(f"== {name}\n{table.round(2).to_string()}\n")
    together = pd.concat(tables, names=["run"])
    print("== mean over runs")
    print(together.groupby(level=["regressor", "min_prior_share"]).mean().round(2).to_string())
    if args.out:
        together.round(3).to_csv(args.out)


if __name__ == "__main__":
    main()
