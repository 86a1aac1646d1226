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
