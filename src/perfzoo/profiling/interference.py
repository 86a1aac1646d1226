"""Interference: was the machine quiet while a config was measured?

Two kinds of evidence from outside the measured config (a steady slowdown makes a config's own iterations
look perfectly consistent, so its noise cannot reveal it):

* a calibration probe, run in the worker just before and just after the measurement: the best of a few
  runs of a small GEMM and of a memory copy, at the measurement's thread count (on CUDA on the GPU, with a
  synchronisation around each run). ``probe_ratio`` is the largest of (probe time / the device's own
  probe baseline) over both runs and both parts; the baseline is recorded by the hardware rule with the
  same code. A probe that fails, or a device without a baseline, leaves the ratio missing with a reason;
* what the operating system says over the measurement: CPU time used on the worker's CPUs by other
  processes (per-CPU busy time minus the worker's own CPU time, in CPUs; it disturbs when it exceeds
  the CPUs the worker leaves free, ``cpus - threads``, by ``load_tolerance``), hypervisor steal time
  (a fraction of those CPUs' time) and the worker's own CPU time per second of its window
  (``own_cpu_share``: a compute-bound step keeps at least its main thread running, so less than
  ``1 - cpu_share_tolerance`` of a CPU means another process held the worker's CPU, however little load
  the per-CPU counters attribute to others; CPU devices only, as a CUDA worker waits for its GPU); on CUDA
  the parent also reads NVML just before each measurement (:func:`perfzoo.profiling.nvml.gpu_state`).

and one from inside it: a window whose median iteration is more than ``1 + spread_tolerance`` times its
fastest one ran slow for part of its length (the machine slowed down or sped up mid-window), so its median,
the label, moved (:func:`spread_ratio`, on the iteration times of any device kind; not a trace column, as
the trace keeps every iteration it is computed from).

:class:`Policy` turns the evidence into an ``interference`` reason (empty when clean); the runner
re-measures a disturbed config after a bounded wait and keeps the last attempt, flagged if it is still
disturbed. :func:`drop_flagged_runs` keeps flagged measurements out of the fitted dataset and
:func:`flagged_per_device` counts them for the report.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
import psutil

from perfzoo.io import one_line
from perfzoo.profiling.core import Measurement

PROBE_GEMM_N = 256
PROBE_COPY_MB = 8
PROBE_REPEATS = 5
BASELINE_RUNS = 15
INTERFERENCE_TRACE_COLUMNS = ["probe_ratio", "probe_message", "other_cpu_load", "steal_frac", "interference",
                              "attempts", "memory_reference_mb", "probe_gemm_ms", "probe_copy_ms"]
"""Per-config interference columns written after the energy columns of every trace.

``probe_ratio``: probe time over the device's baseline (NaN, with ``probe_message`` saying why, when it
could not be computed); ``other_cpu_load``: CPUs' worth of time other processes used on the worker's CPUs
during the measurement; ``steal_frac``: hypervisor steal time as a fraction of those CPUs' time;
``interference``: '' when clean, else the reasons; ``attempts``: measurements made of the config (more
than one when a disturbed one was re-measured); ``memory_reference_mb``: the peak memory of the fixed
reference step (:mod:`perfzoo.profiling.reference`) measured when the shard started measuring (NaN on CUDA
or when it failed), so that labels measured in different states of the machine can be told apart;
``probe_gemm_ms`` / ``probe_copy_ms``: the probe's two parts as measured (geometric mean of the runs before and
after the window; NaN without a probe), kept raw so that a label can be set beside the machine's speed at its
moment (``bench/noise_floor.py --traces``; traces written before them lack the two columns)."""


@dataclass(frozen=True)
class ProbeTimes:
    """One calibration probe: best-of-``PROBE_REPEATS`` times of its two parts."""

    gemm_ms: float
    copy_ms: float


@dataclass(frozen=True)
class Policy:
    """When a measurement counts as disturbed, and what the runner does then (``profiling.interference``)."""

    tolerance: float | None = None  # probe slower than its baseline by more than this fraction; None: recorded only
    load_tolerance: float = 0.25  # other processes used this many CPUs more than the worker leaves free
    steal_tolerance: float = 0.05  # steal time above this fraction of the worker's CPU time
    spread_tolerance: float | None = None  # median above (1 + this) x the fastest iteration; None: not judged
    cpu_share_tolerance: float | None = None  # the worker ran less than (1 - this) of a CPU; None: not judged
    retries: int = 0  # re-measurements of a disturbed config
    wait_s: float = 0.0  # pause before each re-measurement

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Policy:
        return cls(**(settings.get("interference") or {}))


@dataclass(frozen=True)
class Assessment:
    """The verdict on one measurement (the trace's interference columns, less ``attempts``)."""

    probe_ratio: float
    probe_message: str
    other_cpu_load: float
    steal_frac: float
    interference: str
    probe_gemm_ms: float = math.nan
    probe_copy_ms: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_probe(kind: str, threads: int, gpu_index: int = 0) -> ProbeTimes:
    """Time the calibration probe on the cpu (``threads`` intra-op threads) or on ``cuda:{gpu_index}``."""
    import torch  # lazy: ~3 s import; the profiling parent never measures

    torch.set_num_threads(threads)
    device = f"cuda:{gpu_index}" if kind == "cuda" else "cpu"
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if kind == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(PROBE_GEMM_N, PROBE_GEMM_N, generator=gen).to(device)
    src = torch.ones(PROBE_COPY_MB * 1024 * 1024 // 4).to(device)
    dst = torch.empty_like(src)

    def best_ms(fn: Callable[[], Any]) -> float:
        fn()
        sync()
        times = []
        for _ in range(PROBE_REPEATS):
            t0 = time.perf_counter_ns()
            fn()
            sync()
            times.append((time.perf_counter_ns() - t0) / 1e6)
        return min(times)

    return ProbeTimes(best_ms(lambda: torch.mm(a, a)), best_ms(lambda: dst.copy_(src)))


def probe_baseline(kind: str, threads: int, gpu_index: int = 0, runs: int = BASELINE_RUNS) -> dict[str, Any]:
    """The device's probe baseline for the hardware record: the median over ``runs`` probes, or the reason
    it could not be measured (``{"missing": reason}``)."""
    try:
        probes = [run_probe(kind, threads, gpu_index) for _ in range(runs)]
    except Exception as exc:  # noqa: BLE001 - a device without a baseline gets missing ratios, not a guess
        return {"missing": f"probe failed: {one_line(exc)}"}
    return {"gemm_ms": statistics.median(p.gemm_ms for p in probes),
            "copy_ms": statistics.median(p.copy_ms for p in probes),
            "runs": runs, "threads": threads, "gemm_n": PROBE_GEMM_N, "copy_mb": PROBE_COPY_MB}


@dataclass(frozen=True)
class CpuSnapshot:
    """Cumulative CPU times of the worker's CPUs and of the worker itself at one moment."""

    t_s: float
    busy_s: float
    steal_s: float
    own_s: float
    cpus: int


def cpu_snapshot() -> CpuSnapshot:
    """Busy and steal time of the CPUs this process may run on, and this process's own CPU time."""
    per_cpu = psutil.cpu_times(percpu=True)
    mine = [per_cpu[i] for i in sorted(os.sched_getaffinity(0)) if i < len(per_cpu)]
    busy = sum(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) for t in mine)
    own = psutil.Process().cpu_times()
    return CpuSnapshot(time.monotonic(), busy, sum(getattr(t, "steal", 0.0) for t in mine),
                       own.user + own.system, len(mine))


MIN_COUNTED_WINDOW_S = 0.2
"""Shortest window the CPU counters judge: /proc counts CPU time in clock ticks (10 ms), and a worker that waits a
millisecond for the scheduler in a window of a few ms (the second window of a sub-millisecond step) shows a CPU
share of 0.8 without any other process; shorter windows leave load, steal and share NaN (not judged)."""


def cpu_window(before: CpuSnapshot, after: CpuSnapshot, own_share: bool = True) -> dict[str, float]:
    """Other processes' load (CPUs), the steal fraction and, with ``own_share``, the worker's own CPU time per
    second (``own_cpu_share``) between two snapshots; a window shorter than :data:`MIN_COUNTED_WINDOW_S` leaves
    them NaN."""
    wall = after.t_s - before.t_s
    own = after.own_s - before.own_s
    window = {"other_cpu_load": math.nan, "steal_frac": math.nan, "own_cpu_share": math.nan, "cpus": after.cpus,
              "window_s": wall}
    if wall >= MIN_COUNTED_WINDOW_S and after.cpus:
        window.update(other_cpu_load=max((after.busy_s - before.busy_s) - own, 0.0) / wall,
                      steal_frac=(after.steal_s - before.steal_s) / (wall * after.cpus), own_cpu_share=own / wall)
    if not own_share:
        del window["own_cpu_share"]
    return window


def observe(kind: str, settings: dict[str, Any], measure: Callable[[], Measurement]) -> Measurement:
    """Run ``measure`` between two probes; the probes and the OS's view go to ``extra["interference"]``."""
    threads, gpu_index = int(settings.get("threads", 1)), int(settings.get("gpu_index", 0))
    probes: list[dict[str, float]] = []
    errors: list[str] = []

    def probe() -> None:
        try:
            probes.append(asdict(run_probe(kind, threads, gpu_index)))
        except Exception as exc:  # noqa: BLE001 - a failed probe is a missing ratio with its reason
            errors.append(one_line(exc))

    probe()
    before = cpu_snapshot()
    result = measure()
    after = cpu_snapshot()
    probe()
    # a CUDA worker waits for its GPU: its CPU share says nothing
    window = cpu_window(before, after, own_share=kind == "cpu")
    result.extra["interference"] = {"probes": probes, "probe_error": "; ".join(errors), "threads": threads,
                                    **window}
    return result


def probe_ratio(probes: Sequence[dict[str, float]], error: str,
                baseline: dict[str, Any] | None) -> tuple[float, str]:
    """(largest probe / baseline ratio, '') or (NaN, why it is missing)."""
    if error:
        return math.nan, f"probe failed: {error}"
    if not baseline or "gemm_ms" not in baseline:
        why = (baseline or {}).get("missing", "the device's hardware record has no probe baseline")
        return math.nan, f"no baseline: {why}"
    if not probes:
        return math.nan, "no probe was run"
    gemm, copy = baseline["gemm_ms"], baseline["copy_ms"]
    return max(max(p["gemm_ms"] / gemm, p["copy_ms"] / copy) for p in probes), ""


def spread_ratio(times_ms: Sequence[float]) -> float:
    """Median iteration time over the fastest one (NaN without iterations or with a fastest time <= 0)."""
    fastest = min(times_ms, default=math.nan)
    return statistics.median(times_ms) / fastest if fastest > 0 else math.nan


def spread_reason(times_ms: Sequence[float], policy: Policy) -> str:
    """'median 1.31x the fastest iteration' when the window's spread exceeds the policy's, else ''."""
    ratio = spread_ratio(times_ms)
    if policy.spread_tolerance is None or not ratio > 1 + policy.spread_tolerance:
        return ""
    return f"median {ratio:.2f}x the fastest iteration"


def assess(measurement: dict[str, Any] | None, baseline: dict[str, Any] | None, policy: Policy,
           gpu_reasons: Sequence[str] = ()) -> Assessment:
    """The verdict on one outcome's measurement (a dict, as the worker sent it)."""
    info = ((measurement or {}).get("extra") or {}).get("interference")
    reasons = list(gpu_reasons)
    if spread := spread_reason((measurement or {}).get("times_ms") or [], policy):
        reasons.append(spread)
    if not info:
        return Assessment(math.nan, "no probe in this measurement", math.nan, math.nan, "; ".join(reasons))
    ratio, missing = probe_ratio(info.get("probes") or [], info.get("probe_error", ""), baseline)
    load, steal = float(info.get("other_cpu_load", math.nan)), float(info.get("steal_frac", math.nan))
    if policy.tolerance is not None and ratio > 1 + policy.tolerance:
        reasons.append(f"probe {ratio:.2f}x its baseline")
    cpus, threads = info.get("cpus"), info.get("threads")
    spare = max(int(cpus) - int(threads), 0) if cpus and threads else 0  # CPUs the worker leaves free
    if load > spare + policy.load_tolerance:
        reasons.append(f"other processes used {load:.2f} of {cpus} CPUs")
    if steal > policy.steal_tolerance:
        reasons.append(f"steal time {steal:.0%}")
    share = float(info.get("own_cpu_share", math.nan))
    if policy.cpu_share_tolerance is not None and share < 1 - policy.cpu_share_tolerance:
        reasons.append(f"the worker ran {share:.2f} of a CPU")
    return Assessment(ratio, missing, load, steal, "; ".join(reasons), *probe_times_ms(info.get("probes") or []))


def probe_times_ms(probes: Sequence[dict[str, float]]) -> tuple[float, float]:
    """(GEMM, copy) times of a measurement's probes, each the geometric mean over the probe runs (NaN without)."""
    def mean_of(part: str) -> float:
        values = [float(p[part]) for p in probes if part in p and p[part] > 0]
        return math.exp(statistics.fmean(math.log(v) for v in values)) if values else math.nan

    return mean_of("gemm_ms"), mean_of("copy_ms")


def flagged_runs(traces: pd.DataFrame) -> pd.DataFrame:
    """(device, config_id, repeat, power_limit_w) of every measurement kept with an interference flag."""
    keys = ["device", "config_id", "repeat", "power_limit_w"]
    if "interference" not in traces.columns or not len(traces):
        return pd.DataFrame(columns=keys)
    flagged = traces[traces["interference"].fillna("").astype(str) != ""]
    present = [k for k in keys if k in flagged.columns]
    return flagged[present].drop_duplicates().reset_index(drop=True)


def flagged_mask(runs: pd.DataFrame, traces: pd.DataFrame) -> pd.Series:
    """Per row of ``runs`` (one row per measurement): whether ``traces`` flag that measurement."""
    flagged = flagged_runs(traces)
    if not len(flagged):
        return pd.Series(False, index=runs.index)
    on = [k for k in flagged.columns if k in runs.columns]
    marked = runs[on].merge(flagged[on].assign(_flagged=True), on=on, how="left")
    return pd.Series(marked["_flagged"].eq(True).to_numpy(), index=runs.index)


def drop_flagged_runs(runs: pd.DataFrame, traces: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (one row per measurement) without the measurements flagged in ``traces``."""
    if not len(flagged_runs(traces)):
        return runs
    return runs[~flagged_mask(runs, traces)]


def flagged_per_device(traces: pd.DataFrame) -> pd.DataFrame:
    """Per device: measurements made (config, repeat, power limit) and how many are flagged as disturbed."""
    keys = [k for k in ("device", "config_id", "repeat", "power_limit_w") if k in traces.columns]
    runs = traces.drop_duplicates(keys)
    flagged = flagged_runs(traces)
    counts = runs.groupby("device").size().rename("measurements").to_frame()
    counts["flagged"] = flagged.groupby("device").size().reindex(counts.index).fillna(0).astype("int64")
    return counts.reset_index()
