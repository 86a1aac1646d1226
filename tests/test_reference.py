"""The memory reference of the hardware record: measured by the profiler's own worker, missing with a reason
whenever it was not measured."""

from __future__ import annotations

import math

from perfzoo.features.op_kinds import COSTED_KINDS
from perfzoo.hardware import CALL_COST_COLUMNS, CALL_COST_KINDS, hardware_calibration
from perfzoo.profiling import call_costs, reference
from perfzoo.profiling.microbench import describe_device
from perfzoo.profiling.worker import Outcome


def test_cpu_hardware_record_carries_a_measured_memory_reference() -> None:
    record = describe_device("cpu", {"kind": "cpu", "threads": 1})
    ref = record["memory_reference"]
    assert ref["config"] == "resnet18@64px inference b1" and ref["threads"] == 1, ref
    # ResNet-18's weights alone are 44.7 MB of float32; the label counts them and the step's activations
    assert 44 < ref["peak_mem_mb"] < 1000 and ref["latency_ms"] > 0, ref
    # the weights and activations are anonymous memory, in the label; the code the step runs first is
    # file-backed, outside it
    growth = ref["rss_growth_mb"]
    assert set(growth) == {"anon", "file", "shmem"} and growth["anon"] > 44 and growth["file"] > 0, growth
    assert growth["anon"] - 1 <= ref["peak_mem_mb"] < growth["anon"] + growth["file"], ref
    # the depthwise temporary's factor, measured with the device's threads (memory_sim applies it as measured)
    temporary = record["depthwise_temporary"]
    assert temporary["threads"] == 1 and temporary["factor"] > 1, temporary
    assert temporary["factor"] == temporary["temporary_bytes"] / temporary["weight_bytes"]
    # a tiny call of each kind timed with the device's threads (composed's per-call prior), as hardware columns
    calls = record["call_costs"]
    assert calls["threads"] == 1 and list(calls["us"]) == list(CALL_COST_KINDS), calls
    assert all(0 < us < 10_000 for us in calls["us"].values()), calls
    columns = hardware_calibration(record)
    assert {columns[CALL_COST_COLUMNS[kind]] for kind in CALL_COST_KINDS} == set(calls["us"].values())


def test_the_timed_kinds_are_costed_kinds_and_a_device_without_the_timing_gets_no_number(monkeypatch) -> None:
    assert set(CALL_COST_KINDS) <= set(COSTED_KINDS)  # composed prices each of them per call
    assert set(call_costs.tiny_calls()) == set(CALL_COST_KINDS)
    missing = call_costs.call_costs("cuda", 1)
    assert set(missing) == {"missing"} and "cuda" in missing["missing"]
    assert all(math.isnan(v) for c, v in hardware_calibration({"call_costs": missing}).items())
    monkeypatch.setattr(call_costs, "tiny_calls", lambda: {"elementwise": lambda: 1 / 0})
    assert call_costs.call_costs("cpu", 1) == {"missing": "the measurement failed: ZeroDivisionError: division by zero"}


def test_a_failed_reference_step_is_missing_with_its_reason(monkeypatch) -> None:
    monkeypatch.setattr(reference, "run_isolated", lambda kind, spec, settings: Outcome("oom", "worker killed"))
    assert reference.memory_reference("cpu", 1) == {
        "missing": "the reference step failed (oom): worker killed"}


def test_no_reference_number_on_cuda() -> None:
    ref = reference.memory_reference("cuda", 1)
    assert set(ref) == {"missing"} and "cuda" in ref["missing"]


def test_the_reference_is_one_config_the_zoo_stage_would_write() -> None:
    row = reference.reference_config()
    assert (row["builder"], row["name"], row["batch"], row["mode"]) == ("torchvision", "resnet18", 1, "inference")
    assert row["input_shape"] == "[3, 64, 64]" and row["precision"] == "fp32"

