"""Latency noise floor of measurement protocols, side by side in one run on the same configs.

    python bench/noise_floor.py                          # every 4th config of the default zoo, 3 windows
    python bench/noise_floor.py --configs 3 --max-time-s 0.1 --windows 2   # a quick check that it runs
    python bench/noise_floor.py --protocols detection,detection_spread     # the spread check's cost and gain
    python bench/noise_floor.py --traces /tmp/run-a/results /tmp/run-b/results   # offline: finished runs

Every config is measured twice, independently (repeat 0, then repeat 1 after all configs), by each
protocol; the protocols take turns config by config, so they see the same machine. The noise floor of a
protocol is the MAPE of its repeat-1 latencies against its repeat-0 ones (as the dataset stage computes
it); its profiling time is the wall time of its own measurements.

* ``current``: one isolated worker per config, warm-up, iterations until the CI / ``max_iters`` /
  ``max_time_s`` stop (the profiler's protocol; the worker runs the calibration probe around it);
* ``probe_normalised``: the same measurements divided by the probe's ratio to its baseline (mean of the
  GEMM and copy ratios before and after), i.e. latency at the machine's baseline speed (its profiling
  time is that of ``current``: no measurement of its own);
* ``interleaved``: ``--windows`` shorter measurements (``max_time_s / windows`` each) per repeat, spread
  over the run in rounds, and the median of the per-window medians;
* ``pinned``: as ``current`` with the worker pinned to the first ``threads`` CPUs (the forkserver's
  affinity is set before the worker is forked, and restored after); ``pinned_last``: to the last ``threads``
  CPUs (away from CPU 0, where the kernel and this process more often run);
* ``one_thread``: as ``current`` with one intra-op thread instead of the device's ``threads`` (a
  measurement that waits for the slowest of several threads feels any other process on any core);
  its latencies are those of another device setting, so only its noise floor and time compare;
* ``detection``: as the profile rule does it, the config's ``profiling.interference`` policy without the
  spread check: measured, and re-measured after ``wait_s`` (at most ``retries`` times) while the policy
  finds it disturbed; the attempt it keeps is the latency, its time includes every attempt and wait;
* ``detection_spread``: the same with the config's ``spread_tolerance`` (a window whose median iteration
  is more than ``1 + spread_tolerance`` times its fastest is disturbed). Both come from one chain of
  attempts (the spread check only adds reasons, so its chain is never shorter): ``detection`` keeps the
  first attempt it accepts, ``detection_spread`` goes on while the spread check still objects. Their
  re-measured and still-flagged windows are counted.

* ``gemm_normalised``: ``current``'s measurements divided by the geometric mean of the probe's GEMM times
  before and after the window over the baseline's (the GEMM part alone: the part that follows the machine's
  compute speed; the copy part does not, ``bench/RESULTS.md``);
* ``detection_spread_gemm``: ``detection_spread``'s kept attempt normalised the same way;
* ``held``: the first window as ``current`` measures it but with ``min_iters`` split between the two windows
  (:func:`perfzoo.profiling.runner.per_window`, as the profile rule splits it), in a worker that is then kept,
  model built, while the next ``--held-lag`` configs are measured, and times the same step again in a second
  window (one warm-up step first); the latency is the median of the two windows' medians (their mean), the
  time both windows' workers' (:class:`perfzoo.profiling.worker.HeldWorker`). ``held_first`` is its first
  window alone (no time of its own). At the end of each repeat's pass the workers still held take their
  second windows in turn.
* ``window_1s``, ``window_2s``: as ``current`` with a window of fixed length (iterations until 1 s / 2 s have
  passed, at least ``min_iters``; no CI or iteration-count stop), where ``current`` stops a window of a fast
  config after 5-30 iterations (a median of ~0.35 s in a default run): a speed that changes over seconds is
  averaged over more of its changes.

``--protocols`` measures only the named ones (``probe_normalised`` and ``gemm_normalised`` come with
``current``, ``detection_spread_gemm`` with ``detection_spread``).

``--traces`` measures nothing: for each finished run's ``results`` folder it reads the traces
(``traces/<device>/<shard>.parquet``) and prints, per spread tolerance of ``--tolerances``, the windows
(config, repeat) whose median iteration exceeds ``1 + tolerance`` times their fastest and the latency noise
floor of the repeat pairs where neither window does; then, per run and device, the noise floor of the labels and
of the labels divided by the probe's GEMM time (traces that keep ``probe_gemm_ms``).

The table is printed as Markdown; ``--out`` also writes the per-config latencies as CSV.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from this_checkout import use_this_checkout  # noqa: E402

ROOT = use_this_checkout()

import pandas as pd  # noqa: E402
import psutil  # noqa: E402

from perfzoo.config import load_config  # noqa: E402
from perfzoo.profiling.interference import (  # noqa: E402
    Policy,
    assess,
    probe_baseline,
    probe_times_ms,
    spread_ratio,
)
from perfzoo.profiling.runner import per_window, worker_settings  # noqa: E402
from perfzoo.profiling.worker import HeldWorker, run_isolated, start_held  # noqa: E402
from perfzoo.stats import mape  # noqa: E402
from perfzoo.models.zoo import expand_zoo, manifest_frame  # noqa: E402

PROTOCOLS = ("current", "probe_normalised", "gemm_normalised", "interleaved", "pinned", "one_thread", "detection",
             "detection_spread", "detection_spread_gemm", "window_1s", "window_2s", "pinned_last", "held",
             "held_first")
WINDOWS_S = {"window_1s": 1.0, "window_2s": 2.0}
"""Fixed-length windows: iterations for this long whatever the CI (at least ``min_iters``)."""
DERIVED = {"probe_normalised": "current", "gemm_normalised": "current", "detection_spread_gemm": "detection_spread",
           "held_first": "held"}
"""Protocols computed from another's measurements (no measurement of their own)."""


def pin_workers(cpus: set[int] | None) -> None:
    """Set the affinity new workers inherit (the forkserver's); ``None`` gives them every CPU back."""
    target = cpus or os.sched_getaffinity(0)
    for child in psutil.Process().children():
        if "forkserver" in " ".join(child.cmdline()):
            child.cpu_affinity(sorted(target))


def measure(config: dict[str, Any], settings: dict[str, Any]) -> tuple[float, dict[str, Any], float]:
    """(median latency ms, the measurement's interference record, wall seconds) of one isolated run."""
    start = time.perf_counter()
    outcome = run_isolated("cpu", config, settings)
    wall = time.perf_counter() - start
    if outcome.status != "ok" or not outcome.measurement:
        return float("nan"), {}, wall
    m = outcome.measurement
    return statistics.median(m["times_ms"]), m["extra"].get("interference", {}), wall


def speed_ratio(record: dict[str, Any], baseline: dict[str, Any]) -> float:
    """Mean probe / baseline ratio of a measurement (NaN without probes or baseline)."""
    probes = record.get("probes") or []
    if not probes or "gemm_ms" not in baseline:
        return float("nan")
    return statistics.mean(r for p in probes for r in (p["gemm_ms"] / baseline["gemm_ms"],
                                                       p["copy_ms"] / baseline["copy_ms"]))


def gemm_ratio(record: dict[str, Any], baseline: dict[str, Any]) -> float:
    """The probe's GEMM time (as the trace keeps it, :func:`probe_times_ms`) over the baseline's (NaN without)."""
    if "gemm_ms" not in baseline:
        return float("nan")
    return probe_times_ms(record.get("probes") or [])[0] / baseline["gemm_ms"]


def detection_rows(config: dict[str, Any], repeat: int, settings: dict[str, Any],
                   baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of ``detection`` and ``detection_spread`` for one (config, repeat), from one chain of attempts."""
    with_spread = Policy.from_settings(settings)
    policies = {"detection": dataclasses.replace(with_spread, spread_tolerance=None),
                "detection_spread": with_spread}
    rows: dict[str, dict[str, Any]] = {}
    spent, first_spread = 0.0, float("nan")
    for attempt in range(with_spread.retries + 1):
        if attempt:
            time.sleep(with_spread.wait_s)
            spent += with_spread.wait_s
        start = time.perf_counter()
        outcome = run_isolated("cpu", config, settings)
        spent += time.perf_counter() - start
        m = outcome.measurement if outcome.status == "ok" else None
        times = m["times_ms"] if m else []
        if attempt == 0:
            first_spread = spread_ratio(times)
        for name, policy in policies.items():
            if name in rows:
                continue
            reason = assess(m, baseline, policy).interference
            if not m or not reason or attempt == policy.retries:
                rows[name] = {"protocol": name, "config_id": config["config_id"], "repeat": repeat,
                              "latency_ms": statistics.median(times) if times else float("nan"),
                              "wall_s": spent, "attempts": attempt + 1, "interference": reason,
                              "first_spread": first_spread}
                if name == "detection_spread":
                    ratio = gemm_ratio(m["extra"].get("interference", {}) if m else {}, baseline)
                    rows["detection_spread_gemm"] = {**rows[name], "protocol": "detection_spread_gemm",
                                                     "latency_ms": rows[name]["latency_ms"] / ratio}
        if len(rows) == len(policies) + 1:
            break
    return list(rows.values())


@dataclass
class Held:
    """A ``held`` measurement waiting for its second window."""

    config_id: str
    repeat: int
    worker: HeldWorker
    first_ms: float
    wall_s: float
    at: float


def start_held_row(config: dict[str, Any], repeat: int, settings: dict[str, Any]) -> Held | dict[str, Any]:
    """The first window of ``held``, its worker kept; a failed one's row at once."""
    start = time.perf_counter()
    outcome, worker = start_held("cpu", config, per_window(settings))
    wall = time.perf_counter() - start
    if worker is None:
        return {"protocol": "held", "config_id": config["config_id"], "repeat": repeat,
                "latency_ms": float("nan"), "wall_s": wall}
    return Held(config["config_id"], repeat, worker, statistics.median(outcome.measurement["times_ms"]), wall,
                time.perf_counter())


def finish_held(held: Held) -> list[dict[str, Any]]:
    """The rows of ``held`` (median of the two windows' medians) and ``held_first`` of one measurement."""
    start = time.perf_counter()
    outcome = held.worker.again()
    held.worker.close()
    wall = held.wall_s + time.perf_counter() - start
    second = (statistics.median(outcome.measurement["times_ms"]) if outcome.status == "ok" and outcome.measurement
              else float("nan"))
    ident = {"config_id": held.config_id, "repeat": held.repeat}
    return [{"protocol": "held", **ident, "latency_ms": statistics.median([held.first_ms, second]),
             "wall_s": wall, "separation_s": start - held.at, "second_over_first": second / held.first_ms},
            {"protocol": "held_first", **ident, "latency_ms": held.first_ms, "wall_s": 0.0}]


def run(configs: list[dict[str, Any]], settings: dict[str, Any], windows: int, threads: int,
        protocols: set[str], held_lag: int = 6) -> pd.DataFrame:
    """Latency per (protocol, config, repeat), and the wall time each measurement took."""
    baseline = probe_baseline("cpu", threads)
    short = {**settings, "max_time_s": settings["max_time_s"] / windows}
    single = {**settings, "threads": 1}
    pinned = set(sorted(os.sched_getaffinity(0))[:threads])
    pinned_last = set(sorted(os.sched_getaffinity(0))[-threads:])
    run_isolated("cpu", configs[0], settings)  # start the worker server before timing anything
    rows: list[dict[str, Any]] = []
    per_window: dict[tuple[str, int], list[float]] = {}
    held: list[Held] = []
    for repeat in (0, 1):
        for window in range(windows if "interleaved" in protocols else 1):
            for config in configs:
                cid = config["config_id"]
                if window == 0 and "held" in protocols:
                    started = start_held_row(config, repeat, settings)
                    if isinstance(started, Held):
                        held.append(started)
                    else:
                        rows.append(started)
                    if len(held) > held_lag:
                        rows += finish_held(held.pop(0))
                if window == 0 and "current" in protocols:
                    latency, record, wall = measure(config, settings)
                    rows.append({"protocol": "current", "config_id": cid, "repeat": repeat,
                                 "latency_ms": latency, "wall_s": wall})
                    rows.append({"protocol": "probe_normalised", "config_id": cid, "repeat": repeat,
                                 "latency_ms": latency / speed_ratio(record, baseline), "wall_s": wall})
                    rows.append({"protocol": "gemm_normalised", "config_id": cid, "repeat": repeat,
                                 "latency_ms": latency / gemm_ratio(record, baseline), "wall_s": wall})
                for name, length in WINDOWS_S.items():
                    if window == 0 and name in protocols:
                        fixed = {**settings, "max_time_s": length, "ci_target": -1.0, "max_iters": 10**6}
                        latency, _, wall = measure(config, fixed)
                        rows.append({"protocol": name, "config_id": cid, "repeat": repeat,
                                     "latency_ms": latency, "wall_s": wall})
                for name, cpus in (("pinned", pinned), ("pinned_last", pinned_last)):
                    if window == 0 and name in protocols:
                        pin_workers(cpus)
                        try:
                            latency, _, wall = measure(config, settings)
                        finally:
                            pin_workers(None)
                        rows.append({"protocol": name, "config_id": cid, "repeat": repeat,
                                     "latency_ms": latency, "wall_s": wall})
                if window == 0 and "one_thread" in protocols:
                    latency, _, wall = measure(config, single)
                    rows.append({"protocol": "one_thread", "config_id": cid, "repeat": repeat,
                                 "latency_ms": latency, "wall_s": wall})
                if window == 0 and protocols & {"detection", "detection_spread"}:
                    rows += detection_rows(config, repeat, settings, baseline)
                if "interleaved" in protocols:
                    latency, _, wall = measure(config, short)
                    per_window.setdefault((cid, repeat), []).append(latency)
                    rows.append({"protocol": "interleaved_window", "config_id": cid, "repeat": repeat,
                                 "latency_ms": latency, "wall_s": wall})
        while held:  # the pass's last configs: their second windows in turn
            rows += finish_held(held.pop(0))
    frame = pd.DataFrame(rows)
    if "interleaved" not in protocols:
        return frame
    window_rows = frame[frame["protocol"] == "interleaved_window"]
    windows_wall = window_rows.groupby(["config_id", "repeat"])["wall_s"].sum()
    interleaved = [{"protocol": "interleaved", "config_id": cid, "repeat": repeat,
                    "latency_ms": statistics.median(values), "wall_s": windows_wall[(cid, repeat)]}
                   for (cid, repeat), values in per_window.items()]
    return pd.concat([frame[frame["protocol"] != "interleaved_window"], pd.DataFrame(interleaved)],
                     ignore_index=True)


def summary(latencies: pd.DataFrame) -> pd.DataFrame:
    """Per protocol measured: pairs, noise floor, profiling time; re-measured and still-flagged windows."""
    rows = []
    for protocol in [p for p in PROTOCOLS if p in set(latencies["protocol"])]:
        g = latencies[latencies["protocol"] == protocol]
        pairs = g.pivot(index="config_id", columns="repeat", values="latency_ms").dropna()
        row = {"protocol": protocol, "configs": len(pairs),
               "noise_floor_mape_pct": mape(pairs[0].to_numpy(), pairs[1].to_numpy()),
               "profiling_time_s": g["wall_s"].sum()}
        if "attempts" in g and g["attempts"].notna().all():
            row["re_measured"] = int((g["attempts"] > 1).sum())
            row["still_flagged"] = int((g["interference"] != "").sum())
        rows.append(row)
    return pd.DataFrame(rows)


def trace_windows(results: Path) -> pd.DataFrame:
    """One row per measured window (device, config, repeat) of a finished run: median latency and spread."""
    files = [f for f in sorted(results.glob("traces/*/*.parquet")) if f.name.count(".") == 1]
    if not files:
        raise SystemExit(f"{results}: no traces/<device>/<shard>.parquet")
    traces = pd.concat([pd.read_parquet(f).assign(device=f.parent.name) for f in files], ignore_index=True)
    ok = traces[traces["status"] == "ok"]
    gemm = {"probe_gemm_ms": ("probe_gemm_ms", "first")} if "probe_gemm_ms" in ok.columns else {}  # older traces lack it
    windows = ok.groupby(["device", "config_id", "repeat"]).agg(
        latency_ms=("time_ms", "median"), iterations=("time_ms", "size"),
        spread=("time_ms", lambda t: spread_ratio(list(t))), **gemm).reset_index()
    if gemm:
        windows["latency_per_gemm"] = windows["latency_ms"] / windows["probe_gemm_ms"]
    return windows


def pair_floor(windows: pd.DataFrame, column: str) -> float:
    """MAPE of the second measurement's ``column`` against the first's, over the configs that have both."""
    pairs = windows.pivot(index="config_id", columns="repeat", values=column).dropna()
    return mape(pairs[0].to_numpy(), pairs[1].to_numpy()) if {0, 1} <= set(pairs.columns) and len(pairs) else math.nan


def gemm_table(runs: list[Path]) -> pd.DataFrame:
    """Per run and device: the latency noise floor of the labels and of the labels over the probe's GEMM time
    (``probe_gemm_ms`` of the traces; NaN for traces without it)."""
    rows = []
    for results in runs:
        windows = trace_windows(results)
        for device, w in windows.groupby("device"):
            floors = {column: pair_floor(w, column) if column in w else math.nan
                      for column in ("latency_ms", "latency_per_gemm")}
            rows.append({"run": str(results), "device": device, "pairs": int((w["repeat"] == 1).sum()),
                         "noise floor %": floors["latency_ms"], "over the GEMM probe %": floors["latency_per_gemm"]})
    return pd.DataFrame(rows)


def spread_table(runs: list[Path], tolerances: list[float]) -> pd.DataFrame:
    """Per run and tolerance: windows over it, and the noise floor of the pairs with neither window over."""
    rows = []
    for results in runs:
        windows = trace_windows(results)
        for tolerance in [None, *tolerances]:
            over = windows["spread"] > (1 + tolerance if tolerance is not None else math.inf)
            kept = windows.assign(over=over).pivot(index=["device", "config_id"], columns="repeat",
                                                   values=["latency_ms", "over"]).dropna()
            kept = kept[~kept["over"].any(axis=1).astype(bool)]
            rows.append({"run": str(results), "tolerance": "none" if tolerance is None else f"{tolerance:g}",
                         "windows": len(windows),
                         "over": int(over.sum()), "over %": 100 * over.mean(),
                         "of them <= 5 iterations": int((over & (windows["iterations"] <= 5)).sum()),
                         "noise floor of the pairs left %": mape(kept["latency_ms"][0].to_numpy(),
                                                                 kept["latency_ms"][1].to_numpy()),
                         "pairs left": len(kept)})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    parser.add_argument("--device", default="cpu", help="a cpu device of the config (its threads are used)")
    parser.add_argument("--configs", type=int, default=0, help="first N configs (0: every 4th of the zoo)")
    parser.add_argument("--every", type=int, default=4, help="every N-th config of the zoo (without --configs)")
    parser.add_argument("--windows", type=int, default=3, help="windows per interleaved repeat")
    parser.add_argument("--held-lag", type=int, default=6, help="configs measured while a held worker waits")
    parser.add_argument("--max-time-s", type=float, default=None, help="override profiling.max_time_s")
    parser.add_argument("--protocols", default=",".join(p for p in PROTOCOLS if p not in DERIVED),
                        help="comma-separated protocols to measure (default: all)")
    parser.add_argument("--out", help="CSV of every latency")
    parser.add_argument("--traces", nargs="+", type=Path, help="offline: finished runs' results folders")
    parser.add_argument("--tolerances", default="0.1,0.15,0.2,0.25,0.3,0.4",
                        help="spread tolerances of the --traces table")
    args = parser.parse_args()
    if args.traces:
        table = spread_table(args.traces, [float(t) for t in args.tolerances.split(",")])
        print(table.to_markdown(index=False, floatfmt=".1f"))
        print()
        print(gemm_table(args.traces).to_markdown(index=False, floatfmt=".2f"))
        return
    protocols = set(args.protocols.split(","))
    if unknown := protocols - set(PROTOCOLS):
        parser.error(f"--protocols: unknown {sorted(unknown)} (known: {', '.join(PROTOCOLS)})")
    config = load_config(args.config)
    threads = int(config["devices"][args.device]["threads"])
    manifest = manifest_frame(expand_zoo(config))
    picked = manifest.head(args.configs) if args.configs else manifest.iloc[::args.every]
    settings = worker_settings(config["profiling"], config["devices"][args.device], config["zoo"]["num_classes"])
    if args.max_time_s is not None:
        settings["max_time_s"] = args.max_time_s
    started = time.perf_counter()
    latencies = run(picked.to_dict("records"), settings, args.windows, threads, protocols, args.held_lag)
    table = summary(latencies)
    print(f"{len(picked)} configs, {threads} threads, max_time_s {settings['max_time_s']:g}, "
          f"{args.windows} windows; {time.perf_counter() - started:.0f} s in all\n")
    print(table.to_markdown(index=False, floatfmt=".2f"))
    if "separation_s" in latencies:
        held = latencies[latencies["protocol"] == "held"]
        print(f"\nheld: seconds between the two windows' starts, median {held['separation_s'].median():.1f} "
              f"(min {held['separation_s'].min():.1f}); second window over first, median "
              f"{held['second_over_first'].median():.3f} (5-95 %: {held['second_over_first'].quantile(0.05):.3f}-"
              f"{held['second_over_first'].quantile(0.95):.3f})")
    if args.out:
        latencies.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
