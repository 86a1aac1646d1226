"""Failures end cleanly: empty evaluations, full tracebacks in rule logs, one-line input errors."""

from __future__ import annotations

import types
from pathlib import Path

import pandas as pd
import pytest

from perfzoo.evaluate import best_per_target, metrics_table, per_family_table
from perfzoo.workflow import run_step


def test_evaluate_with_no_held_out_rows_writes_empty_tables() -> None:
    """Every family failed: no prediction rows; the tables are empty, not a KeyError."""
    predictions = pd.DataFrame(columns=["target", "regressor", "split", "fold", "set", "family", "y_true", "y_pred"])
    noise = pd.DataFrame({"target": ["latency_ms"], "noise_mape": [0.02]})
    metrics = metrics_table(predictions, noise)
    assert metrics.empty and {"target", "mape", "noise_floor_mape"} <= set(metrics.columns)
    assert best_per_target(metrics).empty
    assert per_family_table(predictions).empty and "family" in per_family_table(predictions).columns


def test_rule_log_gets_the_full_traceback(tmp_path: Path) -> None:
    log = tmp_path / "rule.log"
    job = types.SimpleNamespace(log=[str(log)])

    def failing_step() -> None:
        {}["target"]

    with pytest.raises(KeyError):
        run_step(job, failing_step)
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "failing_step" in text and "KeyError: 'target'" in text


def test_torn_journal_line_does_not_swallow_the_next_entry(tmp_path: Path) -> None:
    from perfzoo.profiling.runner import Journal

    path = tmp_path / "s0000.journal.jsonl"
    journal = Journal(path, "fp")
    journal.append({"key": "a/0", "status": "ok"})
    with path.open("a") as fh:  # a kill in the middle of writing an entry
        fh.write('{"key": "b/0", "sta')
    journal.append({"key": "c/0", "status": "ok"})
    assert Journal(path, "fp").load().keys() == {"a/0", "c/0"}


def test_a_failed_30_gb_cpu_allocation_is_oom() -> None:
    torch = pytest.importorskip("torch")
    from perfzoo.profiling.worker import is_out_of_memory

    try:
        torch.empty(30 * 10**9 * 1000, dtype=torch.uint8)  # 30 TB: beyond any test machine
    except RuntimeError as exc:
        assert is_out_of_memory(exc), str(exc)
    else:
        pytest.skip("the allocation succeeded (overcommitting allocator)")
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
