"""Which predictor prices a model of a family never profiled, on finished default runs: the file ranked first by
the ``leave_one_family_out`` score alone (the rule before) and by the held-out rows of
:data:`perfzoo.prediction.predictors.UNSEEN_FAMILY_SPLITS` pooled (the rule now), each with its scores on those
splits. Both rankings are :func:`perfzoo.prediction.predictors.ranked_files`, the code ``perfzoo predict`` runs.

Usage: python bench/unseen_choice.py RESULTS_DIR [RESULTS_DIR ...]   (e.g. /tmp/fresh-GB/results)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from perfzoo.prediction.predictors import UNSEEN_FAMILY_SPLIT, UNSEEN_FAMILY_SPLITS, ranked_files  # noqa: E402

TARGETS = ("latency_ms", "peak_mem_mb")


def score(metrics: pd.DataFrame, target: str, regressor: str, split: str) -> float:
    row = metrics[(metrics["target"] == target) & (metrics["regressor"] == regressor) & (metrics["split"] == split)]
    return float(row["mape"].iloc[0]) if len(row) else float("nan")


def choices(results: Path) -> list[dict[str, object]]:
    metrics = pd.read_parquet(results / "evaluate" / "metrics.parquet")
    alone = metrics[metrics["split"] == UNSEEN_FAMILY_SPLIT]
    rows = []
    for target in TARGETS:
        for rule, table in (("leave_one_family_out alone", alone), ("pooled", metrics)):
            regressor, _, pooled, n, scored_on = ranked_files(table, results, target, UNSEEN_FAMILY_SPLIT)[0]
            rows.append({"run": results.parent.name, "target": target, "rule": rule, "chosen": regressor,
                         "score": round(float(pooled), 2), "rows": n, "scored_on": " + ".join(scored_on),
                         **{split: round(score(metrics, target, regressor, split), 2)
                            for split in UNSEEN_FAMILY_SPLITS}})
    return rows


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    table = pd.DataFrame([row for arg in sys.argv[1:] for row in choices(Path(arg))])
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
