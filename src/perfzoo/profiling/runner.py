"""Profile one (device, shard): isolated workers, a journal to resume from, trace tables out."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from perfzoo.profiling.worker import Outcome, run_isolated

TRACE_COLUMNS = [
    "model_id", "config_id", "mode", "batch", "repeat", "iter", "time_ms", "status", "message",
    "peak_mem_mb", "n_warmup", "stop_reason", "threads",
]
SENSOR_COLUMNS = [
    "model_id", "mode", "batch", "repeat", "t_ns", "power_w", "gpu_util", "mem_util", "sm_clock_mhz",
    "mem_clock_mhz", "temp_c", "mem_used_mb", "power_limit_w",
]
STATUSES = ("ok", "oom", "error", "timeout")


@dataclass(frozen=True)
class Task:
    config: dict[str, Any]
    repeat: int

    @property
    def key(self) -> str:
        return f"{self.config['config_id']}/{self.repeat}"


def is_repeated(config_id: str, repeat_every: int) -> bool:
    """Whether a config is measured a second time (a stable subset, independent of sharding)."""
    return repeat_every > 0 and int(config_id, 16) % repeat_every == 0


def plan_tasks(configs: pd.DataFrame, repeat_every: int) -> list[Task]:
    """All first measurements, then the second (independent) measurements of the repeated subset."""
    rows = configs.to_dict("records")
    first = [Task(r, 0) for r in rows]
    second = [Task(r, 1) for r in rows if is_repeated(r["config_id"], repeat_every)]
    return first + second


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
        with self.path.open("a") as fh:
            if new:
                fh.write(json.dumps({"fingerprint": self.fingerprint}) + "\n")
            fh.write(json.dumps(entry) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _parse(line: str) -> dict[str, Any] | None:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def fingerprint(device: str, settings: dict[str, Any], configs: pd.DataFrame) -> str:
    from perfzoo.zoo import stable_id

    return stable_id({"device": device, "settings": settings, "configs": sorted(configs["config_id"])})


def outcome_rows(task: Task, outcome: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Trace rows of one task: one per measured iteration, or one status row when it failed."""
    c = task.config
    base = {"model_id": c["model_id"], "config_id": c["config_id"], "mode": c["mode"], "batch": c["batch"],
            "repeat": task.repeat, "status": outcome["status"], "message": outcome["message"]}
    m = outcome.get("measurement")
    if outcome["status"] != "ok" or not m:
        yield {**base, "iter": 0, "time_ms": float("nan")}
        return
    per_config = {"peak_mem_mb": m["peak_mem_mb"], "n_warmup": m["n_warmup"],
                  "stop_reason": m["stop_reason"], "threads": m["extra"].get("threads")}
    for i, t in enumerate(m["times_ms"]):
        yield {**base, **per_config, "iter": i, "time_ms": t}


def traces_frame(tasks: list[Task], done: dict[str, dict[str, Any]]) -> pd.DataFrame:
    rows = [row for task in tasks for row in outcome_rows(task, done[task.key])]
    df = pd.DataFrame(rows, columns=TRACE_COLUMNS)
    return df.astype({"batch": "int64", "repeat": "int64", "iter": "int64", "time_ms": "float64",
                      "peak_mem_mb": "float64", "n_warmup": "float64", "threads": "float64"})


def sensors_frame(tasks: list[Task], done: dict[str, dict[str, Any]]) -> pd.DataFrame:
    frames = []
    for task in tasks:
        samples = ((done[task.key].get("measurement") or {}).get("extra") or {}).get("sensors")
        if samples:
            frames.append(pd.DataFrame(samples).assign(
                model_id=task.config["model_id"], mode=task.config["mode"], batch=task.config["batch"],
                repeat=task.repeat))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SENSOR_COLUMNS)
    return df.reindex(columns=SENSOR_COLUMNS).astype({c: "float64" for c in SENSOR_COLUMNS[4:]})


def profile_shard(
    configs: pd.DataFrame, device: str, device_cfg: dict[str, Any], settings: dict[str, Any],
    journal_path: Path, progress: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Measure every task of the shard not already in the journal; return traces, sensors, metadata."""
    from perfzoo.hardware import check_device

    identity = check_device(device, device_cfg)
    started = time.time()
    tasks = plan_tasks(configs, settings["repeat_every"])
    journal = Journal(journal_path, fingerprint(device, settings, configs))
    done = journal.load()
    resumed = sum(1 for t in tasks if t.key in done)
    todo = [t for t in tasks if t.key not in done]
    for task in tqdm(todo, desc=f"profile {device}/{configs['shard'].iloc[0] if len(configs) else '-'}",
                     disable=not progress, file=sys.stderr, mininterval=1):
        outcome = run_isolated(device_cfg["kind"], task.config, settings)
        entry = {"key": task.key, **_outcome_dict(outcome)}
        journal.append(entry)
        done[task.key] = entry
        if settings.get("cooldown_s"):
            time.sleep(settings["cooldown_s"])
    traces = traces_frame(tasks, done)
    meta = {
        "device": device, "device_config": device_cfg, "identity": identity, "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "started": started, "finished": time.time(),
        "settings": settings, "tasks": len(tasks), "tasks_resumed_from_journal": resumed,
        "tasks_measured_now": len(todo), "rows": len(traces),
        "status_counts": traces.drop_duplicates(["config_id", "repeat"])["status"].value_counts().to_dict(),
    }
    return traces, sensors_frame(tasks, done), meta


def _outcome_dict(outcome: Outcome) -> dict[str, Any]:
    return {"status": outcome.status, "message": outcome.message, "measurement": outcome.measurement}
