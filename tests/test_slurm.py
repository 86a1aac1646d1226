"""`snakemake --profile` against a real single-node SLURM cluster (tests/slurm/setup.sh starts it).

Checks: profiling jobs go through sbatch; one device can be re-measured without touching the other's
traces; a job cancelled mid-shard is resubmitted and resumes with no lost or duplicated rows; a job on a
node whose GPU does not match its device fails and makes Snakemake exit non-zero.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import ROOT, code_env, snakemake_command

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch not found: no SLURM client on this machine"),
]
PROFILE = ROOT / "tests" / "slurm" / "profile"
MLP = {"builder": "mlp", "input_shape": [64], "batch_sizes": [2, 8],
       "models": [{"name": "mlp_small", "kwargs": {"in_features": 64, "hidden": [32, 32]}}]}


def cluster_config(profiling: dict | None = None, extra_devices: dict | None = None) -> dict:
    devices = {
        "cpu": {"kind": "cpu", "threads": 1, "slurm": {"partition": "cpu", "runtime": 5, "mem_mb": 1000}},
        "cpugpu": {"kind": "cpu", "threads": 1,
                   "slurm": {"partition": "gpu", "gres": "gpu:1", "runtime": 5, "mem_mb": 1000}},
        **(extra_devices or {}),
    }
    return {
        "devices": devices,
        "zoo": {"num_classes": 10, "families": {"mlp": MLP}},
        "shards": {"size": 2},
        "profiling": profiling or {"warmup_iters": 1, "min_iters": 3, "max_iters": 5, "max_time_s": 0.2},
        "fit": {"targets": ["latency_ms"], "regressors": ["linear"]},
        "splits": {"schemes": ["random"]},
    }


def snakemake(workdir: Path, *args: str, timeout: int = 400) -> subprocess.CompletedProcess[str]:
    cmd = ["timeout", "-s", "INT", "-k", "30", str(timeout), *snakemake_command("--profile", str(PROFILE), *args,
                                                                              cores=None)]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=code_env())
    print(f"$ snakemake {' '.join(args)} -> exit {proc.returncode}")
    for line in job_id_lines(proc.stderr):
        print("   ", line)
    return proc


def job_id_lines(log: str) -> list[str]:
    return [ln.strip() for ln in log.splitlines() if "SLURM jobid" in ln or "SLURM run ID" in ln]


def submitted_ids(log: str) -> list[str]:
    return re.findall(r"SLURM jobid (\d+)", log)


@pytest.fixture(scope="module")
def cluster() -> None:
    probe = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if probe.returncode != 0 or not any(state in probe.stdout for state in ("idle", "mix", "alloc")):
        pytest.fail(f"sbatch exists but the SLURM cluster is not up (run tests/slurm/setup.sh): {probe.stderr}")


@pytest.fixture(scope="module")
def workdir(cluster, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("slurm")
    (path / "config.yaml").write_text(yaml.safe_dump(cluster_config()))
    proc = snakemake(path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(submitted_ids(proc.stderr)) >= 6  # 2 hardware + 2 devices x 2 shards, through sbatch
    return path


def trace_state(path: Path, device: str) -> dict[str, tuple[float, bytes]]:
    files = (p for p in sorted((path / "results/traces" / device).glob("*")) if p.is_file())  # not .finished/
    return {p.name: (p.stat().st_mtime, p.read_bytes()) for p in files}


def test_whole_workflow_runs_through_sbatch(workdir) -> None:
    assert (workdir / "results/report/index.html").exists()
    for device in ("cpu", "cpugpu"):
        for shard in ("s0000", "s0001"):
            meta = json.loads((workdir / f"results/traces/{device}/{shard}.meta.json").read_text())
            assert meta["slurm_job_id"], f"{device}/{shard} did not run inside a SLURM job"
            print(f"{device}/{shard}: SLURM job {meta['slurm_job_id']} on {meta['host']}")


def test_rerun_of_one_device_leaves_the_other_untouched(workdir) -> None:
    before_cpu = trace_state(workdir, "cpu")
    before_gpu = json.loads((workdir / "results/traces/cpugpu/s0000.meta.json").read_text())["slurm_job_id"]
    proc = snakemake(workdir, "--forcerun", "trace_cpugpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    after_gpu = json.loads((workdir / "results/traces/cpugpu/s0000.meta.json").read_text())["slurm_job_id"]
    assert after_gpu != before_gpu
    assert trace_state(workdir, "cpu") == before_cpu
    print(f"rerun of cpugpu: shard s0000 job {before_gpu} -> {after_gpu}; cpu traces unchanged")


def test_cancelled_job_resumes_without_lost_or_duplicated_rows(cluster, tmp_path) -> None:
    # The pause after each config keeps the job mid-shard when it is cancelled, however fast the
    # machine measures: the first config is journalled, the second is still to come.
    slow = {"warmup_iters": 1, "min_iters": 20, "max_iters": 20, "max_time_s": 5.0, "ci_target": 1e-9,
            "cooldown_s": 15.0}
    config = cluster_config(slow)
    del config["devices"]["cpugpu"]
    config["profiling"]["repeat_every"] = 0
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = snakemake_command("--profile", str(PROFILE), "--retries", "1", "profile_cpu", cores=None)
    log = open(tmp_path / "snakemake.log", "w")
    proc = subprocess.Popen(["timeout", "-s", "INT", "-k", "30", "400", *cmd], cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, env=code_env())
    journal = tmp_path / "results/traces/cpu/s0000.journal.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not journal.exists() or len(journal.read_text().splitlines()) < 2):
        time.sleep(0.5)
    rows_at_kill = len(journal.read_text().splitlines()) - 1
    assert 1 <= rows_at_kill < 2, f"the shard was not cancelled mid-way ({rows_at_kill} of 2 configs journalled)"
    meta_job = subprocess.run(["squeue", "-h", "-o", "%i %j", "--states=RUNNING"], capture_output=True,
                              text=True).stdout
    running = [ln.split()[0] for ln in meta_job.splitlines() if ln.strip()]
    subprocess.run(["scancel", *running], check=True)
    print(f"cancelled SLURM job(s) {running} with {rows_at_kill} config(s) in the journal of cpu/s0000")
    assert proc.wait(timeout=420) == 0, (tmp_path / "snakemake.log").read_text()[-3000:]
    meta = json.loads((tmp_path / "results/traces/cpu/s0000.meta.json").read_text())
    traces = pd.read_parquet(tmp_path / "results/traces/cpu/s0000.parquet")
    assert meta["attempt"] == 2 and meta["tasks_resumed_from_journal"] >= rows_at_kill >= 1
    assert not traces.duplicated(["config_id", "repeat", "iter"]).any()
    assert traces.groupby(["config_id", "repeat"]).ngroups == meta["tasks"] == 2
    assert (traces.groupby("config_id").size() == 20).all()
    assert not journal.exists()
    print(f"resumed cpu/s0000 in job {meta['slurm_job_id']} (attempt {meta['attempt']}): "
          f"{meta['tasks_resumed_from_journal']} config(s) from the journal, {meta['tasks_measured_now']} measured "
          f"now, {len(traces)} rows, none duplicated")


def test_gpu_mismatch_fails_the_job_and_snakemake(cluster, tmp_path) -> None:
    fake = {"fakea100": {"kind": "cuda", "gpu_name": "A100",
                         "slurm": {"partition": "gpu", "gres": "gpu:1", "runtime": 5, "mem_mb": 1000}}}
    config = cluster_config(extra_devices=fake)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "--retries", "0", "profile_fakea100")
    assert proc.returncode != 0
    logs = "".join(p.read_text() for p in (tmp_path / ".snakemake" / "slurm_logs").rglob("*.log"))
    logs += "".join(p.read_text() for p in (tmp_path / "logs").rglob("*.log"))
    assert "fakea100" in logs and "A100" in logs
    print(next(ln for ln in logs.splitlines() if "perfzoo: error" in ln))


def test_device_without_partition_is_rejected(cluster, tmp_path) -> None:
    config = cluster_config()
    del config["devices"]["cpugpu"]["slurm"]["partition"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(tmp_path, "results/zoo/manifest.parquet")
    assert proc.returncode != 0
    assert "devices.cpugpu.slurm.partition" in proc.stderr
    assert not (tmp_path / "results").exists()  # rejected before any job ran


def test_unknown_device_target_lists_the_configured_devices(cluster, tmp_path) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cluster_config()))
    proc = snakemake(tmp_path, "profile_a10")
    assert proc.returncode != 0
    assert "unknown device 'a10'" in proc.stderr and "configured devices: cpu, cpugpu" in proc.stderr
