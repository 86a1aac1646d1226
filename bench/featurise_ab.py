"""Two checkouts' featurisation of the same timm jobs, side by side: the import's path, alternated.

    python bench/featurise_ab.py OLD_CHECKOUT/src NEW_CHECKOUT/src [--stride 4] [--rounds 2] [--workers 2]

Every ``stride``-th job of timm's five AMP inference files (one job per model and resolution, every batch
any file lists) is featurised by ``perfzoo.features.pool.featurise_jobs`` with ``workers`` warm workers in a
fresh process per run, the two source trees alternating (old, new, old, new ...), so the machine's drift
falls on both. Prints each run's featurisation wall time, configs per second and CPU seconds (the whole
process's, reading the files included, and its workers'), then the medians and their ratio, and whether every run
gave the same features. Each checkout reads timm's files from its own ``../shared/data/timm-benchmark``
(``bench/timm_import.py``'s ``DATA``): link ``shared`` beside a worktree made elsewhere.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

RUN = r"""
import json, resource, sys, time, hashlib
src, stride, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path[:0] = [src, src.removesuffix("/src") + "/bench"]  # that checkout's import script puts its src first
import pandas as pd
from timm_import import configs_of, DATA, INFERENCE_FILES
from perfzoo.dataset.external import feature_jobs
from perfzoo.features.pool import featurise_jobs
import perfzoo
assert perfzoo.__file__.startswith(src), perfzoo.__file__
configs = pd.concat([configs_of(DATA / f) for f in INFERENCE_FILES], ignore_index=True).drop_duplicates()
jobs = feature_jobs(configs)[0][::stride]
start = time.perf_counter()
results = featurise_jobs(jobs, workers=workers)
wall = time.perf_counter() - start
usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
features = json.dumps([[r.job.name, r.job.resolution, r.reason, {str(b): f for b, f in (r.features or {}).items()}]
                       for r in results], sort_keys=True, default=str)
print(json.dumps({"jobs": len(jobs), "configs": sum(len(j.batches) for j in jobs), "wall": wall,
                  "cpu": sum(u.ru_utime + u.ru_stime for u in usage),
                  "digest": hashlib.sha256(features.encode()).hexdigest()}))
"""


def run(src: str, stride: int, workers: int) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, src, str(stride), str(workers)], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{src}: the run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old_src")
    parser.add_argument("new_src")
    parser.add_argument("--stride", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for round_ in range(args.rounds):
        for label, src in (("old", args.old_src), ("new", args.new_src)):
            result = run(str(Path(src).resolve()), args.stride, args.workers)
            runs[label].append(result)
            print(f"round {round_ + 1} {label}: {result['configs']} configs ({result['jobs']} jobs) in "
                  f"{result['wall']:.1f} s = {result['configs'] / result['wall']:.2f} configs/s; "
                  f"{result['cpu']:.1f} CPU s = {result['configs'] / result['cpu']:.2f} configs per CPU s", flush=True)
    median = {label: statistics.median(r["configs"] / r["wall"] for r in rs) for label, rs in runs.items()}
    cpu = {label: statistics.median(r["configs"] / r["cpu"] for r in rs) for label, rs in runs.items()}
    print(f"median configs/s: old {median['old']:.2f}, new {median['new']:.2f} ({median['new'] / median['old']:.2f}x); "
          f"configs per CPU s: old {cpu['old']:.2f}, new {cpu['new']:.2f} ({cpu['new'] / cpu['old']:.2f}x)")
    digests = {r["digest"] for rs in runs.values() for r in rs}
    print(f"identical features in every run: {len(digests) == 1}")


if __name__ == "__main__":
    main()
