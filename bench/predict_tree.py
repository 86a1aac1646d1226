"""Time 10,000 predictions of a fitted tree model (the default run's random-forest latency predictor)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pandas as pd  # noqa: E402

from perfzoo.fitting import load_models, regressor_inputs  # noqa: E402


def main() -> None:
    results = ROOT / "results"
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    rows = regressor_inputs(data).sample(10_000, replace=True, random_state=0).reset_index(drop=True)
    for regressor in ("random_forest", "extra_trees", "xgboost"):
        path = results / "fit" / "latency_ms" / regressor / "random.models.json"
        if not path.exists():
            continue
        model = next(iter(load_models(path)[0].values()))
        model.predict(rows.head(10))
        start = time.perf_counter()
        model.predict(rows)
        print(f"{regressor}: 10,000 predictions in {time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    main()
