"""Empirical coverage of the 90 % intervals on held-out rows, per (target, regressor, split), offline on a
finished run.

    python bench/interval_coverage.py RESULTS [--targets latency_ms,peak_mem_mb]

Reads (never writes) ``RESULTS/fit/<target>/<regressor>/<split>.predictions.parquet``, gives every held-out
row its interval as the evaluate rule does (:func:`perfzoo.evaluate.with_intervals`: cross-conformal over
the other folds, leave one row out for a single-fold split) and prints, as Markdown, the coverage on the test
rows (``coverage90`` of the metrics table, with the row count; ``*`` outside 85-95 %) and the median
interval factor ``exp(q)`` (the interval is point ×/÷ that factor). ``--per-fold SPLIT`` also prints the
coverage of every fold of one split (per held-out family for ``leave_one_family_out``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from perfzoo.evaluate import metrics_table, outside_coverage_band, test_rows, with_intervals  # noqa: E402


def coverage_tables(results: Path, targets: list[str]) -> dict[str, pd.DataFrame]:
    """Per target: regressors x splits, cells ``coverage % (n)`` and ``×/÷ median factor``."""
    files = [p for t in targets for p in sorted((results / "fit" / t).glob("*/*.predictions.parquet"))]
    held = with_intervals(pd.concat([pd.read_parquet(p) for p in files], ignore_index=True))
    noise = pd.DataFrame({"target": targets, "noise_mape": np.nan})
    metrics = metrics_table(held, noise).set_index(["target", "regressor", "split"])
    test = test_rows(held)
    factor = (test["y_hi"] / test["y_pred"]).groupby([test["target"], test["regressor"], test["split"]]).median()
    cells = {}
    for key, row in metrics.iterrows():
        if np.isnan(row["coverage90"]):
            cells[key] = f"– ({row['interval_missing']})"
            continue
        star = "*" if outside_coverage_band(row["coverage90"]) else ""
        cells[key] = f"{row['coverage90'] * 100:.1f}{star} ({row['n_interval']}), ×/÷ {factor.get(key, np.nan):.2f}"
    table = pd.Series(cells).rename_axis(["target", "regressor", "split"]).unstack("split")
    return {t: table.loc[t] for t in targets if t in table.index.get_level_values(0)}


def per_fold_table(results: Path, target: str, split: str) -> pd.DataFrame:
    """Coverage % (test rows) of every fold of ``split``: regressors x folds."""
    files = sorted((results / "fit" / target).glob(f"*/{split}.predictions.parquet"))
    test = test_rows(with_intervals(pd.concat([pd.read_parquet(p) for p in files], ignore_index=True)))
    inside = (test["y_true"] >= test["y_lo"]) & (test["y_true"] <= test["y_hi"])
    grouped = inside.groupby([test["regressor"], test["fold"]])
    return (grouped.mean() * 100).round(0).astype(int).astype(str).add(" (" + grouped.size().astype(str) + ")"
                                                                       ).unstack("fold")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--targets", default="latency_ms,peak_mem_mb")
    parser.add_argument("--per-fold", metavar="SPLIT", help="also the coverage of every fold of this split")
    args = parser.parse_args()
    for target, table in coverage_tables(args.results, args.targets.split(",")).items():
        print(f"\n{target}: coverage % of the 90 % intervals on test rows (n), median interval factor\n")
        print(table.to_markdown())
        if args.per_fold:
            print(f"\n{target}, {args.per_fold}: coverage % per fold (test rows)\n")
            print(per_fold_table(args.results, target, args.per_fold).to_markdown())


if __name__ == "__main__":
    main()
