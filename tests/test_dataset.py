"""Dataset stage: labels aggregated from raw iterations; bad trace files are named."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perfzoo.dataset.build import (
    aggregate_runs,
    check_one_memory_label,
    noise_floor,
    read_traces,
    status_counts,
)
from perfzoo.io import InputError
from perfzoo.profiling.runner import TRACE_COLUMNS


def trace(config_id: str, repeat: int, times: list[float], status: str = "ok", batch: int = 4) -> pd.DataFrame:
    rows = [{"model_id": "m" + config_id, "config_id": config_id, "mode": "inference", "batch": batch,
             "repeat": repeat, "iter": i, "time_ms": t, "status": status, "message": "", "peak_mem_mb": 100.0 + repeat,
             "n_warmup": 1, "stop_reason": "max_iters", "threads": 1} for i, t in enumerate(times)]
    return pd.DataFrame(rows, columns=TRACE_COLUMNS).assign(device="cpu", trace_file="t.parquet")


def test_labels_are_medians_of_raw_iterations() -> None:
    traces = pd.concat([trace("a", 0, [3.0, 1.0, 2.0, 10.0, 2.5]), trace("a", 1, [2.0, 2.2, 2.4]),
                        trace("b", 0, [math.nan], status="oom")])
    runs = aggregate_runs(traces)
    a0 = runs[(runs["config_id"] == "a") & (runs["repeat"] == 0)].iloc[0]
    assert a0["latency_ms"] == 2.5 and a0["n_iters"] == 5
    assert a0["latency_ci_lo"] <= 2.5 <= a0["latency_ci_hi"]
    assert a0["throughput"] == pytest.approx(4 / 2.5 * 1000)
    assert a0["cv"] == pytest.approx(np.std([3, 1, 2, 10, 2.5], ddof=1) / np.mean([3, 1, 2, 10, 2.5]))
    assert runs.loc[runs["config_id"] == "b", "status"].item() == "oom"
    floor = noise_floor(runs).set_index("target")
    assert floor.loc["latency_ms", "noise_mape"] == pytest.approx(abs(2.2 - 2.5) / 2.5 * 100)
    assert floor.loc["peak_mem_mb", "noise_mape"] == pytest.approx(1.0)
    counts = status_counts(runs).set_index("status")["configs"].to_dict()
    assert counts == {"ok": 1, "oom": 1}
    assert "memory_reference_mb" not in runs  # traces written before the reference was measured per shard
    with_reference = aggregate_runs(traces.assign(memory_reference_mb=[95.0] * 5 + [80.0] * 3 + [math.nan]))
    assert with_reference.set_index(["config_id", "repeat"])["memory_reference_mb"].to_dict() == pytest.approx(
        {("a", 0): 95.0, ("a", 1): 80.0, ("b", 0): math.nan}, nan_ok=True)


def test_noise_floor_has_a_bootstrap_interval_over_the_repeated_pairs() -> None:
    times = {"a": (2.0, 2.0), "b": (4.0, 4.4), "c": (5.0, 5.0), "d": (1.0, 1.5)}  # pairs 0, 10, 0, 50 % apart
    runs = aggregate_runs(pd.concat([trace(c, r, [t]) for c, pair in times.items() for r, t in enumerate(pair)]))
    floor = noise_floor(runs).set_index("target").loc["latency_ms"]
    assert floor["pairs"] == 4 and floor["noise_mape"] == pytest.approx(15.0)
    assert 0.0 <= floor["noise_lo90"] < 15.0 < floor["noise_hi90"] <= 50.0
    one_pair = aggregate_runs(pd.concat([trace("a", 0, [2.0]), trace("a", 1, [2.2])]))
    alone = noise_floor(one_pair).set_index("target").loc["latency_ms"]
    assert alone["noise_mape"] == pytest.approx(10.0) and math.isnan(alone["noise_lo90"])  # no interval from one


def test_truncated_trace_file_is_named(tmp_path) -> None:
    path = tmp_path / "s0000.parquet"
    trace("a", 0, [1.0, 2.0]).drop(columns=["device", "trace_file"]).to_parquet(path)
    assert len(read_traces(path)) == 2
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"s0000\.parquet.*corrupted"):
        read_traces(path)


def test_trace_with_wrong_columns_or_status_is_named(tmp_path) -> None:
    path = tmp_path / "bad.parquet"
    pd.DataFrame({"x": [1]}).to_parquet(path)
    with pytest.raises(InputError, match=r"bad\.parquet.*missing columns"):
        read_traces(path)
    trace("a", 0, [1.0]).drop(columns=["device", "trace_file"]).assign(status="fine").to_parquet(path)
    with pytest.raises(InputError, match=r"bad\.parquet.*unknown status"):
        read_traces(path)


def test_a_cpu_device_whose_shards_mix_the_two_memory_labels_is_stopped_naming_the_former_files() -> None:
    hardware = {"cpu": {"kind": "cpu"}, "gpu": {"kind": "cuda"}}
    traces = pd.DataFrame({
        "device": ["cpu", "cpu", "cpu", "gpu"], "status": ["ok", "ok", "error", "ok"],
        "trace_file": ["traces/cpu/s0000.parquet", "traces/cpu/s0001.parquet", "traces/cpu/s0002.parquet",
                       "traces/gpu/s0000.parquet"],
        "peak_rss_total_mb": [120.0, math.nan, math.nan, math.nan]})
    with pytest.raises(InputError, match=r"^device 'cpu': 1 trace file\(s\) \(traces/cpu/s0001.parquet\) hold "
                                         r"measurements of the former peak-memory label"):
        check_one_memory_label(traces, hardware)
    check_one_memory_label(traces[traces["trace_file"] != "traces/cpu/s0001.parquet"], hardware)  # one label
    check_one_memory_label(traces.drop(columns="peak_rss_total_mb"), hardware)  # all measured before the change
