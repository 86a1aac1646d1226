"""A finished run's MAPEs and noise floor recomputed by this checkout's evaluate and dataset code, with their 90 %
bootstrap intervals (a run made before the intervals existed gets them without rerunning the workflow).

    python bench/metric_intervals.py RESULTS [RESULTS ...]

Per run: the noise floor of every device and target from the traces (``perfzoo.dataset.build.noise_floor`` on the
clean, labelled measurements, as the dataset rule makes it), then the best non-baseline MAPE of every (target,
split) and the MAPE of ``composed``, ``composed_blend``, ``memory_sim`` and ``memory_blend`` on the splits issue 13
names (``perfzoo.evaluate.metrics_table`` on the run's held-out predictions). Each figure is checked against the
run's own table before its interval is printed.
"""

from __future__ import annotations

import argparse
import glob
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pandas as pd  # noqa: E402

from perfzoo.dataset.build import build_dataset  # noqa: E402
from perfzoo.evaluate import metrics_table  # noqa: E402

NAMED = [("latency_ms", "composed"), ("latency_ms", "composed_blend"), ("peak_mem_mb", "memory_sim"),
         ("peak_mem_mb", "memory_blend")]
SPLITS = ("random", "leave_one_family_out", "batch_extrapolation")


def run_noise(results: Path) -> pd.DataFrame:
    """The noise floor table as the dataset rule makes it (``build_dataset``), from the run's traces, hardware
    records and feature tables."""
    traces = sorted(glob.glob(str(results / "traces" / "*" / "s*[0-9].parquet")))
    hardware = sorted(glob.glob(str(results / "hardware" / "*.json")))
    manifest = pd.read_parquet(results / "zoo" / "manifest.parquet")
    features = pd.read_parquet(results / "features" / "models.parquet")
    return build_dataset(manifest, features, traces, hardware)[1]


def check(name: str, ours: float, theirs: float) -> None:
    if not math.isclose(ours, theirs, rel_tol=1e-9):
        raise SystemExit(f"{name}: {ours} here, {theirs} in the run's table (other code?)")


def report(results: Path) -> None:
    noise = run_noise(results)
    own_noise = pd.read_parquet(results / "dataset" / "noise_floor.parquet")
    print(f"## {results}")
    for row in noise.merge(own_noise, on=["device", "target"], suffixes=("", "_run")).itertuples():
        check(f"noise floor {row.device} {row.target}", row.noise_mape, row.noise_mape_run)
        print(f"noise floor {row.device} {row.target}: {row.noise_mape:.2f} [{row.noise_lo90:.2f}, "
              f"{row.noise_hi90:.2f}] over {row.pairs} pairs")
    metrics = metrics_table(pd.read_parquet(results / "evaluate" / "predictions.parquet"), noise)
    own = pd.read_parquet(results / "evaluate" / "metrics.parquet").set_index(["target", "regressor", "split"])
    metrics = metrics[metrics["mape"].notna()].set_index(["target", "regressor", "split"])
    for key, row in metrics.iterrows():
        check(" ".join(key), row["mape"], own.loc[key, "mape"])
    models = metrics[~metrics.index.get_level_values("regressor").str.startswith("baseline:")].reset_index()
    best = models.loc[models.groupby(["target", "split"])["mape"].idxmin()]
    named = models[pd.Series(list(zip(models["target"], models["regressor"], strict=True))).isin(NAMED).to_numpy()
                   & models["split"].isin(SPLITS)]
    for title, rows in (("best per split", best), ("named", named)):
        print(f"{title}:")
        for r in rows.itertuples():
            print(f"  {r.target} {r.split} {r.regressor}: {r.mape:.2f} [{r.mape_lo90:.2f}, {r.mape_hi90:.2f}] "
                  f"({r.n} rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+")
    for results in parser.parse_args().results:
        report(results)


if __name__ == "__main__":
    main()
