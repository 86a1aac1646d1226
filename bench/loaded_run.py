"""Profiling under a competing load, with and without interference detection, on the same configs.

    python bench/loaded_run.py                      # every 2nd config of the default zoo, load on one core
    python bench/loaded_run.py --configs 6 --busy-after-s 2 --busy-for-s 6   # a quick check that it runs

For each policy the configs are profiled by the real shard runner (``profile_shard``, the profile rule's
code) with the config's measurement settings (repeats every ``repeat_every`` configs, as in a run). A
busy process pinned to one CPU is started ``--busy-after-s`` seconds into the shard and killed by its own
PID ``--busy-for-s`` seconds later. A measurement is *disturbed* when its first attempt overlaps that
window.

* ``detection``: the config's ``profiling.interference`` policy (flags, re-measures after ``wait_s``);
* ``no detection``: nothing is judged (tolerances out of reach, no retries): what every run did before.

Printed per policy: disturbed measurements, how many were re-measured and how many stay flagged, disturbed
ones that are neither (should be 0 with detection), the noise floor (repeat 1 against repeat 0) of all pairs
and of the pairs whose two measurements are unflagged, the profiling time, and the report's first-screen
line with its warning. ``--out`` writes the per-measurement rows as CSV.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# the workers (forkserver children) must import this checkout's perfzoo too, not an installed one
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))

import pandas as pd  # noqa: E402

from perfzoo.config import load_config  # noqa: E402
from perfzoo.dataset.build import aggregate_runs, noise_floor, status_counts  # noqa: E402
from perfzoo.models.zoo import expand_zoo, manifest_frame  # noqa: E402
from perfzoo.profiling.interference import drop_flagged_runs, probe_baseline  # noqa: E402
from perfzoo.profiling.runner import profile_shard  # noqa: E402
from perfzoo.profiling.worker import run_isolated  # noqa: E402
from perfzoo.report.page import health_line  # noqa: E402

BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
UNJUDGED = {"tolerance": None, "load_tolerance": 1e9, "steal_tolerance": 1e9, "retries": 0, "wait_s": 0}


class BusyCore:
    """A busy loop on one CPU from ``after_s`` to ``after_s + for_s`` seconds after :meth:`start`."""

    def __init__(self, cpu: int, after_s: float, for_s: float) -> None:
        self.cpu, self.after_s, self.for_s = cpu, after_s, for_s
        self.window: dict[str, float] = {}
        self._process: subprocess.Popen | None = None
        self._timers: list[threading.Timer] = []

    def start(self) -> None:
        self._timers = [threading.Timer(self.after_s, self._begin),
                        threading.Timer(self.after_s + self.for_s, self.stop)]
        for timer in self._timers:
            timer.start()

    def _begin(self) -> None:
        self._process = subprocess.Popen([sys.executable, "-c", BUSY, str(self.cpu)])
        self.window["start"] = time.time()

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, 9)
            self._process.wait()
            self.window["end"] = time.time()


def disturbed_keys(journal: Path, window: dict[str, float]) -> set[tuple[str, int]]:
    """(config_id, repeat) of the measurements whose first attempt overlapped the busy window."""
    if "start" not in window:
        return set()
    keys = set()
    for line in journal.read_text().splitlines()[1:]:
        entry = json.loads(line)
        first = entry["attempts"][0]
        if first["started"] < window["end"] and first["finished"] > window["start"]:
            config_id, repeat = entry["key"].split("/")[:2]
            keys.add((config_id, int(repeat)))
    return keys


def profile_under_load(configs: pd.DataFrame, settings: dict[str, Any], threads: int, busy: BusyCore,
                       folder: Path) -> tuple[pd.DataFrame, set[tuple[str, int]], float]:
    """Traces (as the dataset stage reads them), the disturbed measurements and the wall time."""
    hardware = {"measurement_setting": {"threads": threads}, "probe_baseline": probe_baseline("cpu", threads)}
    journal = folder / "journal.jsonl"
    started = time.perf_counter()
    busy.start()
    try:
        traces, _, _ = profile_shard(configs, "cpu", {"kind": "cpu", "threads": threads}, settings, journal,
                                     progress=False, hardware=hardware)
    finally:
        busy.stop()
    wall = time.perf_counter() - started
    return traces.assign(device="cpu", trace_file=str(journal)), disturbed_keys(journal, busy.window), wall


def summarise(policy: str, traces: pd.DataFrame, disturbed: set[tuple[str, int]], wall: float) -> dict[str, Any]:
    runs = aggregate_runs(traces)
    per_run = traces.drop_duplicates(["config_id", "repeat"]).set_index(["config_id", "repeat"])
    flagged = {k for k in per_run.index if per_run.loc[k, "interference"]}
    remeasured = {k for k in per_run.index if per_run.loc[k, "attempts"] > 1}
    clean = drop_flagged_runs(runs, traces)
    noise_all, noise_clean = noise_floor(runs), noise_floor(clean)
    latency = lambda n: n.loc[n["target"] == "latency_ms"].iloc[0] if len(n) else None  # noqa: E731
    all_row, clean_row = latency(noise_all), latency(noise_clean)
    return {
        "policy": policy, "measurements": len(per_run), "disturbed": len(disturbed),
        "re-measured": len(disturbed & remeasured), "still flagged": len(disturbed & flagged),
        "disturbed, neither": len(disturbed - remeasured - flagged),
        "flagged, undisturbed": len(flagged - disturbed),
        "noise floor, all pairs %": all_row["noise_mape"] if all_row is not None else float("nan"),
        "noise floor, clean pairs %": clean_row["noise_mape"] if clean_row is not None else float("nan"),
        "clean pairs": int(clean_row["pairs"]) if clean_row is not None else 0,
        "profiling s": wall,
        "report": health_line(status_counts(runs, traces), noise_clean, [], 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    parser.add_argument("--device", default="cpu", help="a cpu device of the config (its threads are used)")
    parser.add_argument("--configs", type=int, default=0, help="first N configs (0: every 2nd of the zoo)")
    parser.add_argument("--busy-after-s", type=float, default=20.0)
    parser.add_argument("--busy-for-s", type=float, default=60.0)
    parser.add_argument("--out", help="CSV of every measurement with its flags")
    args = parser.parse_args()
    config = load_config(args.config)
    threads = int(config["devices"][args.device]["threads"])
    manifest = manifest_frame(expand_zoo(config))
    picked = (manifest.head(args.configs) if args.configs else manifest.iloc[::2]).assign(shard="bench")
    base = {**config["profiling"], "threads": threads, "num_classes": config["zoo"]["num_classes"]}
    policies = {"detection": base, "no detection": {**base, "interference": UNJUDGED}}
    run_isolated("cpu", picked.iloc[0].to_dict(), base)  # start the worker server before timing anything
    rows, frames = [], []
    for policy, settings in policies.items():
        with tempfile.TemporaryDirectory() as folder:
            busy = BusyCore(sorted(os.sched_getaffinity(0))[0], args.busy_after_s, args.busy_for_s)
            traces, disturbed, wall = profile_under_load(picked, settings, threads, busy, Path(folder))
        rows.append(summarise(policy, traces, disturbed, wall))
        frames.append(traces.drop_duplicates(["config_id", "repeat"]).assign(policy=policy))
    table = pd.DataFrame(rows)
    print(f"{len(picked)} configs, {threads} threads, busy core from {args.busy_after_s:g} s for "
          f"{args.busy_for_s:g} s of each policy's run\n")
    print(table.drop(columns="report").to_markdown(index=False, floatfmt=".1f"))
    for row in rows:
        print(f"\nreport's first screen ({row['policy']}): {row['report']}")
    if args.out:
        pd.concat(frames).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
