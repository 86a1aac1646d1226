"""Profiling under a competing load, with and without interference detection, on the same configs.

    python bench/loaded_run.py                      # every 2nd config of the default zoo, load on one core
    python bench/loaded_run.py --configs 6 --busy-after-s 2 --busy-for-s 6   # a quick check that it runs

For each policy the configs are profiled by the real shard runner (``profile_shard_with_ops``, the profile rule's
code) with the config's measurement settings (repeats every ``repeat_every`` configs, as in a run). A
busy process pinned to one CPU (to each of the first ``--busy-cores`` CPUs) is started ``--busy-after-s``
seconds into the shard and killed by its own PID ``--busy-for-s`` seconds later. A measurement is
*disturbed* when the first attempt of any of its windows overlaps that window (``profiling.windows: 2``: the
first window, or the second one timed after the shard's other first windows); *re-measured* when any of its
windows was measured (first window) or timed (second window) more than once.

* ``detection``: the config's ``profiling.interference`` policy (flags, re-measures after ``wait_s``);
* ``detection without spread``: the same without the spread check (``spread_tolerance`` null), i.e. judged
  only by evidence from outside the measurement;
* ``no detection``: nothing is judged (tolerances out of reach, no retries): what every run did before;
* ``no busy core, no detection``: the reference pass, without the busy process.

Printed per policy: disturbed measurements, how many were re-measured and how many stay flagged, disturbed
ones that are neither (should be 0 with detection), the noise floor (repeat 1 against repeat 0) of all pairs
and of the pairs whose two measurements are unflagged, the profiling time, and the report's first-screen
line with its warning. Then, per policy, the measured slowdown of the kept measurements that overlapped
the window (those measured once), and of those that did not: their latency over the same measurement's in
the reference pass, so "disturbed" (overlapped) can be told from "slowed down". ``--out`` writes the
per-measurement rows (with the kept window's median / fastest iteration, ``spread``) as CSV.
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

from this_checkout import use_this_checkout  # noqa: E402

ROOT = use_this_checkout()

import pandas as pd  # noqa: E402

from perfzoo.config import load_config  # noqa: E402
from perfzoo.dataset.build import aggregate_runs, noise_floor, status_counts  # noqa: E402
from perfzoo.models.zoo import expand_zoo, manifest_frame  # noqa: E402
from perfzoo.profiling.interference import drop_flagged_runs, probe_baseline, spread_ratio  # noqa: E402
from perfzoo.profiling.runner import profile_shard_with_ops, worker_settings  # noqa: E402
from perfzoo.profiling.worker import run_isolated  # noqa: E402
from perfzoo.report.page import health_line  # noqa: E402

BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
REFERENCE = "no busy core, no detection"
UNJUDGED = {"tolerance": None, "load_tolerance": 1e9, "steal_tolerance": 1e9, "spread_tolerance": None,
            "retries": 0, "wait_s": 0}


class BusyCores:
    """A busy loop on each of ``cpus`` from ``after_s`` to ``after_s + for_s`` seconds after :meth:`start`."""

    def __init__(self, cpus: list[int], after_s: float, for_s: float) -> None:
        self.cpus, self.after_s, self.for_s = cpus, after_s, for_s
        self.window: dict[str, float] = {}
        self._processes: list[subprocess.Popen] = []
        self._timers: list[threading.Timer] = []

    def start(self) -> None:
        self._timers = [threading.Timer(self.after_s, self._begin),
                        threading.Timer(self.after_s + self.for_s, self.stop)]
        for timer in self._timers:
            timer.start()

    def _begin(self) -> None:
        self._processes = [subprocess.Popen([sys.executable, "-c", BUSY, str(cpu)]) for cpu in self.cpus]
        self.window["start"] = time.time()

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        running = [process for process in self._processes if process.poll() is None]
        for process in running:
            os.kill(process.pid, 9)
            process.wait()
        if running:
            self.window["end"] = time.time()


def window_attempts(journal: Path) -> dict[tuple[str, int], list[list[dict[str, Any]]]]:
    """Per (config_id, repeat): the attempts of each of its windows (the first, then any later ones)."""
    attempts = {}
    for line in journal.read_text().splitlines()[1:]:
        entry = json.loads(line)
        config_id, repeat = entry["key"].split("/")[:2]
        attempts[(config_id, int(repeat))] = [entry["attempts"], *(w.get("attempts") or []
                                                                   for w in entry.get("later_windows") or [])]
    return attempts


def disturbed_keys(journal: Path, window: dict[str, float]) -> set[tuple[str, int]]:
    """(config_id, repeat) of the measurements one of whose windows' first attempt overlapped the busy window."""
    if "start" not in window:
        return set()
    return {key for key, windows in window_attempts(journal).items()
            if any(w and w[0]["started"] < window["end"] and w[0]["finished"] > window["start"] for w in windows)}


def retimed_keys(journal: Path) -> set[tuple[str, int]]:
    """(config_id, repeat) of the measurements one of whose windows was taken more than once."""
    return {key for key, windows in window_attempts(journal).items() if any(len(w) > 1 for w in windows)}


def profile_under_load(
    configs: pd.DataFrame, settings: dict[str, Any], threads: int, busy: BusyCores | None, folder: Path
) -> tuple[pd.DataFrame, set[tuple[str, int]], float]:
    """Traces (as the dataset stage reads them), the disturbed measurements and the wall time; ``busy``
    None: no busy core (the reference pass)."""
    hardware = {"measurement_setting": {"threads": threads}, "probe_baseline": probe_baseline("cpu", threads)}
    journal = folder / "journal.jsonl"
    started = time.perf_counter()
    if busy is not None:
        busy.start()
    try:
        traces = profile_shard_with_ops(configs, "cpu", {"kind": "cpu", "threads": threads}, settings, journal,
                                        progress=False, hardware=hardware).traces
    finally:
        if busy is not None:
            busy.stop()
    wall = time.perf_counter() - started
    disturbed = disturbed_keys(journal, busy.window) if busy is not None else set()
    traces = traces.assign(device="cpu", trace_file=str(journal), retimed=False)
    for config_id, repeat in retimed_keys(journal):
        traces.loc[(traces["config_id"] == config_id) & (traces["repeat"] == repeat), "retimed"] = True
    return traces, disturbed, wall


def summarise(policy: str, traces: pd.DataFrame, disturbed: set[tuple[str, int]], wall: float) -> dict[str, Any]:
    runs = aggregate_runs(traces)
    per_run = traces.drop_duplicates(["config_id", "repeat"]).set_index(["config_id", "repeat"])
    flagged = {k for k in per_run.index if per_run.loc[k, "interference"]}
    remeasured = {k for k in per_run.index if per_run.loc[k, "attempts"] > 1 or per_run.loc[k, "retimed"]}
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


def per_measurement(traces: pd.DataFrame, disturbed: set[tuple[str, int]]) -> pd.DataFrame:
    """One row per (config, repeat): the kept window's median latency and spread, its flags, the other
    processes' load and the steal time over it, and whether its first attempt overlapped the busy window."""
    ok = traces[traces["status"] == "ok"]
    windows = ok.groupby(["config_id", "repeat"])["time_ms"].agg(
        latency_ms="median", spread=lambda t: spread_ratio(list(t))).reset_index()
    runs = traces.drop_duplicates(["config_id", "repeat"])
    runs = runs[["config_id", "repeat", "interference", "attempts", "other_cpu_load", "steal_frac",
                 "probe_ratio"]]
    table = runs.merge(windows, on=["config_id", "repeat"], how="left")
    table["overlapped"] = [(c, int(r)) in disturbed for c, r in zip(table["config_id"], table["repeat"])]
    return table


def slowdown(measurements: pd.DataFrame, reference: pd.DataFrame) -> pd.Series:
    """Latency of each measurement over the same (config, repeat)'s in ``reference`` (indexed by them)."""
    ref = reference["latency_ms"].reindex(pd.MultiIndex.from_frame(measurements[["config_id", "repeat"]]))
    return pd.Series(measurements["latency_ms"].to_numpy() / ref.to_numpy(), dtype="float64").dropna()


def slowdowns(measurements: pd.DataFrame, spread_tolerance: float | None) -> pd.DataFrame:
    """Per policy: latency of each kept measurement that overlapped the busy window (its only attempt) over
    the latency of the same (config, repeat) in the reference pass without a busy core."""
    reference = measurements[measurements["policy"] == REFERENCE].set_index(["config_id", "repeat"])
    rows = []
    for policy, g in measurements[measurements["policy"] != REFERENCE].groupby("policy", sort=False):
        hit = g[g["overlapped"] & (g["attempts"] == 1)]
        s, others = slowdown(hit, reference), slowdown(g[~g["overlapped"]], reference)
        row = {"policy": policy, "overlapped, kept as measured": len(hit), "with a reference": len(s),
               "slowdown median": s.median(), "slowdown max": s.max(), "slowed > 10 %": int((s > 1.1).sum()),
               "not overlapped: slowdown median": others.median(), "max": others.max()}
        if spread_tolerance is not None:
            row[f"spread > {1 + spread_tolerance:g}"] = int((hit["spread"] > 1 + spread_tolerance).sum())
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    parser.add_argument("--device", default="cpu", help="a cpu device of the config (its threads are used)")
    parser.add_argument("--configs", type=int, default=0, help="first N configs (0: every 2nd of the zoo)")
    parser.add_argument("--busy-after-s", type=float, default=20.0)
    parser.add_argument("--busy-for-s", type=float, default=60.0)
    parser.add_argument("--busy-cores", type=int, default=1, help="busy loops, one per CPU from the first")
    parser.add_argument("--out", help="CSV of every measurement with its flags")
    args = parser.parse_args()
    config = load_config(args.config)
    threads = int(config["devices"][args.device]["threads"])
    manifest = manifest_frame(expand_zoo(config))
    picked = (manifest.head(args.configs) if args.configs else manifest.iloc[::2]).assign(shard="bench")
    base = worker_settings(config["profiling"], config["devices"][args.device], config["zoo"]["num_classes"])
    without_spread = {**base["interference"], "spread_tolerance": None}
    policies = {"detection": base, "detection without spread": {**base, "interference": without_spread},
                "no detection": {**base, "interference": UNJUDGED},
                REFERENCE: {**base, "interference": UNJUDGED}}
    run_isolated("cpu", picked.iloc[0].to_dict(), base)  # start the worker server before timing anything
    rows, frames = [], []
    for policy, settings in policies.items():
        with tempfile.TemporaryDirectory() as folder:
            busy = (BusyCores(sorted(os.sched_getaffinity(0))[:args.busy_cores], args.busy_after_s,
                              args.busy_for_s)
                    if policy != REFERENCE else None)
            traces, disturbed, wall = profile_under_load(picked, settings, threads, busy, Path(folder))
        rows.append(summarise(policy, traces, disturbed, wall))
        frames.append(per_measurement(traces, disturbed).assign(policy=policy))
    table = pd.DataFrame(rows)
    measurements = pd.concat(frames, ignore_index=True)
    print(f"{len(picked)} configs, {threads} threads, {args.busy_cores} busy core(s) from "
          f"{args.busy_after_s:g} s for {args.busy_for_s:g} s of each policy's run\n")
    print(table.drop(columns="report").to_markdown(index=False, floatfmt=".1f"))
    for row in rows:
        print(f"\nreport's first screen ({row['policy']}): {row['report']}")
    print("\nslowdown of the kept measurements that overlapped the busy window (measured once), against the "
          f"same measurement in the {REFERENCE!r} pass:\n")
    tolerance = base["interference"].get("spread_tolerance")
    print(slowdowns(measurements, tolerance).to_markdown(index=False, floatfmt=".2f"))
    if args.out:
        measurements.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
