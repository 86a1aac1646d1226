"""The CPU memory label under glibc's dynamic mmap threshold and under fixed ones: how much it moves between worker
servers, and what a fixed threshold costs the step's time.

    python bench/malloc_threshold.py RESULTS --configs ID[,ID...] [--servers 3] [--rounds 1] [--settings default,...]

Each allocator setting is a set of environment variables glibc reads when a process starts (:data:`SETTINGS`). For
each, a Python process with that environment starts ``--servers`` worker servers one after the other (the
profiler's forkserver, :func:`perfzoo.profiling.core.worker_context`; a worker inherits the server's environment and
heap), and from each forks two workers per config that measure it as the profiler does
(:func:`perfzoo.profiling.measure.measure_on_cpu`, the run's settings, :func:`worker_servers.run_settings`, without
per-operator times). Before it measures, each worker reads glibc's own account of the heap it inherited
(``mallinfo2``: bytes free in the heap, ``fordblks``). Printed per config and setting: the labels (MB) per server,
their spread between servers (largest over smallest first label, minus 1) and within a server (the two workers),
the free heap, and the median step time; then per setting the mean spreads and the ratio of its step times to the
default's (median over configs of the per-config medians). ``--rounds`` repeats everything, the order of the
settings reversed every other round.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from this_checkout import use_this_checkout  # noqa: E402

ROOT = use_this_checkout()

import pandas as pd  # noqa: E402

SETTINGS: dict[str, dict[str, str]] = {
    "default": {},
    "fixed128k": {"MALLOC_MMAP_THRESHOLD_": "131072"},
    "fixed32m": {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "67108864"},
}
"""glibc's default (the mmap threshold starts at 128 KiB and rises to the size of each mapped block freed, up to
32 MiB; the trim threshold follows at twice it), the threshold fixed at its starting value, and fixed at its largest
(what the dynamic one reaches once a block of 32 MiB is freed). Setting either variable stops the dynamic rise."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _measure(spec: dict, settings: dict, queue) -> None:
    """In a worker: the heap it inherited, then one measurement."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    free_mb = libc.mallinfo2().fordblks / 2**20
    from perfzoo.profiling.measure import measure_on_cpu

    measured = measure_on_cpu(spec, settings)
    queue.put({"label_mb": measured.peak_mem_mb, "step_ms": statistics.median(measured.times_ms),
               "heap_free_mb": free_mb})


def measure_here(results: Path, config_ids: list[str], servers: int) -> None:
    """In this process (its environment the setting's): per server, each config twice; JSON lines."""
    from perfzoo.profiling.core import restart_worker_server, worker_context
    from worker_servers import run_settings

    manifest = pd.read_parquet(results / "zoo" / "manifest.parquet").drop_duplicates("config_id")
    specs = manifest.set_index("config_id", drop=False).loc[config_ids].to_dict("records")
    settings, context = run_settings(results), worker_context()
    for server in range(servers):
        for spec in specs:
            for worker in range(2):
                queue = context.Queue()
                process = context.Process(target=_measure, args=(spec, settings, queue))
                process.start()
                row = queue.get()
                process.join()
                print(json.dumps({"server": server, "worker": worker, "config_id": spec["config_id"],
                                  "config": f"{spec['label']} {spec['mode']} b{int(spec['batch'])}", **row}),
                      flush=True)
        restart_worker_server()


def _summary(data: pd.DataFrame) -> None:
    first = data[data["worker"] == 0]
    per = (first.groupby(["setting", "config"])
           .agg(labels=("label_mb", lambda s: " / ".join(f"{v:.2f}" for v in s)),
                between=("label_mb", lambda s: 100 * (s.max() / s.min() - 1)),
                heap_free_mb=("heap_free_mb", "median"), step_ms=("step_ms", "median")))
    pairs = data.pivot_table(index=["setting", "config", "server"], columns="worker", values="label_mb")
    per["within"] = (100 * (pairs[1] / pairs[0] - 1).abs()).groupby(["setting", "config"]).max()
    pd.set_option("display.width", 250)
    print(per.round(2).to_string())
    print("\n| setting | spread between servers, mean % | within a server, mean of the largest % | "
          "step time / default's (median over configs) |")
    print("|---|---|---|---|")
    default = per.xs("default", level="setting")["step_ms"] if "default" in per.index.get_level_values(0) else None
    for setting, rows in per.groupby(level="setting"):
        ratio = (statistics.median(rows.droplevel(0)["step_ms"] / default) if default is not None else float("nan"))
        print(f"| {setting} | {rows['between'].mean():.2f} | {rows['within'].mean():.2f} | {ratio:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--configs", required=True, help="config ids, comma-separated")
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--_here", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    config_ids = args.configs.split(",")
    if args._here:
        measure_here(args.results, config_ids, args.servers)
        return
    frames, names = [], args.settings.split(",")
    for round_ in range(args.rounds):
        for name in (names if round_ % 2 == 0 else names[::-1]):
            env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | SETTINGS[name]
            out = subprocess.run([sys.executable, __file__, str(args.results), "--configs", args.configs,
                                  "--servers", str(args.servers), "--_here"],
                                 env=env, capture_output=True, text=True, check=True)
            frames.append(pd.DataFrame([json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")])
                          .assign(setting=name, round=round_))
    data = pd.concat(frames, ignore_index=True)
    data["server"] = data["round"] * args.servers + data["server"]
    _summary(data)


if __name__ == "__main__":
    main()
