"""The worker server's imports frozen for the garbage collector, or not: each config's worker side by side.

    python bench/gc_freeze.py RESULTS [--every 1] [--rounds 2] [--out rows.csv]

Every ``--every``-th config of ``RESULTS/zoo/manifest.parquet`` (by config id) is measured by the profiler's own
isolated worker (:func:`perfzoo.profiling.worker.run_isolated`, the run's settings of one window, without per-op
times), from a worker server whose preload list ends with :mod:`perfzoo.profiling.frozen_heap` (``frozen``, the
profiler's) and from one whose list leaves it out (``unfrozen``, as before), a new server for each pass, ``--rounds``
rounds, the order of the two passes alternating between rounds. Printed: each pass's wall time (from asking for a
worker to its result, summed over the configs), the ratio of the two ways' medians, and, per target (latency, peak
memory), the MAPE between the two ways (same round) beside the MAPE between two rounds of the same way (the noise).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

from this_checkout import use_this_checkout  # noqa: E402

ROOT = use_this_checkout()

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from perfzoo.profiling import core  # noqa: E402
from perfzoo.profiling.runner import per_window  # noqa: E402
from perfzoo.profiling.worker import run_isolated  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from worker_servers import configs, run_settings  # noqa: E402

FROZEN = "perfzoo.profiling.frozen_heap"
WAYS = {"frozen": core.PRELOAD, "unfrozen": [m for m in core.PRELOAD if m != FROZEN]}


def one_pass(way: str, rows: list[dict], settings: dict, round_: int) -> list[dict]:
    """Every config once, from a new worker server of ``way`` (its start-up is not counted: a first worker warms it)."""
    core.restart_worker_server()
    core.worker_context().set_forkserver_preload(WAYS[way])
    run_isolated("cpu", rows[0], settings)
    out = []
    for row in rows:
        started = time.perf_counter()
        outcome = run_isolated("cpu", row, settings)
        wall = time.perf_counter() - started
        m = outcome.measurement if outcome.status == "ok" else None
        out.append({"way": way, "round": round_, "config_id": row["config_id"], "name": row["name"],
                    "mode": row["mode"], "batch": int(row["batch"]), "status": outcome.status, "wall_s": wall,
                    "latency_ms": float(np.median(m["times_ms"])) if m else np.nan,
                    "peak_mem_mb": m["peak_mem_mb"] if m else np.nan})
        print(f"{way} r{round_} {row['name']} {row['mode']} b{row['batch']}: {wall:.2f} s", file=sys.stderr)
    return out


def mape(a: pd.Series, b: pd.Series) -> float:
    return float((a / b - 1).abs().mean() * 100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = configs(args.results, args.every).to_dict("records")
    settings = per_window(run_settings(args.results))
    frames = []
    for round_ in range(args.rounds):
        order = ["unfrozen", "frozen"] if round_ % 2 == 0 else ["frozen", "unfrozen"]
        for way in order:
            frames.append(pd.DataFrame(one_pass(way, rows, settings, round_)))
    table = pd.concat(frames, ignore_index=True)
    if args.out:
        table.to_csv(args.out, index=False)
    ok = table[table["status"] == "ok"]
    walls = ok.groupby(["way", "round"])["wall_s"].sum().unstack("round").round(1)
    print(f"{len(rows)} configs, {args.rounds} rounds; wall time of each pass, s:\n{walls.to_string()}")
    medians = ok.groupby(["way", "round"])["wall_s"].sum().groupby("way").median()
    print(f"ratio of medians, frozen / unfrozen: {medians['frozen'] / medians['unfrozen']:.2f}")
    wide = ok.pivot_table(index="config_id", columns=["way", "round"], values=["latency_ms", "peak_mem_mb"])
    for target in ("latency_ms", "peak_mem_mb"):
        t = wide[target]
        between = [mape(t[("frozen", r)], t[("unfrozen", r)]) for r in range(args.rounds)]
        line = f"{target}: MAPE frozen vs unfrozen (same round) " + ", ".join(f"{v:.2f}" for v in between)
        for way in WAYS:
            noise = [mape(t[(way, a)], t[(way, b)]) for a, b in itertools.combinations(range(args.rounds), 2)]
            line += f"; {way} round vs round " + ", ".join(f"{v:.2f}" for v in noise)
        shift = [float(np.median(t[("frozen", r)] / t[("unfrozen", r)])) for r in range(args.rounds)]
        print(line + "; median ratio frozen / unfrozen " + ", ".join(f"{v:.3f}" for v in shift))


if __name__ == "__main__":
    main()
