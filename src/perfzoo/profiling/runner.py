"""Profile one (device, shard): isolated workers, a journal to resume from, trace tables out; and the
per-layer timings of a sample of configs (one isolated worker each)."""

from __future__ import annotations

import heapq
import json
import math
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import psutil
from tqdm import tqdm

from perfzoo.profiling import nvml, power_limits
from perfzoo.hardware import MeasurementSetting
from perfzoo.profiling.core import (
    reap_worker_servers,
    restart_worker_server,
    start_worker_servers,
    stop_spare_worker_server,
    worker_server_pid,
)
from perfzoo.profiling.cuda import DEFAULT_MIN_WINDOW_S, DEFAULT_SAMPLE_HZ, probe_counter_period_s
from perfzoo.profiling.interference import INTERFERENCE_TRACE_COLUMNS, Assessment, Policy, assess
from perfzoo.profiling.layers import LAYER_TIMING_COLUMNS, failed_layer_row
from perfzoo.profiling.measure import MEASURE_AGAIN
from perfzoo.profiling.microbench import check_device
from perfzoo.profiling.op_timing import OP_TIME_COLUMNS, OP_TIMING_COLUMNS
from perfzoo.profiling.reference import memory_reference
from perfzoo.profiling.worker import HeldWorker, Outcome, run_isolated, start_held
from perfzoo.models.zoo import stable_id

TRACE_COLUMNS = [
    "model_id", "config_id", "mode", "batch", "repeat", "iter", "time_ms", "status", "message",
    "peak_mem_mb", "n_warmup", "stop_reason", "threads",
]
"""Columns every trace file has (what the dataset stage requires)."""
WINDOW = "window"
"""Which timed window of its measurement an iteration belongs to (0, 1; :func:`windows_of`): written after
:data:`TRACE_COLUMNS`; a trace without it has one window per measurement."""
PEAK_RSS_TOTAL, RSS_FILE_GROWTH = "peak_rss_total_mb", "rss_file_growth_mb"
RESIDENT_SET_TRACE_COLUMNS = [PEAK_RSS_TOTAL, RSS_FILE_GROWTH]
"""Per-config parts of the CPU's memory measurement, beside its label ``peak_mem_mb`` (NaN on other kinds):
the whole resident set's peak above the baseline, file-backed pages included (the label before they were
left out), and the file-backed pages the step mapped (:class:`perfzoo.profiling.core.ResidentPeak`)."""
ENERGY_TRACE_COLUMNS = [
    "power_limit_w", "power_limit_swept", "mem_allocated_mb", "mem_reserved_mb", "nvml_mem_used_mb",
    "window_s", "window_iters", "window_energy_counter_j", "window_energy_samples_j", "energy_disagreement",
    "power_source", "sensor_errors", "energy_message",
]
"""Per-config power, memory and energy-window columns written after :data:`TRACE_COLUMNS` (NaN on cpu).

``power_limit_w`` is the limit a sweep set (``power_limit_swept`` True), else the limit in force read by
the worker (NaN on cpu); ``window_energy_*_j`` are the energies of the whole energy window of
``window_iters`` steps lasting ``window_s`` (counter, and integrated samples); ``energy_disagreement`` is
(samples - counter) / counter; ``energy_message`` says why an energy is NaN.
"""
SENSOR_COLUMNS = [
    "model_id", "mode", "batch", "repeat", "t_ns", "power_w", "gpu_util", "mem_util", "sm_clock_mhz",
    "mem_clock_mhz", "temp_c", "mem_used_mb", "power_limit_w",
]
STATUSES = ("ok", "oom", "error", "timeout")
_FLOAT_ENERGY_COLUMNS = [c for c in ENERGY_TRACE_COLUMNS
                         if c not in ("power_limit_swept", "power_source", "energy_message")]
BUSY_STREAK = 3
"""Configs in a row still disturbed after every retry: the machine is busy for good, so later configs are
flagged without waiting, until one is measured clean."""
LINGERING_SERVER_WAIT_S = 5.0
"""How long a shard waits, after its last held worker, for the worker servers stopped while workers were held."""
NOT_ASSESSED = Assessment(math.nan, "not assessed (measured before interference detection)", math.nan,
                          math.nan, "")


T = TypeVar("T")
Paused = Generator[float, None, T]
"""A measurement that pauses between a disturbed attempt and the next: each ``next`` runs it to its next pause and
yields the earliest ``time.time()`` at which it may go on; it returns its result (``StopIteration.value``).
:class:`_Waiting` runs them."""


@dataclass(frozen=True)
class Task:
    """One measurement: a config, its repetition and (in a power-limit sweep) the limit set for it."""

    config: dict[str, Any]
    repeat: int
    power_limit_w: float | None = None

    @property
    def key(self) -> str:
        """Journal key: ``config_id/repeat``, plus ``/<limit>W`` in a sweep."""
        base = f"{self.config['config_id']}/{self.repeat}"
        return base if self.power_limit_w is None else f"{base}/{self.power_limit_w:g}W"


def is_repeated(config_id: str, repeat_every: int) -> bool:
    """Whether a config is measured a second time (a stable subset, independent of sharding)."""
    return repeat_every > 0 and int(config_id, 16) % repeat_every == 0


def worker_settings(profiling: dict[str, Any], device_cfg: dict[str, Any], num_classes: int) -> dict[str, Any]:
    """What a worker measures with: the ``profiling:`` settings, the device's configured ``threads`` (never the
    job's cores: ``--cores`` must not change what a device measures) and the zoo's ``num_classes``."""
    return {**profiling, "threads": int(device_cfg["threads"]), "num_classes": int(num_classes)}


def plan_tasks(configs: pd.DataFrame, repeat_every: int) -> list[Task]:
    """All first measurements, then the second (independent) measurements of the repeated subset."""
    rows = configs.to_dict("records")
    first = [Task(r, 0) for r in rows]
    second = [Task(r, 1) for r in rows if is_repeated(r["config_id"], repeat_every)]
    return first + second


def plan_sweep_tasks(configs: pd.DataFrame, orders: list[list[float]]) -> list[Task]:
    """Tasks of a power-limit sweep: per repetition, per limit in that repetition's order, every config."""
    rows = configs.to_dict("records")
    return [Task(r, repetition, float(limit)) for repetition, order in enumerate(orders)
            for limit in order for r in rows]


def sweep_seed(device: str, configs: pd.DataFrame) -> int:
    """Seed of a shard's sweep orders: stable for (device, shard configs), so a resumed job replays them."""
    return int(stable_id({"device": device, "configs": sorted(configs["config_id"])})[:8], 16)


class Journal:
    """Append-only JSON-lines record of finished tasks; a torn last line is ignored on resume."""

    def __init__(self, path: Path, fingerprint: str) -> None:
        self.path = Path(path)
        self.fingerprint = fingerprint

    def load(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        lines = self.path.read_text().splitlines()
        header = _parse(lines[0]) if lines else None
        if not header or header.get("fingerprint") != self.fingerprint:
            aside = self.path.with_name(self.path.name + f".superseded-{int(time.time())}")
            self.path.rename(aside)
            print(f"journal {self.path} was made with other settings; kept as {aside}", file=sys.stderr)
            return {}
        entries = (_parse(line) for line in lines[1:])
        return {e["key"]: e for e in entries if e is not None}

    def append(self, entry: dict[str, Any]) -> None:
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = not new and _ends_torn(self.path)
        with self.path.open("a") as fh:
            if new:
                fh.write(json.dumps({"fingerprint": self.fingerprint}) + "\n")
            elif torn:  # a line cut off by a kill: end it, so this entry starts a line of its own
                fh.write("\n")
            fh.write(json.dumps(entry) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _ends_torn(path: Path) -> bool:
    """Whether a non-empty file's last byte is not a newline (its last line was cut off)."""
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return False
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"


def _parse(line: str) -> dict[str, Any] | None:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def fingerprint(device: str, settings: dict[str, Any], configs: pd.DataFrame) -> str:
    return stable_id({"device": device, "settings": settings, "configs": sorted(configs["config_id"])})


def outcome_rows(task: Task, outcome: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Trace rows of one task: one per measured iteration, or one status row when it failed."""
    c = task.config
    swept = task.power_limit_w is not None
    base = {"model_id": c["model_id"], "config_id": c["config_id"], "mode": c["mode"], "batch": c["batch"],
            "repeat": task.repeat, "status": outcome["status"], "message": outcome["message"],
            "power_limit_w": task.power_limit_w if swept else math.nan, "power_limit_swept": swept,
            **(outcome.get("assessment") or NOT_ASSESSED.as_dict()),
            "attempts": len(outcome.get("attempts") or [1]),
            "memory_reference_mb": outcome.get("memory_reference_mb", math.nan)}
    m = outcome.get("measurement")
    if outcome["status"] != "ok" or not m:
        yield {**base, "iter": 0, "time_ms": float("nan")}
        return
    extra = m.get("extra") or {}
    per_config = {"peak_mem_mb": m["peak_mem_mb"], "n_warmup": m["n_warmup"],
                  "stop_reason": m["stop_reason"], "threads": extra.get("threads")}
    per_config.update({k: extra[k] for k in ENERGY_TRACE_COLUMNS if k in extra and k != "power_limit_swept"})
    if "peak_rss_total_mb" in extra:  # cpu: what measure_on_cpu reports beside its label
        per_config.update({PEAK_RSS_TOTAL: extra["peak_rss_total_mb"],
                           RSS_FILE_GROWTH: extra["rss_growth_mb"]["file"]})
    if swept:
        per_config["power_limit_w"] = task.power_limit_w  # the key; the limit read back is in the sensors
    later = outcome.get("later_windows") or []
    failed = [f"second window {w['status']}: {w['message']}" for w in later if w["status"] != "ok"]
    if failed:  # the label is the first window's alone; the rows say why
        base["message"] = "; ".join(failed)
    windows = [m, *(w["measurement"] for w in later if w["status"] == "ok")]
    for window, measured in enumerate(windows):
        own = {} if window == 0 else {"n_warmup": measured["n_warmup"], "stop_reason": measured["stop_reason"]}
        for i, t in enumerate(measured["times_ms"]):
            yield {**base, **per_config, **own, WINDOW: window, "iter": i, "time_ms": t}


def traces_frame(tasks: list[Task], done: dict[str, dict[str, Any]]) -> pd.DataFrame:
    rows = [row for task in tasks for row in outcome_rows(task, done[task.key])]
    df = pd.DataFrame(rows, columns=[*TRACE_COLUMNS, WINDOW, *RESIDENT_SET_TRACE_COLUMNS, *ENERGY_TRACE_COLUMNS,
                                     *INTERFERENCE_TRACE_COLUMNS])
    df["power_limit_swept"] = df["power_limit_swept"].astype(object).fillna(False).astype(bool)
    df["power_source"] = df["power_source"].astype(object)
    for text in ("energy_message", "probe_message", "interference"):
        df[text] = df[text].astype(object).fillna("")
    return df.astype({"batch": "int64", "repeat": "int64", "iter": "int64", "time_ms": "float64", WINDOW: "float64",
                      "peak_mem_mb": "float64", "n_warmup": "float64", "threads": "float64",
                      **{c: "float64" for c in RESIDENT_SET_TRACE_COLUMNS},
                      **{c: "float64" for c in _FLOAT_ENERGY_COLUMNS},
                      "probe_ratio": "float64", "other_cpu_load": "float64", "steal_frac": "float64",
                      "attempts": "int64", "memory_reference_mb": "float64", "probe_gemm_ms": "float64",
                      "probe_copy_ms": "float64"})


def sensors_frame(tasks: list[Task], done: dict[str, dict[str, Any]]) -> pd.DataFrame:
    frames = []
    for task in tasks:
        samples = ((done[task.key].get("measurement") or {}).get("extra") or {}).get("sensors")
        if samples:
            frames.append(pd.DataFrame(samples).assign(
                model_id=task.config["model_id"], mode=task.config["mode"], batch=task.config["batch"],
                repeat=task.repeat))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SENSOR_COLUMNS)
    df = df.reindex(columns=SENSOR_COLUMNS)
    return df.astype({"batch": "int64", "repeat": "int64", "t_ns": "int64",
                      **{c: "float64" for c in SENSOR_COLUMNS[5:]}})


def _measurement_settings(device_cfg: dict[str, Any]) -> dict[str, Any]:
    """What the device entry contributes to how a cuda config is measured (part of the fingerprint)."""
    return {
        "gpu_index": int(device_cfg.get("gpu_index", 0)),
        "sample_hz": float(device_cfg.get("sample_hz", DEFAULT_SAMPLE_HZ)),
        "min_window_s": float(device_cfg.get("min_window_s", DEFAULT_MIN_WINDOW_S)),
        "power_limits_w": [float(x) for x in device_cfg.get("power_limits_w") or []],
        "sweep_repetitions": int(device_cfg.get("sweep_repetitions", 1)),
        "cooldown_band_c": device_cfg.get("cooldown_band_c"),
    }


@dataclass
class Measurer:
    """How each task of a shard is measured: the worker's kind and settings, the device's probe baseline,
    what runs before each attempt (cuda: cool-down and the GPU's state), and the interference policy."""

    kind: str
    settings: dict[str, Any]
    baseline: dict[str, Any] | None = None
    before_task: Callable[[Task], dict[str, Any]] | None = None
    still_disturbed: int = 0  # configs in a row that stayed disturbed after their retries
    memory_reference_mb: float = math.nan
    """The reference step's peak memory measured before this shard's tasks (journalled with each entry)."""

    def window_steps(self, task: Task, hold: bool) -> Paused[tuple[dict[str, Any], HeldWorker | None]]:
        """The journal entry of ``task``'s measurement (``hold`` false) or first window (``hold`` true), and the
        kept attempt's worker held for :meth:`later_window_steps` (None when not held or the config failed).

        A paused measurement (:data:`Paused`): after a disturbed attempt it ends that attempt's worker and pauses
        until ``wait_s`` later, up to ``retries`` times (none after :data:`BUSY_STREAK` configs in a row stayed
        disturbed); the last attempt is kept, with its interference reasons when it is still disturbed."""
        task_settings = {**(per_window(self.settings) if hold else self.settings),
                         "time_ops": task.repeat == 0}  # per-op times: first measurement
        if task.power_limit_w is not None:
            task_settings["power_limit_w"] = task.power_limit_w
        held: HeldWorker | None = None
        extra: dict[str, Any] = {}

        def take() -> tuple[Outcome, Sequence[str], float]:
            nonlocal held, extra
            extra = self.before_task(task) if self.before_task is not None else {}
            started = time.time()
            if hold:
                outcome, held = start_held(self.kind, task.config, task_settings)
            else:
                outcome = run_isolated(self.kind, task.config, task_settings)
            return outcome, extra.pop("gpu_reasons", ()), started

        def drop() -> None:  # a disturbed attempt's worker
            if held is not None:
                held.close()

        kept = yield from self._attempts(take, drop)
        if kept.outcome.status == "ok":
            self.still_disturbed = self.still_disturbed + 1 if kept.verdict.interference else 0
        entry = {"key": task.key, **_outcome_dict(kept.outcome), **extra, "assessment": kept.verdict.as_dict(),
                 "attempts": kept.attempts, "memory_reference_mb": self.memory_reference_mb,
                 "worker_server_pid": worker_server_pid()}
        return entry, held

    def later_window_steps(self, entry: dict[str, Any], held: HeldWorker) -> Paused[dict[str, Any]]:
        """``entry`` with its second window, timed by ``held``, a paused measurement as :meth:`window_steps` is
        (the worker is kept while it pauses, and ended however the measurement ends, abandoned included); a second
        window still disturbed adds its reasons to the entry's, one that failed leaves the first window alone,
        with the reason in ``later_windows``."""

        def take() -> tuple[Outcome, Sequence[str], float]:
            started = time.time()
            return held.again(), (), started

        try:
            kept = yield from self._attempts(take)
        finally:
            held.close()
        assessment = dict(entry["assessment"])
        if kept.outcome.status == "ok" and kept.verdict.interference:
            self.still_disturbed += 1
            assessment["interference"] = "; ".join(
                filter(None, [assessment["interference"], f"second window: {kept.verdict.interference}"]))
        window = {**_outcome_dict(kept.outcome), "assessment": kept.verdict.as_dict(), "attempts": kept.attempts}
        return {**entry, "assessment": assessment, "later_windows": [window]}

    def _attempts(self, take: Callable[[], tuple[Outcome, Sequence[str], float]],
                  drop: Callable[[], None] = lambda: None) -> Paused[Attempts]:
        """Attempts by ``take`` (outcome, the GPU's reasons, start time) until one is not disturbed or did not
        run: up to the policy's ``retries`` more (none after :data:`BUSY_STREAK` configs in a row stayed
        disturbed), each after ``drop`` (ends the disturbed attempt's worker) and a pause until ``wait_s`` later."""
        policy = Policy.from_settings(self.settings)
        retries = policy.retries if self.still_disturbed < BUSY_STREAK else 0
        attempts: list[dict[str, Any]] = []
        for attempt in range(retries + 1):
            if attempt:
                drop()
                yield time.time() + policy.wait_s
            outcome, gpu_reasons, started = take()
            verdict = assess(outcome.measurement, self.baseline, policy, gpu_reasons)
            attempts.append({"started": started, "finished": time.time(), **verdict.as_dict()})
            if outcome.status != "ok" or not verdict.interference:
                break
        return Attempts(outcome, verdict, attempts)


@dataclass(frozen=True)
class Attempts:
    """A measurement taken again while disturbed: the kept (last) attempt's outcome and verdict, and the record
    of every attempt (journalled as ``attempts``)."""

    outcome: Outcome
    verdict: Assessment
    attempts: list[dict[str, Any]]


@dataclass
class ShardResult:
    """The tables of one profiled (device, shard): iteration traces, sensor samples, job metadata and the
    measured per-operator times (:func:`op_times_frame`)."""

    traces: pd.DataFrame
    sensors: pd.DataFrame
    meta: dict[str, Any]
    op_times: pd.DataFrame


def profile_shard_with_ops(
    configs: pd.DataFrame, device: str, device_cfg: dict[str, Any], settings: dict[str, Any],
    journal_path: Path, progress: bool = True, *, nvml_lib: Any | None = None,
    cuda_backend: Any | None = None, hardware: dict[str, Any] | None = None,
) -> ShardResult:
    """Measure every task of the shard not already in the journal; return traces, sensors, metadata and
    per-operator times (measured after each config's first end-to-end measurement, on the CPU).

    kind cuda: the device is checked (NVML, CUDA, GPU name) and any power limits validated against the
    GPU's allowed range before anything is measured; a power-limit sweep is run here, in the parent
    (:class:`~perfzoo.profiling.power_limits.PowerLimitSweep`: the original limit is restored on every exit path,
    SIGTERM included), with a fresh seeded order of limits per repetition; between configs the GPU cools
    down (:func:`~perfzoo.profiling.nvml.cooldown`). ``nvml_lib`` and ``cuda_backend`` substitute the NVML
    and CUDA boundaries (tests).

    ``hardware`` is the device's hardware record: its measurement setting must be this run's (else a
    one-line InputError, before anything is measured) and its probe baseline gives each measurement's
    ``probe_ratio`` (:mod:`perfzoo.profiling.interference`; without a record the ratio is missing).

    On the CPU, a shard with configs left to measure first measures the memory reference
    (:mod:`perfzoo.profiling.reference`); its peak memory is journalled with each measurement of this run
    (``memory_reference_mb``) and the whole record is in the metadata.
    """
    kind = device_cfg["kind"]
    setting = MeasurementSetting.of(settings)
    if hardware is not None:
        setting.check_same(device, hardware.get("measurement_setting"), f"results/hardware/{device}.json")
    baseline = (hardware or {}).get("probe_baseline")
    identity = (check_device(device, device_cfg, nvml_lib=nvml_lib, backend=cuda_backend) if kind == "cuda"
                else check_device(device, device_cfg))
    started = time.time()
    shard = configs["shard"].iloc[0] if "shard" in configs and len(configs) else "-"
    if kind != "cuda":
        tasks = plan_tasks(configs, settings["repeat_every"])
        journal = Journal(journal_path, fingerprint(device, settings, configs))
        done = journal.load()
        left = tasks_left(tasks, done)
        resumed = len(tasks) - len(left)
        not_ready: list[str] = []
        reference: dict[str, Any] = {"missing": "nothing measured in this run of the shard"}
        if left:
            not_ready = start_worker_servers(spare=restarts_server(left))
            for line in not_ready:
                print(f"profile {device}/{shard}: {line}; its imports may overlap the first measurements",
                      file=sys.stderr)
            reference = memory_reference(kind, int(settings["threads"]))
        measurer = Measurer(kind, settings, baseline,
                            memory_reference_mb=float(reference.get("peak_mem_mb", math.nan)))
        todo = _run_tasks(tasks, done, journal, measurer, f"profile {device}/{shard}", progress)
        extra_meta: dict[str, Any] = {"memory_reference": reference, "worker_servers_not_ready": not_ready}
    else:
        tasks, done, resumed, todo, extra_meta = _profile_cuda(
            configs, device, device_cfg, settings, journal_path, identity, progress, nvml_lib, shard,
            baseline)
    traces = traces_frame(tasks, done)
    meta = {
        "device": device, "device_config": device_cfg, "identity": identity, "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "started": started, "finished": time.time(),
        "settings": settings, "measurement_setting": setting.as_dict(), "tasks": len(tasks),
        "tasks_resumed_from_journal": resumed,
        "tasks_measured_now": len(todo), "rows": len(traces),
        "status_counts": traces.drop_duplicates(["config_id", "repeat", "power_limit_w"])["status"]
        .value_counts().to_dict(),
        "interference": _interference_summary(tasks, done),
        "op_timing": _op_timing_summary(tasks, done),
        **extra_meta,
    }
    return ShardResult(traces, sensors_frame(tasks, done), meta, op_times_frame(tasks, done))


def _op_times_of(entry: dict[str, Any]) -> dict[str, Any] | None:
    return ((entry.get("measurement") or {}).get("extra") or {}).get("op_times")


def _op_timing_summary(tasks: list[Task], done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Configs with measured per-operator times, and the seconds the per-op steps took in all."""
    timed = [t for t in (_op_times_of(done[task.key]) for task in tasks) if t]
    return {"configs_timed": sum(1 for t in timed if not t["message"]),
            "seconds": float(sum(t["seconds"] for t in timed))}


def op_times_frame(tasks: list[Task], done: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per operator call of each config's timed per-op steps (:data:`OP_TIME_COLUMNS`), from the
    first measurement of every config (and, in a power-limit sweep, of every limit).

    A config without per-operator times keeps one row with ``op == ""``, NaN times, ``status`` not ``ok``
    and the reason in ``message``: the config failed (its status and message), op timing was off or failed.
    """
    frames = []
    for task in tasks:
        if task.repeat != 0:
            continue
        entry, c = done[task.key], task.config
        ident = {"model_id": c["model_id"], "config_id": c["config_id"], "mode": c["mode"],
                 "batch": c["batch"], "power_limit_w": math.nan if task.power_limit_w is None
                 else task.power_limit_w}
        status, message = _op_status(entry)
        if status != "ok":
            frames.append(pd.DataFrame([{**ident, "status": status, "message": message}]))
            continue
        times = _op_times_of(entry)
        table = pd.DataFrame({name: times[name] for name in OP_TIMING_COLUMNS})
        table["step_ms"] = [times["step_ms"][s] for s in table["step"]]
        frames.append(table.assign(**ident, status="ok", message=""))
    table = (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()).reindex(columns=OP_TIME_COLUMNS)
    table["op"] = table["op"].astype(object).fillna("")
    table["phase"] = table["phase"].astype(object).fillna("")
    table["grouped"] = table["grouped"].astype(object).fillna(False).astype(bool)
    return table.astype({"batch": "int64", "step": "float64", "order": "float64", "time_ms": "float64",
                         "step_ms": "float64", "power_limit_w": "float64"})


def _op_status(entry: dict[str, Any]) -> tuple[str, str]:
    """(status, reason) of a config's per-operator times: ``ok``, or why there are none."""
    if entry["status"] != "ok":
        return entry["status"], f"config not measured: {entry['message']}"
    times = _op_times_of(entry)
    if times is None:
        return "not_measured", "per-op times not measured: the worker recorded none"
    if times["message"]:
        return "error" if times.get("failed") else "not_measured", times["message"]
    if not times["op"]:
        return "not_measured", "per-op timing recorded no operator"
    return "ok", ""


def _interference_summary(tasks: list[Task], done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Measurements of the shard kept with an interference flag, those measured more than once, and second
    windows timed more than once (while disturbed)."""
    entries = [done[t.key] for t in tasks]
    return {"flagged": sum(1 for e in entries if (e.get("assessment") or {}).get("interference")),
            "remeasured": sum(1 for e in entries if len(e.get("attempts") or []) > 1),
            "second_windows_retimed": sum(1 for e in entries for w in e.get("later_windows") or []
                                          if len(w.get("attempts") or []) > 1)}


HOLD_MEMORY_SHARE = 0.25
"""Most of the machine's memory the held workers may keep (their own memory, USS, summed): beyond it, the
oldest held worker takes its second window at once."""
MAX_HELD = 64
"""Most workers held at once (processes, each with its model built)."""


def windows_of(settings: dict[str, Any], kind: str) -> int:
    """Windows per measurement: ``profiling.windows`` (default 1) on a kind whose worker can time a step again
    (:data:`perfzoo.profiling.measure.MEASURE_AGAIN`: the cpu), else 1."""
    return int(settings.get("windows", 1)) if kind in MEASURE_AGAIN else 1


def per_window(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings of each of a measurement's two windows: ``min_iters`` split between them (at least 3 each),
    so that a slow config's label still rests on ``min_iters`` iterations or more, not twice as many; every
    other stop rule applies to each window as to one."""
    return {**settings, "min_iters": max(3, math.ceil(int(settings["min_iters"]) / 2))}


def _holding_too_much(workers: Sequence[HeldWorker]) -> bool:
    """Whether the held workers exceed :data:`MAX_HELD` or keep more than :data:`HOLD_MEMORY_SHARE` of the
    machine's memory (a worker whose memory could not be read counts as nothing)."""
    private_mb = sum(worker.private_mb for worker in workers if math.isfinite(worker.private_mb))
    return len(workers) > MAX_HELD or private_mb > HOLD_MEMORY_SHARE * psutil.virtual_memory().total / 2**20


class _Waiting:
    """Measurements paused after a disturbed attempt (:data:`Paused`), each resumed once its wait is over, so that
    the shard measures other windows meanwhile instead of idling through the wait."""

    def __init__(self) -> None:
        self._paused: list[tuple[float, int, Paused[Any], Callable[[Any], None]]] = []
        self._started = 0

    def start(self, steps: Paused[T], finish: Callable[[T], None]) -> None:
        """Run ``steps`` to its first pause (or its end, handing the result to ``finish``)."""
        self._started += 1
        self._advance(steps, finish, self._started)

    def _advance(self, steps: Paused[Any], finish: Callable[[Any], None], order: int) -> None:
        try:
            resume_at = next(steps)
        except StopIteration as stop:
            finish(stop.value)
        else:
            heapq.heappush(self._paused, (resume_at, order, steps, finish))

    def resume_due(self) -> None:
        """Resume every measurement whose wait is over (a resumed one may pause again, later)."""
        while self._paused and self._paused[0][0] <= time.time():
            _, order, steps, finish = heapq.heappop(self._paused)
            self._advance(steps, finish, order)

    def finish_all(self) -> None:
        """Resume the paused measurements in the order their waits end, sleeping until each may go on, until none
        is left."""
        while self._paused:
            time.sleep(max(0.0, self._paused[0][0] - time.time()))
            self.resume_due()

    def abandon(self) -> None:
        """End every paused measurement unfinished (its held worker is ended; nothing is journalled)."""
        while self._paused:
            heapq.heappop(self._paused)[2].close()


def _run_tasks(
    tasks: list[Task], done: dict[str, dict[str, Any]], journal: Journal, measurer: Measurer, desc: str,
    progress: bool,
) -> list[Task]:
    """Measure the tasks not yet in ``done`` (journalled one by one); return those measured now.

    A window found disturbed is measured again no sooner than ``wait_s`` later (:meth:`Measurer._attempts`), and
    the tasks after it are measured meanwhile (:class:`_Waiting`): the wait lets a disturbance pass without
    idling the cores, which the shard holds. The measurements still waiting at the end of a pass (and before the
    repeats) are finished then, sleeping only the rest of their waits.

    The second measurements of the repeated subset (``repeat`` 1, after every first one) come from a new worker
    server when first measurements were made from the current one in this call (:func:`restart_worker_server`):
    a repeat forked from the same server shares its memory layout, so the noise floor would leave out how much
    a label moves between servers, i.e. between shards and runs. That server is started with the first, before
    anything is measured (:func:`perfzoo.profiling.core.start_worker_servers`, called by
    :func:`profile_shard_with_ops`), so that its imports neither wait for nor overlap the measurements.

    With two windows (:func:`windows_of`), every task's first window is measured in turn and its worker held;
    then each held worker times its step again, in the same order, so that a task's two windows lie the first
    pass's length apart (about a minute in a default shard) and its label, the median of the two windows'
    medians, averages the machine's speed at two moments. An entry is journalled once both windows are in, so
    a resumed run measures the held tasks afresh; fewer workers are held where they would keep much memory
    (:data:`HOLD_MEMORY_SHARE`, :data:`MAX_HELD`)."""
    todo = tasks_left(tasks, done)
    two_windows = windows_of(measurer.settings, measurer.kind) == 2
    held: list[tuple[Task, dict[str, Any], HeldWorker]] = []
    retiming: dict[str, HeldWorker] = {}  # held workers whose second window waits for its re-timing
    waiting = _Waiting()

    def record(task: Task, entry: dict[str, Any]) -> None:
        journal.append(entry)
        done[task.key] = entry

    def time_again(task: Task, entry: dict[str, Any], worker: HeldWorker) -> None:
        retiming[task.key] = worker

        def finish(kept: dict[str, Any]) -> None:
            del retiming[task.key]
            record(task, kept)

        waiting.start(measurer.later_window_steps(entry, worker), finish)

    def holding_too_much() -> bool:
        return _holding_too_much([*(worker for _, _, worker in held), *retiming.values()])

    def hold(task: Task, first: tuple[dict[str, Any], HeldWorker | None]) -> None:
        """Keep a first window's worker for the second pass; a task without one (a single window, a failed
        config) is journalled now."""
        entry, worker = first
        if worker is None:
            record(task, entry)
            return
        held.append((task, entry, worker))
        while len(held) > 1 and holding_too_much():
            time_again(*held.pop(0))
        if retiming and holding_too_much():
            waiting.finish_all()  # the workers that wait to be re-timed keep memory too

    try:
        for i, task in enumerate(tqdm(todo, desc=desc, disable=not progress, file=sys.stderr, mininterval=1)):
            if i and _server_changes_before(todo[i - 1], task):
                waiting.finish_all()  # every first measurement from the current server
                restart_worker_server()
            waiting.start(measurer.window_steps(task, hold=two_windows), lambda first, t=task: hold(t, first))
            waiting.resume_due()
            if measurer.settings.get("cooldown_s"):
                time.sleep(measurer.settings["cooldown_s"])
        waiting.finish_all()
        while held:
            time_again(*held.pop(0))
            waiting.resume_due()
        waiting.finish_all()
    finally:
        waiting.abandon()  # interrupted: nothing half-measured is journalled
        for _, _, worker in held:
            worker.close()
        stop_spare_worker_server()
        reap_worker_servers(wait_s=LINGERING_SERVER_WAIT_S)
    return todo


def tasks_left(tasks: list[Task], done: dict[str, dict[str, Any]]) -> list[Task]:
    """The tasks not yet journalled, in order."""
    return [t for t in tasks if t.key not in done]


def _server_changes_before(previous: Task, task: Task) -> bool:
    """Whether ``task``, measured right after ``previous``, is the first repeat: it comes from a new server."""
    return previous.repeat == 0 < task.repeat


def restarts_server(todo: list[Task]) -> bool:
    """Whether measuring ``todo`` in order changes the worker server (:func:`_run_tasks`)."""
    return any(_server_changes_before(a, b) for a, b in zip(todo, todo[1:]))


def _profile_cuda(
    configs: pd.DataFrame, device: str, device_cfg: dict[str, Any], settings: dict[str, Any],
    journal_path: Path, identity: dict[str, Any], progress: bool, nvml_lib: Any | None, shard: str,
    baseline: dict[str, Any] | None,
) -> tuple[list[Task], dict[str, dict[str, Any]], int, list[Task], dict[str, Any]]:
    measurement = _measurement_settings(device_cfg)
    limits = measurement["power_limits_w"]
    low, high = identity.get("power_limit_min_w"), identity.get("power_limit_max_w")
    if limits and low is not None and high is not None:
        power_limits.validate_power_limits(device, limits, float(low), float(high))
    gpu = nvml.open_device(int(identity.get("nvml_index", measurement["gpu_index"])), lib=nvml_lib)
    try:
        period, period_reason = probe_counter_period_s(gpu)
        worker_settings = {**settings,
                           **{k: measurement[k] for k in ("gpu_index", "sample_hz", "min_window_s")},
                           "nvml_index": gpu.index, "counter_period_s": period}
        journal = Journal(journal_path, fingerprint(device, {**settings, "device": measurement}, configs))
        done = journal.load()
        band = measurement["cooldown_band_c"]
        cooldowns: list[dict[str, Any]] = []

        def cool(task: Task) -> dict[str, Any]:
            result = nvml.cooldown(gpu, band_c=band, timeout_s=float(settings.get("cooldown_timeout_s", 120)))
            state, reasons = nvml.gpu_state(gpu)
            if band is not None:
                cooldowns.append(result)
            extra = {"gpu_state": state, "gpu_reasons": reasons}
            return {**extra, "cooldown": result} if band is not None else extra

        measurer = Measurer("cuda", worker_settings, baseline, cool)

        desc = f"profile {device}/{shard}"
        meta: dict[str, Any] = {"counter_period_s": period, "counter_period_reason": period_reason}
        if not limits:
            tasks = plan_tasks(configs, settings["repeat_every"])
            resumed = sum(1 for t in tasks if t.key in done)
            todo = _run_tasks(tasks, done, journal, measurer, desc, progress)
        else:
            tasks, resumed, todo, meta["power_limit_sweep"] = _sweep(
                configs, device, gpu, measurement, settings, measurer, journal, done, desc, progress)
        meta["cooldowns"] = {"band_c": band, "configs": len(cooldowns),
                             "waited_s": sum(c["waited_s"] for c in cooldowns),
                             "not_within_band": [c["reason"] for c in cooldowns if c["within_band"] is False]}
        return tasks, done, resumed, todo, meta
    finally:
        gpu.close()


def _sweep(
    configs: pd.DataFrame, device: str, gpu: Any, measurement: dict[str, Any], settings: dict[str, Any],
    measurer: Measurer, journal: Journal, done: dict[str, dict[str, Any]], desc: str, progress: bool,
) -> tuple[list[Task], int, list[Task], dict[str, Any]]:
    """Run the power-limit sweep of a shard; fall back to the limit in force if limits cannot be set."""
    sweep = power_limits.PowerLimitSweep(gpu, measurement["power_limits_w"], measurement["sweep_repetitions"],
                            seed=sweep_seed(device, configs), device=device)
    tasks = plan_sweep_tasks(configs, sweep.orders)
    resumed = sum(1 for t in tasks if t.key in done)
    todo: list[Task] = []
    with sweep:
        for repetition, limit_w in sweep:
            batch = [t for t in tasks if t.repeat == repetition and t.power_limit_w == float(limit_w)]
            todo += _run_tasks(batch, done, journal, measurer, f"{desc} rep {repetition} @ {limit_w:g} W",
                               progress)
    try:
        limit_after_w: float | None = gpu.lib.power_limit_mw(gpu.handle) / 1000.0
    except Exception:  # noqa: BLE001 - only a record
        limit_after_w = None
    info = {"limits_w": list(measurement["power_limits_w"]), "repetitions": measurement["sweep_repetitions"],
            "seed": sweep.seed, "orders": sweep.orders, "visited": [list(v) for v in sweep.visited],
            "original_limit_w": None if sweep.original_mw is None else sweep.original_mw / 1000.0,
            "limit_after_w": limit_after_w, "skipped_reason": sweep.skipped_reason}
    if not sweep.skipped_reason:
        return tasks, resumed, todo, info
    if sweep.visited:  # the limit could be set before and not any more: the rest cannot be measured
        for task in tasks:
            if task.key not in done:
                reason = f"power limit {task.power_limit_w:g} W not set: {sweep.skipped_reason}"
                done[task.key] = {"key": task.key, "status": "error", "message": reason, "measurement": None}
        return tasks, resumed, todo, info
    warnings.warn(f"device '{device}': configs are measured at the power limit in force "
                  f"({sweep.skipped_reason})", RuntimeWarning, stacklevel=2)
    tasks = plan_tasks(configs, settings["repeat_every"])
    resumed = sum(1 for t in tasks if t.key in done)
    todo = _run_tasks(tasks, done, journal, measurer, desc, progress)
    return tasks, resumed, todo, info


def _outcome_dict(outcome: Outcome) -> dict[str, Any]:
    return {"status": outcome.status, "message": outcome.message, "measurement": outcome.measurement}


def profile_layer_configs(
    configs: pd.DataFrame, device: str, settings: dict[str, Any], progress: bool = True
) -> pd.DataFrame:
    """Time the layers of every config in its own isolated worker; one row per layer call.

    ``settings`` are the profiling settings (``timeout_s``, ``max_rss_mb``, ``warmup_iters``,
    ``optimizer``) plus ``threads``, ``num_classes`` and ``layer_iters``. A config that crashes, runs
    out of memory or times out keeps one row with its status and message (columns
    :data:`LAYER_TIMING_COLUMNS`).
    """
    rows: list[dict[str, Any]] = []
    records = configs.to_dict("records")
    bar = tqdm(records, desc=f"layers {device}", disable=not progress, file=sys.stderr, mininterval=1)
    for config in bar:
        outcome = run_isolated("cpu_layers", config, settings)
        if outcome.status != "ok" or outcome.measurement is None:
            rows.append(failed_layer_row(config, device, outcome.status, outcome.message))
            continue
        result = outcome.measurement
        step_ms = float(np.median(result["times_ms"])) if result["times_ms"] else math.nan
        unhooked = result["extra"].get("unhooked_step_ms") or []
        base = failed_layer_row(config, device, "ok", "")
        for layer in result["extra"]["layers"]:
            rows.append({**base, **layer, "step_ms": step_ms,
                         "unhooked_step_ms": float(np.median(unhooked)) if unhooked else math.nan,
                         "n_iters": len(result["times_ms"])})  # fmt: skip
    table = pd.DataFrame(rows, columns=LAYER_TIMING_COLUMNS)
    return table.astype(
        {
            "batch": "int64",
            "occurrence": "int64",
            "n_iters": "int64",
            "fw_ms": "float64",
            "bw_ms": "float64",
            "step_ms": "float64",
            "unhooked_step_ms": "float64",
        }
    )
