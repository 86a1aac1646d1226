"""Interference: a busy core during a real profiling run is flagged or re-measured; the verdict, the
counts for the report and the one-setting-per-device check."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from fakes import FakeNvml
from perfzoo.io import InputError
from perfzoo.profiling import nvml
from perfzoo.profiling.interference import (
    Policy,
    assess,
    drop_flagged_runs,
    flagged_per_device,
    probe_baseline,
)
from perfzoo.profiling.runner import profile_shard_with_ops
from perfzoo.report.page import health_line
from perfzoo.dataset.build import aggregate_runs, status_counts
from perfzoo.profiling.worker import run_isolated
from perfzoo.models.zoo import expand_zoo, manifest_frame

SETTINGS = {"warmup_iters": 1, "min_iters": 3, "max_iters": 8, "max_time_s": 0.3, "ci_target": 0.02,
            "timeout_s": 60, "max_rss_mb": 8000, "repeat_every": 0, "cooldown_s": 0, "optimizer": "sgd",
            "num_classes": 10}
BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def measurement(probes, load=0.0, steal=0.0, error=""):
    return {"extra": {"interference": {"probes": probes, "probe_error": error, "other_cpu_load": load,
                                       "steal_frac": steal, "cpus": 2}}}


def test_busy_core_during_a_real_run_is_flagged_or_remeasured(config, tmp_path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    threads = len(cpus)
    settings = {**SETTINGS, "threads": threads,
                "interference": {"tolerance": 0.3, "load_tolerance": 0.25, "retries": 1, "wait_s": 0.5}}
    configs = manifest_frame(expand_zoo(config))
    hardware = {"measurement_setting": {"threads": threads}, "probe_baseline": probe_baseline("cpu", threads)}
    run_isolated("cpu", configs.iloc[0].to_dict(), settings)  # start the worker server before the busy window
    busy = subprocess.Popen([sys.executable, "-c", BUSY, str(cpus[0])])
    window = {"start": time.time()}

    def stop() -> None:
        os.kill(busy.pid, 9)
        busy.wait()
        window["end"] = time.time()

    timer = threading.Timer(4.0, stop)
    timer.start()
    journal = tmp_path / "j.jsonl"
    try:
        result = profile_shard_with_ops(configs, "cpu", {"kind": "cpu", "threads": threads}, settings,
                                        journal, progress=False, hardware=hardware)
    finally:
        timer.cancel()
        if busy.poll() is None:
            stop()
    traces, meta = result.traces, result.meta
    entries = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    def within(attempt: dict) -> bool:
        return attempt["started"] >= window["start"] and attempt["finished"] <= window["end"]

    inside = [a for e in entries for a in e["attempts"] if within(a)]
    assert inside, "no measurement ran entirely inside the busy window"
    assert all(a["interference"] for a in inside), inside
    disturbed = {e["key"].split("/")[0] for e in entries if within(e["attempts"][0])}
    rows = traces.drop_duplicates("config_id").set_index("config_id")
    for config_id in disturbed:
        assert rows.loc[config_id, "interference"] or rows.loc[config_id, "attempts"] > 1
    assert meta["interference"]["flagged"] + meta["interference"]["remeasured"] >= len(disturbed)
    assert rows["probe_ratio"].notna().all() and (rows["probe_message"] == "").all()
    assert meta["measurement_setting"] == {"threads": threads}
    # the report's first screen says how many configs stayed flagged
    read = traces.assign(device="cpu", trace_file=str(journal))  # as perfzoo.dataset.build.read_traces gives them
    statuses = status_counts(aggregate_runs(read), read)
    kept_flagged = int((rows["interference"].fillna("") != "").sum())
    assert int(statuses["flagged"].sum()) == kept_flagged
    line = health_line(statuses, pd.DataFrame(), [], 0)
    assert f"{kept_flagged} flagged for interference (of {len(rows)} configs;" in line, line


def test_other_thread_count_stops_before_measuring(config, tmp_path) -> None:
    configs = manifest_frame(expand_zoo(config))
    with pytest.raises(InputError) as err:
        profile_shard_with_ops(configs, "cpu", {"kind": "cpu", "threads": 1}, {**SETTINGS, "threads": 1},
                               tmp_path / "j.jsonl", progress=False,
                               hardware={"measurement_setting": {"threads": 2}})
    text = str(err.value)
    assert "\n" not in text and "'cpu'" in text and "threads is 1 in this run but 2 in" in text
    assert not (tmp_path / "j.jsonl").exists()


def test_verdict_names_each_reason_and_never_invents_a_ratio() -> None:
    baseline = {"gemm_ms": 1.0, "copy_ms": 2.0}
    policy = Policy(tolerance=0.3, load_tolerance=0.25, steal_tolerance=0.05)
    clean = assess(measurement([{"gemm_ms": 1.1, "copy_ms": 2.0}]), baseline, policy)
    assert clean.interference == "" and clean.probe_ratio == pytest.approx(1.1) and clean.probe_message == ""
    slow = assess(measurement([{"gemm_ms": 1.0, "copy_ms": 2.0}, {"gemm_ms": 1.0, "copy_ms": 5.0}], load=0.9,
                              steal=0.2), baseline, policy, ["other processes on the GPU: [7]"])
    assert slow.probe_ratio == pytest.approx(2.5)
    for part in ("GPU: [7]", "probe 2.50x", "0.90 of 2 CPUs", "steal time 20%"):
        assert part in slow.interference
    spare = measurement([{"gemm_ms": 1.0, "copy_ms": 2.0}], load=0.9)
    spare["extra"]["interference"]["threads"] = 1  # one of the two CPUs is left to other processes
    assert assess(spare, baseline, policy).interference == ""
    spare["extra"]["interference"]["other_cpu_load"] = 1.3
    assert assess(spare, baseline, policy).interference == "other processes used 1.30 of 2 CPUs"
    failed = assess(measurement([], error="RuntimeError: boom"), baseline, policy)
    assert math.isnan(failed.probe_ratio) and "boom" in failed.probe_message
    no_base = assess(measurement([{"gemm_ms": 1.0, "copy_ms": 2.0}]), {"missing": "probe failed: x"}, policy)
    assert math.isnan(no_base.probe_ratio) and "probe failed: x" in no_base.probe_message
    none = assess(None, baseline, policy)
    assert math.isnan(none.probe_ratio) and none.probe_message and none.interference == ""


def test_flagged_rows_counted_and_left_out_of_fitting() -> None:
    traces = pd.DataFrame({"device": ["a", "a", "a", "b"], "config_id": ["x", "x", "y", "x"],
                           "repeat": [0, 0, 0, 0], "power_limit_w": [math.nan] * 4,
                           "interference": ["probe 2.00x its baseline"] * 2 + ["", ""]})
    counts = flagged_per_device(traces)
    assert counts.to_dict("records") == [{"device": "a", "measurements": 2, "flagged": 1},
                                         {"device": "b", "measurements": 1, "flagged": 0}]
    runs = traces.drop_duplicates(["device", "config_id"]).drop(columns="interference")
    kept = drop_flagged_runs(runs, traces)
    assert list(zip(kept["device"], kept["config_id"])) == [("a", "y"), ("b", "x")]
    assert drop_flagged_runs(runs, traces.drop(columns="interference")) is runs


def test_gpu_state_names_other_processes_and_foreign_throttling() -> None:
    fake = FakeNvml()
    gpu = nvml.open_device(0, lib=fake)
    state, reasons = nvml.gpu_state(gpu)
    assert reasons == [] and state["pids"] == [] and state["sm_clock_mhz"] == 1410.0
    fake.other_pids, fake.throttle_bits = [4242], 0x40 | 0x4  # hw thermal; the power cap is not foreign
    state, reasons = nvml.gpu_state(gpu)
    assert reasons == ["other processes on the GPU: [4242]", "clocks throttled (hw_thermal)"]
    gpu.close()
