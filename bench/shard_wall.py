"""Wall time of one profile shard under two versions of the code, alternated (the profile rule's own function).

    python bench/shard_wall.py OLD_SRC NEW_SRC --results RESULTS [--shard s0005] [--rounds 2]

Each round measures the shard of a finished run's manifest (``RESULTS/zoo/manifest.parquet``) with the run's
hardware record and the config's profiling settings, once per ``src`` folder, in a fresh interpreter (as a profile
job is), its journal in a temporary folder; printed per run: wall seconds, the shard's own time
(``finished - started`` of its metadata), and its interference counts. Run on an otherwise idle machine."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, yaml
from pathlib import Path
from perfzoo.io import read_json, read_parquet
from perfzoo.models.zoo import shard_configs
from perfzoo.profiling.runner import profile_shard_with_ops, worker_settings
results, shard, journal, config = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
cfg = yaml.safe_load(open(config))
device_cfg = {**cfg["devices"]["cpu"], **read_json(results / "traces" / "cpu" / f"{shard}.meta.json")["device_config"]}
settings = worker_settings(dict(cfg["profiling"]), device_cfg, cfg["zoo"]["num_classes"])
configs = shard_configs(read_parquet(results / "zoo" / "manifest.parquet"), shard)
result = profile_shard_with_ops(configs, "cpu", device_cfg, settings, journal, progress=False,
                                hardware=read_json(results / "hardware" / "cpu.json"))
print(json.dumps({"shard_s": result.meta["finished"] - result.meta["started"], **result.meta["interference"]}))
"""


def one(src: Path, results: Path, shard: str, config: Path) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, str(results), shard, f"{folder}/j.jsonl", str(config)],
                             env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - started
    return {"wall_s": round(wall, 1), **json.loads(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=ROOT / "config.yaml")
    parser.add_argument("--shard", default="s0005")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"old": [], "new": []}
    for round_ in range(args.rounds):
        for name in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
            run = one(getattr(args, name), args.results.resolve(), args.shard, args.config.resolve())
            walls[name].append(run["wall_s"])
            print(f"round {round_ + 1} {name}: {json.dumps(run)}", flush=True)
    old, new = statistics.median(walls["old"]), statistics.median(walls["new"])
    print(f"median wall: old {old:.1f} s, new {new:.1f} s, new/old {new / old:.3f}")


if __name__ == "__main__":
    main()
