"""Labels of the same configs measured twice from one worker server and from two servers.

    python bench/worker_servers.py RESULTS [--every 5] [--processes 2]

Every ``--every``-th config of ``RESULTS/zoo/manifest.parquet`` (by config id) is measured by the profiler's own
isolated workers (:func:`perfzoo.profiling.worker.run_isolated`, with the run's settings, :func:`run_settings`), all of them once and then all of them again, in each of ``--processes`` Python processes run
one after the other; each process starts its own worker server (the forkserver every worker is forked from).
Printed per target (peak memory, latency): the MAPE between the two measurements from one server (as the noise
floor paired them before the repeats came from a new server) and between the first measurements of two servers
(as two shards or two runs differ), and the configs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from this_checkout import use_this_checkout  # noqa: E402

ROOT = use_this_checkout()

import pandas as pd  # noqa: E402



def run_settings(results: Path, device: str = "cpu") -> dict:
    """The profile rule's worker settings of the run whose ``results`` these are (its ``config.yaml`` beside them:
    ``profiling:``, the device's threads, the zoo's classes), without per-operator times."""
    from perfzoo.config import load_config

    config = load_config(results.parent / "config.yaml")
    from perfzoo.profiling.runner import worker_settings

    return {**worker_settings(config["profiling"], config["devices"][device], config["zoo"]["num_classes"]),
            "time_ops": False}


def configs(results: Path, every: int) -> pd.DataFrame:
    manifest = pd.read_parquet(results / "zoo" / "manifest.parquet").drop_duplicates("config_id")
    return manifest.sort_values("config_id").iloc[::every]


def measure_twice(results: Path, every: int) -> None:
    """In this process (its own worker server): every config, then every config again; JSON lines."""
    from perfzoo.profiling.worker import run_isolated

    rows, settings = configs(results, every).to_dict("records"), run_settings(results)
    for repeat in (0, 1):
        for row in rows:
            outcome = run_isolated("cpu", row, settings)
            m = outcome.measurement if outcome.status == "ok" else None
            times = sorted(m["times_ms"]) if m else []
            print(json.dumps({"config_id": row["config_id"], "name": row["name"], "mode": row["mode"],
                              "batch": int(row["batch"]), "repeat": repeat,
                              "peak_mem_mb": m["peak_mem_mb"] if m else None,
                              "latency_ms": times[len(times) // 2] if times else None}), flush=True)


def mape(a: pd.Series, b: pd.Series) -> float:
    return float((100 * (b - a).abs() / a).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--_measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._measure:
        measure_twice(args.results, args.every)
        return
    frames = []
    for process in range(args.processes):
        out = subprocess.run([sys.executable, __file__, str(args.results), "--every", str(args.every), "--_measure"],
                             capture_output=True, text=True, check=True)
        frames.append(pd.DataFrame([json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")])
                      .assign(process=process))
    data = pd.concat(frames, ignore_index=True)
    wide = data.pivot_table(index=["config_id", "name", "mode", "batch"], columns=["process", "repeat"],
                            values=["peak_mem_mb", "latency_ms"])
    print("| target | one server, repeat vs first (per process) | two servers, first vs first |")
    print("|---|---|---|")
    for target in ("peak_mem_mb", "latency_ms"):
        t = wide[target]
        within = [f"{mape(t[(p, 0)], t[(p, 1)]):.2f}" for p in range(args.processes)]
        across = [f"{mape(t[(0, 0)], t[(p, 0)]):.2f}" for p in range(1, args.processes)]
        print(f"| {target} | {' / '.join(within)} | {' / '.join(across)} |")
    pd.set_option("display.width", 250)
    print(wide["peak_mem_mb"].round(2).to_string())


if __name__ == "__main__":
    main()
