"""Failures end cleanly: empty evaluations, full tracebacks in rule logs, one-line input errors."""

from __future__ import annotations

import types
from pathlib import Path

import pandas as pd
import pytest

from perfzoo.evaluate import best_per_target, metrics_table, per_family_table
from perfzoo.workflow import run_step

from test_predict import run_dir, workflow_dir  # noqa: F401 - the fixtures


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


def _check(config: dict) -> str:
    from perfzoo.config import validate_config
    from perfzoo.io import InputError

    with pytest.raises(InputError) as info:
        validate_config(config)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_config_errors_caught_before_profiling(config, tmp_path, monkeypatch) -> None:
    import copy

    bad_predict = copy.deepcopy(config)
    bad_predict["predict"] = {"net": {"model": "torchvision:resnet181", "input": [3, 32, 32]}}
    assert "predict.net.model" in _check(bad_predict) and "resnet18" in _check(bad_predict)

    fractions = copy.deepcopy(config)
    fractions["splits"] = {"random_fractions": [0.7, 0.3, 0.3]}
    assert "splits.random_fractions" in _check(fractions)

    duplicate = copy.deepcopy(config)
    family = duplicate["zoo"]["families"]["mlp"]
    family["models"].append(copy.deepcopy(family["models"][0]))
    assert "zoo.families.mlp.models[2]: duplicate of models[0]" in _check(duplicate)

    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text("def build():\n    return (\n")
    syntax = copy.deepcopy(config)
    syntax["zoo"]["families"]["user"] = {"builder": "python", "input_shape": [4], "models": ["net.py:build"]}
    assert "net.py:2: syntax error" in _check(syntax)


def test_predict_rejects_empty_devices_and_zero_classes(run_dir) -> None:
    import subprocess
    import sys

    from conftest import ROOT

    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")}
    for args, needle in ((["--devices", ","], "--devices: no device named"),
                         (["--num-classes", "0"], "--num-classes: expected")):
        proc = subprocess.run([sys.executable, "-m", "perfzoo", "predict", "mlp:mlp_small", "--input", "64", *args],
                              cwd=run_dir, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and needle in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr


def test_snakemake_schema_error_is_one_line(tmp_path, config) -> None:
    import yaml

    from conftest import snakemake

    config["shards"] = {"size": "four"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "-n", cores=None, check=False, timeout=300)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    line = next(ln for ln in output.splitlines() if ln.startswith("config: "))
    assert "'four' is not of type 'integer'" in line and "shards" in line
    assert "Failed validating" not in output


def test_predict_fails_when_no_device_has_hardware(run_dir, tmp_path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    from conftest import ROOT

    work = tmp_path / "wf"
    shutil.copytree(run_dir, work, symlinks=True)
    for hw in (work / "results" / "hardware").glob("*.json"):
        hw.unlink()
    proc = subprocess.run([sys.executable, "-m", "perfzoo", "predict", "mlp:mlp_small", "--input", "64",
                           "--devices", "cpu"], cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "no results/hardware/cpu.json" in proc.stderr, proc.stderr[-2000:]
