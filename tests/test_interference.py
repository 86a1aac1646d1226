"""Interference: a busy core during a real profiling run is flagged or re-measured, and so is a window that
slows down halfway (cpu, and cuda against fakes); the verdict, the counts for the report and the
one-setting-per-device check."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict

import pandas as pd
import psutil
import pytest

from fakes import FakeNvml
from perfzoo.io import InputError
from perfzoo.profiling import nvml, runner
from perfzoo.profiling.interference import (
    CpuSnapshot,
    Policy,
    assess,
    cpu_window,
    drop_flagged_runs,
    flagged_per_device,
    probe_baseline,
    spread_ratio,
)
from perfzoo.profiling.cuda import measure_on_cuda
from perfzoo.profiling.runner import profile_shard_with_ops
from perfzoo.report.page import health_line
from perfzoo.dataset.build import aggregate_runs, status_counts
from perfzoo.profiling.worker import Outcome, run_isolated
from perfzoo.models.zoo import expand_zoo, manifest_frame

SETTINGS = {"warmup_iters": 1, "min_iters": 3, "max_iters": 8, "max_time_s": 0.3, "ci_target": 0.02,
            "timeout_s": 60, "max_rss_mb": 8000, "repeat_every": 0, "cooldown_s": 0, "optimizer": "sgd",
            "num_classes": 10}
BUSY = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
PACED = """
import time
from pathlib import Path

from torch import nn


class Paced(nn.Module):
    \"\"\"Sleeps fast_ms per forward; after the first fast_calls forwards, slow_ms (a window that slows down
    halfway). With a marker file, only the first worker process that runs it slows down.\"\"\"

    def __init__(self, fast_ms, slow_ms, fast_calls, marker=""):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.fast_ms, self.slow_ms, self.fast_calls, self.marker = fast_ms, slow_ms, fast_calls, marker
        self.calls, self.slows = 0, None

    def forward(self, x):
        if x.device.type != "meta":
            if self.slows is None:
                self.slows = not (self.marker and Path(self.marker).exists())
                if self.marker:
                    Path(self.marker).touch()
            self.calls += 1
            slow = self.slows and self.calls > self.fast_calls
            time.sleep((self.slow_ms if slow else self.fast_ms) / 1000)
        return self.fc(x)


def build(**kwargs):
    return Paced(**kwargs)
"""


def measurement(probes, load=0.0, steal=0.0, error=""):
    return {"extra": {"interference": {"probes": probes, "probe_error": error, "other_cpu_load": load,
                                       "steal_frac": steal, "cpus": 2}}}


def test_busy_core_during_a_real_run_is_flagged_or_remeasured(config, tmp_path, monkeypatch) -> None:
    # the shard's memory reference (tests/test_profiling.py) would take the first seconds of the busy window
    monkeypatch.setattr(runner, "memory_reference", lambda kind, threads: {"missing": "not measured here"})
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
    assert (rows["probe_gemm_ms"] > 0).all() and (rows["probe_copy_ms"] > 0).all()
    assert meta["measurement_setting"] == {"threads": threads}
    # the report's first screen says how many configs stayed flagged
    read = traces.assign(device="cpu", trace_file=str(journal))  # as perfzoo.dataset.build.read_traces gives them
    statuses = status_counts(aggregate_runs(read), read)
    kept_flagged = int((rows["interference"].fillna("") != "").sum())
    assert int(statuses["flagged"].sum()) == kept_flagged
    line = health_line(statuses, pd.DataFrame(), [], 0)
    assert f"{kept_flagged} flagged for interference (of {len(rows)} configs;" in line, line


def paced_zoo(tmp_path) -> dict:
    """Three sleeping models: steady, slowing down halfway in its first worker only, and always."""
    module = tmp_path / "paced.py"
    module.write_text(PACED)
    paces = {"steady": {"fast_calls": 10**6},
             "slows_once": {"fast_calls": FAST_CALLS, "marker": str(tmp_path / "slowed")},
             "slows_always": {"fast_calls": FAST_CALLS}}
    models = [{"name": f"{module}:build", "variant": variant,
               "kwargs": {"fast_ms": 10, "slow_ms": 40, **pace}} for variant, pace in paces.items()]
    family = {"builder": "python", "input_shape": [4], "batch_sizes": [1], "modes": ["inference"],
              "models": models}
    return {"num_classes": 2, "families": {"paced": family}}



# 20 warm-up steps (0.2 s: the window already lasts what the CPU counters judge, so the worker adds no step) and 8
# timed iterations (the CI target is out of reach): the slowing models run 3 at 10 ms, then 5 at 40 ms, a median
# 4x the fastest; the steady one stays near 1x (it sleeps: load hardly moves it)
PACED_SETTINGS = {**SETTINGS, "threads": 1, "num_classes": 2, "ci_target": 1e-9, "max_time_s": 5.0, "warmup_iters": 20,
                  "interference": {"load_tolerance": 1000.0, "steal_tolerance": 1.0, "spread_tolerance": 0.5,
                                   "retries": 1, "wait_s": 0.1}}
FAST_CALLS = PACED_SETTINGS["warmup_iters"] + 3  # the warm-up steps and 3 timed iterations at 10 ms


def assert_slow_halves_remeasured(configs: pd.DataFrame, traces: pd.DataFrame, meta: dict, journal) -> None:
    """The steady model measured once and clean, the one slowing once re-measured and kept clean, the one
    slowing always re-measured and kept flagged by its spread."""
    variant_of = dict(zip(configs["config_id"], configs["variant"]))
    rows = traces.drop_duplicates("config_id").assign(variant=lambda d: d["config_id"].map(variant_of))
    rows = rows.set_index("variant")
    entries = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    verdicts = {variant_of[e["key"].split("/")[0]]: [a["interference"] for a in e["attempts"]]
                for e in entries}
    assert verdicts["steady"] == [""]
    assert verdicts["slows_once"][0].startswith("median ") and verdicts["slows_once"][1:] == [""]
    assert len(verdicts["slows_always"]) == 2
    assert all("x the fastest iteration" in v for v in verdicts["slows_always"])
    assert rows.loc["slows_always", "interference"] == verdicts["slows_always"][-1]
    assert rows.loc["slows_once", "interference"] == "" and rows.loc["slows_once", "attempts"] == 2
    assert meta["interference"] == {"flagged": 1, "remeasured": 2, "second_windows_retimed": 0}


def test_window_with_a_slow_half_is_remeasured_and_kept_flagged_while_it_stays_so(tmp_path) -> None:
    configs = manifest_frame(expand_zoo({"zoo": paced_zoo(tmp_path)}))
    journal = tmp_path / "j.jsonl"
    result = profile_shard_with_ops(configs, "cpu", {"kind": "cpu", "threads": 1}, PACED_SETTINGS, journal,
                                    progress=False)
    assert_slow_halves_remeasured(configs, result.traces, result.meta, journal)


def test_the_next_configs_are_measured_while_a_disturbed_one_waits_for_its_remeasurement(tmp_path) -> None:
    configs = manifest_frame(expand_zoo({"zoo": paced_zoo(tmp_path)}))
    wait_s = 2.0
    settings = {**PACED_SETTINGS, "interference": {**PACED_SETTINGS["interference"], "wait_s": wait_s}}
    journal = tmp_path / "j.jsonl"
    result = profile_shard_with_ops(configs, "cpu", {"kind": "cpu", "threads": 1}, settings, journal,
                                    progress=False)
    assert_slow_halves_remeasured(configs, result.traces, result.meta, journal)
    variant_of = dict(zip(configs["config_id"], configs["variant"]))
    attempts = {variant_of[e["key"].split("/")[0]]: e["attempts"]
                for e in map(json.loads, journal.read_text().splitlines()[1:])}
    for variant in ("slows_once", "slows_always"):  # each re-measured no sooner than wait_s after it was disturbed
        first, again = attempts[variant]
        assert again["started"] >= first["finished"] + wait_s
    # the later of the two disturbed configs was measured during the earlier one's wait, not after it
    earlier, later = sorted(("slows_once", "slows_always"), key=lambda v: attempts[v][0]["started"])
    assert attempts[earlier][0]["finished"] <= attempts[later][0]["started"] < attempts[earlier][1]["started"]


class ScriptedMeasurer:
    """The runner's view of a measurer, scripted: every first window is clean and held by a worker of the given
    memory; the second windows of ``disturbed`` wait ``wait_s`` once before being re-timed. ``log`` records each
    window taken, with the workers alive then."""

    kind = "cpu"

    def __init__(self, memory_mb: dict[str, float], disturbed: set[str], wait_s: float) -> None:
        self.settings = {"windows": 2}
        self.memory_mb, self.disturbed, self.wait_s = memory_mb, disturbed, wait_s
        self.alive: set[str] = set()
        self.log: list[tuple[str, str, frozenset[str]]] = []

    def window_steps(self, task: runner.Task, hold: bool):
        name = task.config["config_id"]
        self.alive.add(name)
        self.log.append(("first", name, frozenset(self.alive)))
        worker = ScriptedWindows()
        worker.private_mb = self.memory_mb[name]
        worker.close = lambda: self.alive.discard(name)
        return {"key": task.key, "status": "ok"}, worker
        yield  # a generator, as the measurer's

    def later_window_steps(self, entry: dict, worker: ScriptedWindows):
        name = entry["key"].split("/")[0]
        try:
            self.log.append(("second", name, frozenset(self.alive)))
            if name in self.disturbed:
                yield time.time() + self.wait_s
                self.log.append(("second again", name, frozenset(self.alive)))
        finally:
            worker.close()
        return {**entry, "later_windows": [{}]}


def scripted_run(tmp_path, memory_mb: dict[str, float], disturbed: set[str], wait_s: float = 0.3
                 ) -> ScriptedMeasurer:
    tasks = [runner.Task({"config_id": name}, 0) for name in memory_mb]
    measurer = ScriptedMeasurer(memory_mb, disturbed, wait_s)
    runner._run_tasks(tasks, {}, runner.Journal(tmp_path / "j.jsonl", "f"), measurer, "", progress=False)
    assert not measurer.alive
    return measurer


def test_a_second_window_waiting_for_its_retiming_lets_the_next_second_windows_go_first(tmp_path) -> None:
    measurer = scripted_run(tmp_path, {"a": 1.0, "b": 1.0, "c": 1.0}, {"a"})
    assert [(window, name) for window, name, _ in measurer.log] == [
        ("first", "a"), ("first", "b"), ("first", "c"), ("second", "a"), ("second", "b"), ("second", "c"),
        ("second again", "a")]


def test_workers_waiting_for_their_retiming_count_against_the_memory_held(tmp_path) -> None:
    # "big" alone is over the share of memory workers may hold: the held "a" is timed again first, and as "a"
    # waits for its re-timing, that wait is sat out before anything else is measured
    big = runner.HOLD_MEMORY_SHARE * 2 * psutil.virtual_memory().total / 2**20
    measurer = scripted_run(tmp_path, {"a": 1.0, "big": big, "c": 1.0}, {"a"})
    assert [(window, name) for window, name, _ in measurer.log] == [
        ("first", "a"), ("first", "big"), ("second", "a"), ("second again", "a"), ("first", "c"),
        ("second", "big"), ("second", "c")]
    assert all(len(alive) <= 2 for _, _, alive in measurer.log)


class ScriptedWindows:
    """A held worker whose windows time as scripted (the iterations of each call of ``again``)."""

    def __init__(self, *windows: list[float]) -> None:
        self.windows, self.closed = list(windows), False

    def again(self) -> Outcome:
        return Outcome("ok", "", {"times_ms": self.windows.pop(0), "extra": {}})

    def close(self) -> None:
        self.closed = True


def finished(steps):
    """The result of a paused measurement, its pauses slept through (as the runner does at the end of a pass)."""
    results = []
    waiting = runner._Waiting()
    waiting.start(steps, results.append)
    waiting.finish_all()
    return results[0]


def test_a_second_window_is_retimed_while_disturbed_and_its_reasons_join_the_entrys() -> None:
    measurer = runner.Measurer("cpu", PACED_SETTINGS)
    entry = {"key": "k", "status": "ok", "assessment": {"interference": ""}}
    slow_half, steady = [10.0] * 3 + [40.0] * 5, [10.0] * 8
    # disturbed, then clean: re-timed once, the clean window kept, nothing flagged
    held = ScriptedWindows(slow_half, steady)
    kept = finished(measurer.later_window_steps(entry, held))
    window = kept["later_windows"][0]
    assert [bool(a["interference"]) for a in window["attempts"]] == [True, False]
    assert window["measurement"]["times_ms"] == steady and kept["assessment"]["interference"] == ""
    assert held.closed and measurer.still_disturbed == 0
    # disturbed in every attempt (retries: 1): the last attempt is kept and the entry says so
    held = ScriptedWindows(slow_half, slow_half)
    kept = finished(measurer.later_window_steps(entry, held))
    assert len(kept["later_windows"][0]["attempts"]) == 2 and held.closed
    assert kept["assessment"]["interference"].startswith("second window: median ")
    assert measurer.still_disturbed == 1 and entry["assessment"]["interference"] == ""  # the first window's own


def test_cuda_window_with_a_slow_half_is_remeasured_alike(tmp_path, monkeypatch) -> None:
    # the CUDA measurement code in-process, against the NVML and CUDA fakes (CUDA 'events' are wall clock)
    from test_cuda_profiling import CUDA_DEVICE, FakeCuda
    from test_cuda_profiling import FakeNvml as TwoGpuNvml

    fake = TwoGpuNvml()

    def in_process(kind: str, spec: dict, settings: dict) -> Outcome:
        assert kind == "cuda"
        return Outcome("ok", "", asdict(measure_on_cuda(spec, settings, backend=FakeCuda(), nvml_lib=fake)))

    monkeypatch.setattr(runner, "run_isolated", in_process)
    configs = manifest_frame(expand_zoo({"zoo": paced_zoo(tmp_path)}))
    journal = tmp_path / "j.jsonl"
    result = runner.profile_shard_with_ops(configs, "a100", CUDA_DEVICE, PACED_SETTINGS, journal,
                                           progress=False, nvml_lib=fake, cuda_backend=FakeCuda())
    assert_slow_halves_remeasured(configs, result.traces, result.meta, journal)


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
    # the probe's own times are kept raw: geometric means over its runs before and after the window
    assert (slow.probe_gemm_ms, slow.probe_copy_ms) == (pytest.approx(1.0), pytest.approx(math.sqrt(10.0)))
    for part in ("GPU: [7]", "probe 2.50x", "0.90 of 2 CPUs", "steal time 20%"):
        assert part in slow.interference
    spare = measurement([{"gemm_ms": 1.0, "copy_ms": 2.0}], load=0.9)
    spare["extra"]["interference"]["threads"] = 1  # one of the two CPUs is left to other processes
    assert assess(spare, baseline, policy).interference == ""
    spare["extra"]["interference"]["other_cpu_load"] = 1.3
    assert assess(spare, baseline, policy).interference == "other processes used 1.30 of 2 CPUs"
    failed = assess(measurement([], error="RuntimeError: boom"), baseline, policy)
    assert math.isnan(failed.probe_ratio) and "boom" in failed.probe_message
    assert math.isnan(failed.probe_gemm_ms) and math.isnan(failed.probe_copy_ms)  # no probe, no time
    no_base = assess(measurement([{"gemm_ms": 1.0, "copy_ms": 2.0}]), {"missing": "probe failed: x"}, policy)
    assert math.isnan(no_base.probe_ratio) and "probe failed: x" in no_base.probe_message
    none = assess(None, baseline, policy)
    assert math.isnan(none.probe_ratio) and none.probe_message and none.interference == ""


def test_a_starved_worker_is_named_by_its_cpu_share_and_only_when_judged() -> None:
    def with_share(share: float | None) -> dict:
        m = measurement([{"gemm_ms": 1.0, "copy_ms": 2.0}])
        if share is not None:
            m["extra"]["interference"]["own_cpu_share"] = share
        return m

    baseline, policy = {"gemm_ms": 1.0, "copy_ms": 2.0}, Policy(cpu_share_tolerance=0.15)
    assert assess(with_share(0.5), baseline, policy).interference == "the worker ran 0.50 of a CPU"
    assert assess(with_share(0.97), baseline, policy).interference == ""
    assert assess(with_share(None), baseline, policy).interference == ""  # a CUDA window: no share
    assert assess(with_share(0.5), baseline, Policy()).interference == ""  # not judged by default


def test_cpu_window_share_is_own_time_per_second_and_missing_without_a_window() -> None:
    before = CpuSnapshot(t_s=10.0, busy_s=100.0, steal_s=0.0, own_s=50.0, cpus=2)
    after = CpuSnapshot(t_s=12.0, busy_s=103.0, steal_s=0.0, own_s=51.0, cpus=2)
    window = cpu_window(before, after)
    assert window["own_cpu_share"] == pytest.approx(0.5) and window["other_cpu_load"] == pytest.approx(1.0)
    assert "own_cpu_share" not in cpu_window(before, after, own_share=False)  # a CUDA worker's window
    empty = cpu_window(before, before)
    assert all(math.isnan(empty[k]) for k in ("other_cpu_load", "steal_frac", "own_cpu_share"))
    assert "own_cpu_share" not in cpu_window(before, before, own_share=False)
    # a window of a few ms is not judged by the counters (their ticks would decide it)
    short = cpu_window(before, CpuSnapshot(t_s=10.005, busy_s=100.004, steal_s=0.0, own_s=50.004, cpus=2))
    assert all(math.isnan(short[k]) for k in ("other_cpu_load", "steal_frac", "own_cpu_share"))
    assert short["window_s"] == pytest.approx(0.005)


def test_a_worker_sharing_its_cpu_with_busy_processes_is_flagged_by_its_share(config, tmp_path) -> None:
    # one busy loop on every CPU: the one-thread worker gets about half a CPU; the load rule is out of reach
    cpus = sorted(os.sched_getaffinity(0))
    settings = {**SETTINGS, "threads": 1, "interference": {"load_tolerance": 1000.0, "cpu_share_tolerance": 0.15}}
    configs = manifest_frame(expand_zoo(config)).head(1)
    quiet = run_isolated("cpu", configs.iloc[0].to_dict(), settings)
    quiet_share = quiet.measurement["extra"]["interference"]["own_cpu_share"]
    busy = [subprocess.Popen([sys.executable, "-c", BUSY, str(cpu)]) for cpu in cpus]
    try:
        time.sleep(0.3)
        result = profile_shard_with_ops(configs, "cpu", {"kind": "cpu", "threads": 1}, settings,
                                        tmp_path / "j.jsonl", progress=False)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    reason = result.traces["interference"].iloc[0]
    assert reason.startswith("the worker ran ") and reason.endswith(" of a CPU"), (reason, quiet_share)
    assert float(reason.split()[3]) < 0.85  # quiet_share: the same config alone (not asserted: a loaded machine)


def test_spread_verdict_flags_a_window_with_a_slow_half_not_a_steady_one() -> None:
    policy = Policy(spread_tolerance=0.2)
    steady, slow_half = [10.0, 10.3, 9.9, 10.1, 10.2], [10.0, 10.1, 13.5, 13.2, 13.4]
    assert assess({"times_ms": steady}, None, policy).interference == ""
    assert assess({"times_ms": slow_half}, None, policy).interference == "median 1.32x the fastest iteration"
    assert assess({"times_ms": [10.0, 10.1, 30.0, 10.2, 9.9]}, None, policy).interference == ""  # one outlier
    assert assess({"times_ms": slow_half}, None, Policy()).interference == ""  # not judged by default
    both = {"times_ms": slow_half, **measurement([{"gemm_ms": 1.0, "copy_ms": 2.0}], load=1.9)}
    verdict = assess(both, {"gemm_ms": 1.0, "copy_ms": 2.0}, policy)
    assert verdict.interference == "median 1.32x the fastest iteration; other processes used 1.90 of 2 CPUs"
    assert math.isnan(spread_ratio([])) and assess({"times_ms": []}, None, policy).interference == ""


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
