"""Time `snakemake -n` (DAG building) for a zoo of 10,000 configs on 4 GPU devices; report the job count."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def config(jobs_per_device: int) -> dict:
    widths = [64 * (i + 1) for i in range(125)]  # 125 MLP variants x 10 families x 4 batches x 2 modes
    families = {f"mlp{f}": {"builder": "mlp", "input_shape": [784], "batch_sizes": [1, 8, 32, 128],
                            "models": [{"name": "mlp", "variant": f"w{w}", "kwargs": {"hidden": [w, w + f]}}
                                       for w in widths]} for f in range(10)}
    gpus = {"a100": "A100", "h100": "H100", "l40s": "L40S", "v100": "V100"}
    devices = {d: {"kind": "cuda", "gpu_name": n, "slurm": {"partition": "gpu", "gres": "gpu:1"}}
               for d, n in gpus.items()}
    return {"devices": devices, "zoo": {"families": families}, "shards": {"jobs_per_device": jobs_per_device}}


def main() -> None:
    jobs_per_device = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.yaml").write_text(yaml.safe_dump(config(jobs_per_device)))
        cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-n", "--quiet", "rules"]
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, check=True)
        elapsed = time.perf_counter() - start
    total = re.search(r"^total\s+(\d+)", out.stdout + out.stderr, re.M)
    counts = dict(re.findall(r"^(trace_\w+|hardware_\w+|fit)\s+(\d+)", out.stdout + out.stderr, re.M))
    print(f"10,000 configs x 4 devices, shards.jobs_per_device={jobs_per_device}: "
          f"snakemake -n took {elapsed:.1f} s; planned jobs: {total.group(1) if total else '?'} {counts}")


if __name__ == "__main__":
    main()
