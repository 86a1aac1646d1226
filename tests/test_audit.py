"""perfzoo audit: re-hashing the provenance chain of predictions and workflow outputs; --explain."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from test_predict import CONFIG, perfzoo_cli, workflow_dir  # noqa: F401 - the session fixture

TRACE = "results/traces/cpu/s0000.parquet"
RECORD = "results/predictions/mlp_small.json"


@pytest.fixture(scope="module")
def predicted(workflow_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A copy of the workflow run with the prediction record of a model identical to the profiled
    ``mlp_small`` (64 → 32 → 32 → 10), inference at batch 4."""
    from torch import nn

    from perfzoo.prediction import predict

    run = tmp_path_factory.mktemp("audited") / "run"
    shutil.copytree(workflow_dir, run, ignore=shutil.ignore_patterns("predictions"))
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10)
    )
    predict(model, batch=4, input_shape=64, results=run / "results", config=CONFIG).save(run / RECORD)
    return run


@pytest.fixture
def run(predicted: Path, tmp_path: Path) -> Path:
    """A private copy of the audited run, free to tamper with."""
    copy = tmp_path / "run"
    shutil.copytree(predicted, copy)
    return copy


def _status(result, key: str) -> str:
    return next(link.status for link in result.links if link.key == key)


def test_fresh_outputs_audit_ok(run: Path) -> None:
    from perfzoo.auditing import audit

    result = audit(run / RECORD)
    assert result.ok and result.exit_code == 0
    keys = {link.key for link in result.links}
    assert {
        TRACE,
        "results/traces/a100/s0000.parquet",
        "results/dataset/dataset.parquet",
        "results/zoo/manifest.parquet",
        "results/hardware/cpu.json",
    } <= keys
    assert any(k.endswith(".models.json") for k in keys)
    assert all(link.path.is_relative_to(run) for link in result.links)  # resolved inside the copy
    assert audit(run / "results/dataset/dataset.parquet").ok
    proc = perfzoo_cli("audit", RECORD, cwd=run)
    assert proc.returncode == 0, proc.stderr
    assert f"OK           {TRACE}" in proc.stdout or f"OK         {TRACE}" in proc.stdout
    assert "chain intact" in proc.stdout


def test_one_changed_trace_byte_is_reported(run: Path) -> None:
    from perfzoo.auditing import audit

    trace = run / TRACE
    data = bytearray(trace.read_bytes())
    data[len(data) // 2] ^= 0x01
    trace.write_bytes(bytes(data))
    result = audit(run / RECORD)
    assert not result.ok and result.exit_code == 1
    assert _status(result, TRACE) == "CHANGED"
    assert [link.key for link in result.broken] == [TRACE]
    proc = perfzoo_cli("audit", RECORD, cwd=run)
    assert proc.returncode == 1
    line = next(ln for ln in proc.stdout.splitlines() if TRACE in ln)
    assert line.startswith("CHANGED") and "results/dataset/dataset.parquet" in line
    assert "chain BROKEN" in proc.stdout
    # the dataset itself, audited directly, names the same trace
    assert _status(audit(run / "results/dataset/dataset.parquet"), TRACE) == "CHANGED"


def test_deleted_trace_is_missing(run: Path) -> None:
    from perfzoo.auditing import audit

    (run / TRACE).unlink()
    result = audit(run / RECORD)
    assert _status(result, TRACE) == "MISSING" and result.exit_code == 1
    assert _status(result, "results/traces/a100/s0000.parquet") == "OK"
    proc = perfzoo_cli("audit", RECORD, cwd=run)
    assert proc.returncode == 1 and any(
        ln.startswith("MISSING") and TRACE in ln for ln in proc.stdout.splitlines()
    )


def test_trace_behind_a_deleted_dataset_is_still_checked(run: Path) -> None:
    from perfzoo.auditing import audit

    (run / "results/dataset/dataset.parquet").unlink()
    (run / TRACE).write_bytes(b"tampered")
    result = audit(run / RECORD)
    assert _status(result, "results/dataset/dataset.parquet") == "MISSING"
    assert _status(result, TRACE) == "CHANGED"  # through the chain the prediction carries


def test_tampered_predictor_file_is_named(run: Path) -> None:
    from perfzoo.auditing import audit

    record = json.loads((run / RECORD).read_text())
    predictor = record["predictors"]["latency_ms"]["path"]
    doc = json.loads((run / predictor).read_text())
    first = next(iter(doc["folds"].values()))
    first["state"]["medians_"] = first["state"]["medians_"]  # same content, rewritten: a new hash
    (run / predictor).write_text(json.dumps(doc, indent=1))
    result = audit(run / RECORD)
    assert [link.key for link in result.broken] == [predictor]
    proc = perfzoo_cli("audit", RECORD, cwd=run)
    assert proc.returncode == 1 and f"CHANGED  {predictor}" in proc.stdout


def test_explain_lists_k_nearest_rows(run: Path) -> None:
    from perfzoo.auditing import explain

    table = explain(run / RECORD, k=3)
    assert len(table) == 6 and set(table["device"]) == {"cpu", "a100"}
    data = pd.read_parquet(run / "results/dataset/dataset.parquet").set_index("row_id")
    for device, rows in table.groupby("device"):
        assert list(rows["rank"]) == [1, 2, 3] and rows["distance"].is_monotonic_increasing
        assert (data.loc[rows["row_id"], "device"] == device).all()
        assert list(rows["latency_ms"]) == pytest.approx(list(data.loc[rows["row_id"], "latency_ms"]))
    # the predicted config (mlp_small, inference, batch 4) was profiled: it is the nearest, at distance 0
    nearest = table[table["rank"] == 1]
    assert (nearest["label"] == "mlp_small@64").all() and (nearest["batch"] == 4).all()
    assert (nearest["mode"] == "inference").all() and nearest["distance"].max() == pytest.approx(0, abs=1e-6)
    proc = perfzoo_cli("audit", "--explain", RECORD, "-k", "2", cwd=run)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()[:1].isdigit()]
    assert len(lines) == 4 and "mlp_small@64" in lines[0]


def test_audit_bad_input(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perfzoo.cli import main

    plain = tmp_path / "plain.json"
    plain.write_text('{"a": 1}')
    cases = {
        "no provenance record": ["audit", str(plain)],
        "file not found": ["audit", str(tmp_path / "nope.parquet")],
        "needs a prediction record": ["audit", "--explain", str(run / "results/dataset/dataset.parquet")],
    }
    for expected, args in cases.items():
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("perfzoo: error:") and expected in err, err
