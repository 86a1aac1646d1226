"""A forced rerun killed mid-shard keeps the previous complete shard; stale temporaries are cleaned."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from perfzoo.finished import kept_path

from conftest import code_env, own_code, snakemake, snakemake_command

pytestmark = pytest.mark.e2e

CONFIG = {
    "devices": {"cpu": {"kind": "cpu", "threads": 1}},
    "zoo": {"num_classes": 10, "families": {"mlp": {
        "builder": "mlp", "input_shape": [64], "batch_sizes": [1, 2, 4, 8], "modes": ["inference"],
        "models": [{"name": "mlp_small", "kwargs": {"in_features": 64, "hidden": [32]}}]}}},
    "shards": {"size": 8},
    "profiling": {"warmup_iters": 1, "min_iters": 3, "max_iters": 50, "max_time_s": 1.0, "repeat_every": 0},
}
SHARD = "results/traces/cpu/s0000.parquet"


def test_killed_forcerun_keeps_the_complete_shard(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    snakemake(tmp_path, SHARD, cores=1)
    finished = (tmp_path / SHARD).read_bytes()
    assert kept_path(tmp_path / SHARD).read_bytes() == finished

    journal = tmp_path / "results/traces/cpu/s0000.journal.jsonl"
    proc = subprocess.Popen(snakemake_command("--forcerun", "trace_cpu", "--", SHARD, cores=1), cwd=tmp_path,
                            env=code_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (journal.exists() and len(journal.read_text().splitlines()) >= 2):
            time.sleep(0.05)
        assert journal.exists(), "the rerun never journalled a config"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (tmp_path / SHARD).exists()  # Snakemake removed the output before the job started
    assert kept_path(tmp_path / SHARD).read_bytes() == finished  # ... but the complete shard is kept

    stale = tmp_path / "results/traces/cpu/.s0000.parquet.abcd1234.tmp"  # as a kill mid-write leaves it
    stale.write_bytes(b"partial")
    snakemake(tmp_path, "--unlock", cores=1, timeout=120)
    snakemake(tmp_path, "--rerun-incomplete", SHARD, cores=1)
    assert not stale.exists()
    assert kept_path(tmp_path / SHARD).read_bytes() == (tmp_path / SHARD).read_bytes() != finished


def test_deleted_hardware_description_is_measured_again(finished_workflow: Path, tmp_path: Path) -> None:
    """results/hardware/<device>.json is a target of the default run, not only an input of finished rules."""
    folder = tmp_path / "copy"
    shutil.copytree(finished_workflow, folder, symlinks=True)  # keeps mtimes, as `cp -a` does
    (folder / "results/hardware/cpu.json").unlink()
    dry = snakemake(folder, "-n", **own_code(folder), cores=1, timeout=300)
    assert "rule hardware_cpu:" in dry.stdout, dry.stdout[-3000:]
