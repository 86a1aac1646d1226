"""CPU profiling: isolated workers turn crashes, OOM and hangs into statuses; the journal resumes."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest

from perfzoo.io import InputError
from perfzoo.profiling import microbench
from perfzoo.profiling.interference import MIN_COUNTED_WINDOW_S
from perfzoo.profiling.measure import warm_up
from perfzoo.profiling.runner import Journal, plan_tasks, profile_shard_with_ops, traces_frame
from perfzoo.profiling.worker import run_isolated
from perfzoo.stats import median_ci, relative_ci_halfwidth
from perfzoo.models.zoo import expand_zoo, manifest_frame

from conftest import FAULTY

SETTINGS = {"warmup_iters": 1, "min_iters": 3, "max_iters": 6, "max_time_s": 0.3, "ci_target": 0.02,
            "timeout_s": 60, "max_rss_mb": 8000, "repeat_every": 0, "cooldown_s": 0, "optimizer": "sgd",
            "threads": 1, "num_classes": 10}


def faulty_spec(function: str) -> dict:
    return {"config_id": "0" * 12, "model_id": "m", "builder": "python", "name": f"{FAULTY}:{function}",
            "builder_kwargs": "{}", "input_shape": "[4]", "dtype": "float32", "batch": 2, "mode": "inference"}


def test_median_ci_brackets_the_median() -> None:
    values = np.arange(1, 101, dtype=float)
    med, lo, hi = median_ci(values)
    assert med == 50.5 and lo < med < hi
    assert (lo, hi) == (41.0, 61.0)  # ranks n/2 -/+ 1.96 sqrt(n)/2 = 40.2, 59.8 -> floor/ceil, 0-based
    assert relative_ci_halfwidth([5.0] * 10) == 0.0


def test_tiny_model_measures_until_a_stop_rule() -> None:
    outcome = run_isolated("cpu", faulty_spec("build_tiny"), SETTINGS)
    assert outcome.status == "ok", outcome.message
    m = outcome.measurement
    assert 3 <= len(m["times_ms"]) <= 6 and all(t > 0 for t in m["times_ms"])
    assert m["stop_reason"] in {"ci_target", "max_iters", "max_time"}
    assert m["peak_mem_mb"] >= 0 and m["extra"]["threads"] == 1


def test_a_head_narrower_than_the_class_count_is_an_error_naming_the_setting() -> None:
    spec = {**faulty_spec("build_tiny"), "mode": "training"}  # two outputs
    outcome = run_isolated("cpu", spec, SETTINGS)  # targets drawn below num_classes 10
    assert outcome.status == "error"
    assert "logits have 2 classes" in outcome.message and "zoo.num_classes" in outcome.message
    assert run_isolated("cpu", spec, {**SETTINGS, "num_classes": 2}).status == "ok"


def test_the_step_checks_its_targets_before_the_loss_sees_them() -> None:
    """On CUDA a target beyond the logits is a device-side assert with no cause named: the step raises first,
    whatever the loss would do (here the loss is never reached: no PyTorch message in the error)."""
    import torch

    from perfzoo.profiling.core import make_step

    step = make_step(torch.nn.Linear(4, 2), torch.randn(3, 4), torch.tensor([0, 1, 5]), "training", "sgd")
    with pytest.raises(InputError) as raised:
        step()
    assert "logits have 2 classes" in str(raised.value) and "go up to 5" in str(raised.value)
    assert "out of bounds" not in str(raised.value)
    make_step(torch.nn.Linear(4, 6), torch.randn(3, 4), torch.tensor([0, 1, 5]), "training", "sgd")()


def test_build_failure_is_an_error_status() -> None:
    outcome = run_isolated("cpu", faulty_spec("build_broken"), SETTINGS)
    assert outcome.status == "error"
    assert "this model cannot be built" in outcome.message


def test_hang_is_killed_as_timeout() -> None:
    outcome = run_isolated("cpu", faulty_spec("build_hang"), {**SETTINGS, "timeout_s": 3})
    assert outcome.status == "timeout"
    assert "timeout_s=3" in outcome.message


def test_memory_hog_is_killed_as_oom() -> None:
    outcome = run_isolated("cpu", faulty_spec("build_hog"), {**SETTINGS, "max_rss_mb": 1500})
    assert outcome.status == "oom"
    assert "max_rss_mb=1500" in outcome.message


def small_shard(config) -> pd.DataFrame:
    config["zoo"]["families"]["broken"] = {"builder": "python", "input_shape": [4], "modes": ["inference"],
                                           "models": [f"{FAULTY}:build_broken"]}
    return manifest_frame(expand_zoo(config))


def test_shard_goes_on_after_a_failure_and_resumes_from_journal(config, tmp_path) -> None:
    configs = small_shard(config)
    journal = tmp_path / "s.journal.jsonl"
    settings = {**SETTINGS, "repeat_every": 2}
    result = profile_shard_with_ops(configs, "cpu", {"kind": "cpu"}, settings, journal, progress=False)
    traces, meta = result.traces, result.meta
    n_tasks = len(plan_tasks(configs, 2))
    assert meta["tasks"] == n_tasks and meta["tasks_measured_now"] == n_tasks
    failed = traces[traces["status"] == "error"]
    assert set(failed["model_id"]) == set(configs.loc[configs["builder"] == "python", "model_id"])
    assert (traces["status"] == "ok").sum() > len(configs)  # the other configs were measured
    assert traces.groupby(["config_id", "repeat"]).ngroups == n_tasks
    reference = meta["memory_reference"]  # measured before the shard's tasks, carried by each of their rows
    assert reference["config"] == "resnet18@64px inference b1" and reference["peak_mem_mb"] > 0
    assert (traces["memory_reference_mb"] == reference["peak_mem_mb"]).all()
    # the label leaves out the library pages the step mapped; the whole resident set's peak is kept beside it
    ok = traces[traces["status"] == "ok"]
    assert (ok["rss_file_growth_mb"] >= 0).all() and (ok["peak_rss_total_mb"] > ok["peak_mem_mb"]).all()
    assert failed[["peak_rss_total_mb", "rss_file_growth_mb"]].isna().all().all()

    # the repeats come from another worker server than the first measurements (independent of its layout)
    lines = journal.read_text().splitlines()
    servers = {}
    for entry in map(json.loads, lines[1:]):
        servers.setdefault(entry["key"].split("/")[1], set()).add(entry["worker_server_pid"])
    assert len(servers["0"]) == 1 and len(servers["1"]) == 1 and servers["0"] != servers["1"]

    # a job killed after two tasks: keep the header and two entries, plus a torn line being written
    journal.write_text("\n".join(lines[:3]) + "\n" + lines[3][: len(lines[3]) // 2])
    again = profile_shard_with_ops(configs, "cpu", {"kind": "cpu"}, settings, journal, progress=False)
    resumed, meta2 = again.traces, again.meta
    assert meta2["tasks_resumed_from_journal"] == 2
    assert meta2["tasks_measured_now"] == n_tasks - 2
    keys = ["config_id", "repeat", "iter"]
    assert not resumed.duplicated(keys).any()
    assert resumed.groupby(["config_id", "repeat"]).ngroups == n_tasks
    kept = [json.loads(line)["key"] for line in lines[1:3]]
    first = traces.assign(key=traces["config_id"] + "/" + traces["repeat"].astype(str))
    again = resumed.assign(key=resumed["config_id"] + "/" + resumed["repeat"].astype(str))
    pd.testing.assert_frame_equal(first[first["key"].isin(kept)].reset_index(drop=True),
                                  again[again["key"].isin(kept)].reset_index(drop=True))
    measured_now = again[~again["key"].isin(kept)]  # the rest: with the reference of the second run
    assert (measured_now["memory_reference_mb"] == meta2["memory_reference"]["peak_mem_mb"]).all()
    done = profile_shard_with_ops(configs, "cpu", {"kind": "cpu"}, settings, journal, progress=False)
    assert done.meta["tasks_measured_now"] == 0 and "nothing measured" in done.meta["memory_reference"]["missing"]
    pd.testing.assert_frame_equal(done.traces, resumed)  # every row keeps the reference it was measured with


def test_journal_of_other_settings_is_set_aside(tmp_path) -> None:
    path = tmp_path / "j.jsonl"
    Journal(path, "aaa").append({"key": "x/0", "status": "ok", "message": "", "measurement": None})
    assert Journal(path, "aaa").load().keys() == {"x/0"}
    assert Journal(path, "bbb").load() == {}
    assert list(tmp_path.glob("j.jsonl.superseded-*"))


def test_failed_task_is_one_status_row(config) -> None:
    configs = small_shard(config)
    tasks = plan_tasks(configs, 0)
    done = {t.key: {"status": "oom", "message": "boom", "measurement": None} for t in tasks}
    df = traces_frame(tasks, done)
    assert len(df) == len(tasks)
    assert df["time_ms"].isna().all() and (df["status"] == "oom").all()


@pytest.mark.parametrize("repeat_every", [0, 1, 3])
def test_repeat_subset_is_stable(config, repeat_every) -> None:
    configs = small_shard(config)
    tasks = plan_tasks(configs, repeat_every)
    repeats = [t for t in tasks if t.repeat == 1]
    assert len(repeats) == sum(1 for c in configs["config_id"] if repeat_every and int(c, 16) % repeat_every == 0)
    assert tasks[: len(configs)] == [t for t in tasks if t.repeat == 0]


def test_measuring_off_linux_stops_with_one_line_naming_the_device(monkeypatch) -> None:
    monkeypatch.setattr(microbench.sys, "platform", "darwin")
    monkeypatch.setattr(microbench.platform, "system", lambda: "Darwin")
    with pytest.raises(InputError, match=r"^device cpu: measuring needs Linux .* this machine runs Darwin; "):
        microbench.check_device("cpu", {"kind": "cpu", "threads": 1})


def test_two_windows_time_each_config_again_after_the_shards_other_configs(config, tmp_path) -> None:
    configs = small_shard(config)
    journal = tmp_path / "s.journal.jsonl"
    settings = {**SETTINGS, "repeat_every": 2, "windows": 2}
    result = profile_shard_with_ops(configs, "cpu", {"kind": "cpu"}, settings, journal, progress=False)
    traces = result.traces
    ok = traces[traces["status"] == "ok"]
    assert not ok.empty and (traces.loc[traces["status"] != "ok", "window"].isna()).all()
    per_task = ok.groupby(["config_id", "repeat"])["window"].agg(set)
    assert (per_task == {0.0, 1.0}).all()  # every measured task has both windows
    second = ok[ok["window"] == 1]
    # a later window re-warms with one step, or more where the window would end before the counters can judge it
    assert (second["n_warmup"] >= 1).all() and second["peak_mem_mb"].notna().all()  # the first window's label

    entries = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    measured = [e for e in entries if e["status"] == "ok"]
    assert all(len(e["later_windows"]) == 1 and e["later_windows"][0]["status"] == "ok" for e in measured)
    # each pass's first windows are all taken before its second windows
    for repeat in ("0", "1"):
        of_pass = [e for e in measured if e["key"].endswith(f"/{repeat}")]
        last_first = max(e["attempts"][-1]["finished"] for e in of_pass)
        assert all(e["later_windows"][0]["attempts"][0]["started"] >= last_first for e in of_pass)
    # the repeats still come from another worker server than the first measurements
    servers = {e["key"].split("/")[1]: e["worker_server_pid"] for e in measured}
    assert servers["0"] != servers["1"]
    from perfzoo.profiling.core import _LINGERING_SERVERS
    assert not _LINGERING_SERVERS  # the first server, stopped while its workers were held, was collected

    # the label is the mean of the two windows' medians; the dataset says how many windows it has
    from perfzoo.dataset.build import aggregate_runs
    runs = aggregate_runs(traces.assign(device="cpu", trace_file="s.parquet"))
    runs = runs[runs["status"] == "ok"].set_index(["config_id", "repeat"])
    medians = ok.groupby(["config_id", "repeat", "window"])["time_ms"].median().unstack()
    np.testing.assert_allclose(runs.loc[medians.index, "latency_ms"], medians.mean(axis=1))
    assert (runs["n_windows"] == 2).all()
    assert ((runs["latency_ci_lo"] <= runs["latency_ms"]) & (runs["latency_ms"] <= runs["latency_ci_hi"])).all()
    retimed = sum(len(w["attempts"]) > 1 for e in measured for w in e["later_windows"])
    assert result.meta["interference"]["second_windows_retimed"] == retimed  # counted beside remeasured
    assert (runs["n_iters"] == ok.groupby(["config_id", "repeat"]).size().loc[runs.index]).all()


def test_a_trace_without_windows_keeps_the_median_of_its_iterations() -> None:
    from perfzoo.dataset.build import aggregate_runs
    row = {"device": "cpu", "config_id": "c", "repeat": 0, "model_id": "m", "mode": "inference", "batch": 1,
           "status": "ok", "message": "", "trace_file": "t", "peak_mem_mb": 1.0, "stop_reason": "max_iters"}
    times = [5.0, 1.0, 2.0, 9.0, 3.0]
    runs = aggregate_runs(pd.DataFrame([{**row, "iter": i, "time_ms": t} for i, t in enumerate(times)]))
    assert runs.loc[0, "latency_ms"] == 3.0 and runs.loc[0, "n_windows"] == 1
    two = pd.DataFrame([{**row, "iter": i, "time_ms": t, "window": w}
                        for w, ts in enumerate([times, [10.0, 12.0, 11.0]]) for i, t in enumerate(ts)])
    runs = aggregate_runs(two)
    assert runs.loc[0, "latency_ms"] == 7.0 and runs.loc[0, "n_windows"] == 2 and runs.loc[0, "n_iters"] == 8
    # the CI: the median of the windows' bounds (1-9 and 10-12 here), so it brackets the label
    assert runs.loc[0, "latency_ci_lo"] == 5.5 and runs.loc[0, "latency_ci_hi"] == 10.5


def test_collecting_stopped_worker_servers_returns_while_one_still_runs() -> None:
    """A server that has not ended within ``wait_s`` stays listed (collected later): a worker that holds it does
    not stall the caller until it ends; once it ends, a call collects it."""
    import subprocess

    from perfzoo.profiling.core import _LINGERING_SERVERS, reap_worker_servers

    server = subprocess.Popen(["sleep", "30"])  # stands in for a server whose last worker still runs
    _LINGERING_SERVERS.append(server.pid)
    try:
        reap_worker_servers(wait_s=0.2)
        assert server.pid in _LINGERING_SERVERS and server.poll() is None  # returned while it still ran
        server.kill()
        reap_worker_servers(wait_s=30.0)
        assert server.pid not in _LINGERING_SERVERS
    finally:
        server.kill()
        if server.pid in _LINGERING_SERVERS:
            _LINGERING_SERVERS.remove(server.pid)


def test_warm_up_lasts_until_the_cpu_counters_can_judge_the_window() -> None:
    calls: list[int] = []
    closed: list[int] = []
    ran = warm_up(lambda: calls.append(1), 3, time.perf_counter() - 10.0, lambda: closed.append(1))
    assert ran == len(calls) == len(closed) == 3  # a window already long enough: the configured steps only
    calls.clear()
    closed.clear()
    started = time.perf_counter()
    ran = warm_up(lambda: calls.append(1), 3, started, lambda: closed.append(1))
    assert time.perf_counter() - started >= MIN_COUNTED_WINDOW_S
    assert ran == len(calls) > 3 and len(closed) == 4  # one memory phase for the extra steps


def test_a_worker_starts_with_its_servers_imports_frozen_for_the_collector() -> None:
    """The worker server freezes what its imports made (perfzoo.profiling.frozen_heap), so a worker's collections
    walk only its own objects (and copy none of the server's pages): torch's objects are frozen in every worker."""
    outcome = run_isolated("cpu", faulty_spec("report_frozen_objects"), SETTINGS)
    assert outcome.status == "error" and "frozen objects: " in outcome.message, outcome.message
    assert int(outcome.message.rsplit(" ", 1)[1]) > 100_000


def _server_of_a_worker() -> int:
    """The process id of the worker server the next isolated worker is forked from."""
    outcome = run_isolated("cpu", faulty_spec("report_worker_server"), SETTINGS)
    assert outcome.message.startswith("RuntimeError: worker server: "), outcome.message
    return int(outcome.message.rsplit(" ", 1)[1])


def test_a_spare_worker_server_is_ready_beside_the_first_and_serves_the_workers_after_a_restart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """start_worker_servers(spare=True) returns once both servers made their imports; a restart makes the spare the
    worker server, so the next worker is forked from it at once; with both running it starts nothing (not even a
    folder for ready files); an untaken spare is stopped."""
    import os

    import psutil

    from perfzoo.profiling import core

    core.restart_worker_server()  # a server of an earlier test is not the one started here
    core.start_worker_servers(spare=True)
    first, spare = core.worker_server_pid(), core._SPARE._forkserver_pid
    assert first != spare and core.READY_ENV not in os.environ
    for pid in (first, spare):  # both made their imports and wait for requests
        server = psutil.Process(pid)
        assert server.status() == psutil.STATUS_SLEEPING
        assert any("libtorch_cpu" in m.path for m in server.memory_maps())
    assert _server_of_a_worker() == first
    assert core.restart_worker_server() and core.worker_server_pid() == spare and core._SPARE is None
    assert _server_of_a_worker() == spare
    core.start_worker_servers(spare=True)  # the server runs: only a spare is started
    unused = core._SPARE._forkserver_pid
    assert core.worker_server_pid() == spare != unused
    with monkeypatch.context() as patch:
        patch.setattr(core.tempfile, "TemporaryDirectory", None)  # a folder made now would fail the call
        assert core.start_worker_servers(spare=True) == [] and core._SPARE._forkserver_pid == unused
    core.stop_spare_worker_server()
    assert not psutil.pid_exists(unused) and core._SPARE is None and _server_of_a_worker() == spare


def test_a_server_still_importing_when_the_wait_ends_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """start_worker_servers says which server had not made its imports when READY_TIMEOUT_S ran out (the shard
    records it in its metadata), and nothing when the servers were ready; a server the wait gave up on goes on to
    serve workers (its ready file's folder is gone by then), the spare too, after a restart."""
    from perfzoo.profiling import core

    core.restart_worker_server()
    core.stop_spare_worker_server()
    monkeypatch.setattr(core, "READY_TIMEOUT_S", 0.0)  # torch's import alone takes seconds
    not_ready = core.start_worker_servers(spare=True)
    pids = [core.worker_server_pid(), core._SPARE._forkserver_pid]
    assert not_ready == [f"worker server {pid} still importing after 0 s" for pid in pids]
    assert _server_of_a_worker() == pids[0]  # it goes on to serve workers
    monkeypatch.setattr(core, "READY_TIMEOUT_S", 300.0)
    core.restart_worker_server()  # the spare becomes the server; a new spare is started and waited for
    assert core.start_worker_servers(spare=True) == [] and core.worker_server_pid() == pids[1]
    assert _server_of_a_worker() == pids[1]
    core.stop_spare_worker_server()


def test_a_shard_restarts_its_server_only_where_its_repeats_begin() -> None:
    from perfzoo.profiling.runner import Task, restarts_server

    def task(repeat: int) -> Task:
        return Task(config={}, repeat=repeat)

    assert restarts_server([task(0), task(0), task(1)])
    assert not restarts_server([task(0), task(0)]) and not restarts_server([task(1), task(1)])


def test_a_held_worker_times_the_same_step_again_and_survives_a_new_worker_server() -> None:
    from perfzoo.profiling.core import _LINGERING_SERVERS, reap_worker_servers, restart_worker_server
    from perfzoo.profiling.worker import start_held

    spec = {**faulty_spec("build_tiny"), "mode": "training"}
    first, held = start_held("cpu", spec, {**SETTINGS, "num_classes": 2})
    assert first.status == "ok" and held is not None and first.measurement["peak_mem_mb"] > 0
    assert restart_worker_server()  # does not wait for the held worker; the old server lingers until it ends
    again = held.again()
    assert again.status == "ok" and len(again.measurement["times_ms"]) >= SETTINGS["min_iters"]
    assert again.measurement["n_warmup"] >= 1 and np.isnan(again.measurement["peak_mem_mb"])
    assert "interference" in again.measurement["extra"]  # the second window runs between probes too
    assert again.measurement["extra"]["interference"]["window_s"] >= MIN_COUNTED_WINDOW_S  # a tiny step: judged
    held.close()
    failed, none = start_held("cpu", faulty_spec("build_broken"), SETTINGS)
    assert failed.status == "error" and none is None
    reap_worker_servers(wait_s=5.0)  # the old server ends with its last worker, and is collected
    assert not _LINGERING_SERVERS
