"""Featurisation rate (configs/s) on the meta device.

    python bench/featurise_rate.py                       # the default zoo's configs, one by one (as before)
    python bench/featurise_rate.py --timm N [--workers W] # the first N models of two timm files, both ways

The timm mode featurises the configs (model, resolution, mode, batch) of the first N models of the
RTX 4090 and RTX PRO 6000 AMP inference files (batches 1,024 and 2,048 for most models) twice: one
featurisation per config in one process (the old import path), then the import's path
(:func:`perfzoo.features.pool.featurise_jobs`: one build per model, ``W`` warm worker processes). The
second must give the same numbers.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pandas as pd  # noqa: E402

from perfzoo.config import load_config  # noqa: E402
from perfzoo.features.meta import PROCESS_KERNELS, featurise, featurise_manifest  # noqa: E402
from perfzoo.features.pool import FeatureJob, job_builder, featurise_jobs  # noqa: E402
from perfzoo.models.zoo import expand_zoo, manifest_frame  # noqa: E402

TIMM = ROOT.parent / "shared" / "data" / "timm-benchmark"
FILES = ("benchmark-infer-amp-nchw-pt291-cu128-4090.csv", "benchmark-infer-amp-nchw-pt291-cu130-pro6000maxq.csv")


def default_zoo() -> None:
    config = load_config(ROOT / "config.yaml")
    manifest = manifest_frame(expand_zoo(config))
    featurise_manifest(manifest.head(2), config["zoo"]["num_classes"], progress=False)  # warm imports
    PROCESS_KERNELS.clear()  # a cold kernel cache, as the features rule starts with
    start, cpu = time.perf_counter(), cpu_seconds()
    models, layers = featurise_manifest(manifest, config["zoo"]["num_classes"], progress=False)
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    print(f"featurised {len(models)} (model, mode, batch) configs, {len(layers)} layer rows "
          f"in {elapsed:.1f} s: {len(models) / elapsed:.2f} configs/s; {cpu:.1f} CPU s = "
          f"{cpu / len(models):.3f} CPU s per config")
    for mode, g in models.groupby("mode"):
        print(f"  {mode}: {len(g)} configs")


def timm_jobs(n_models: int) -> list[FeatureJob]:
    rows = pd.concat([pd.read_csv(TIMM / f) for f in FILES])
    names = list(dict.fromkeys(pd.read_csv(TIMM / FILES[0])["model"]))[:n_models]
    rows = rows[rows["model"].isin(names)]
    return [FeatureJob("timm", name, "amp", int(res), "inference", tuple(sorted(set(g["infer_batch_size"]))))
            for (name, res), g in rows.groupby(["model", "infer_img_size"], sort=False)]


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the pool's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def equal(a: dict, b: dict) -> bool:
    """Same features (NaN equal to NaN, e.g. graph size where fx cannot trace), ignoring the model id."""
    return a.keys() == b.keys() and all(k == "model_id" or a[k] == b[k] or (a[k] != a[k] and b[k] != b[k])
                                        for k in a)


def timm_rate(n_models: int, workers: int) -> None:
    jobs = timm_jobs(n_models)
    configs = sum(len(j.batches) for j in jobs)
    featurise(job_builder(jobs[0]), (3, 224, 224), 2, "inference", "float32", "warm")  # warm imports
    PROCESS_KERNELS.clear()  # each way starts with a cold kernel cache, as a new import does
    start, cpu = time.perf_counter(), cpu_seconds()
    one_by_one = {}
    for job in jobs:
        for batch in job.batches:
            try:
                one_by_one[(job.name, job.resolution, batch)] = featurise(
                    job_builder(job), (3, job.resolution, job.resolution), batch, "inference", "float32", "x")[0]
            except Exception:  # noqa: BLE001 - an unfeaturisable model counts as done
                one_by_one[(job.name, job.resolution, batch)] = None
    old, old_cpu = time.perf_counter() - start, cpu_seconds() - cpu
    PROCESS_KERNELS.clear()  # the workers fork from this process: not warmed by the pass above
    start, cpu = time.perf_counter(), cpu_seconds()
    results = featurise_jobs(jobs, workers=workers)
    new, new_cpu = time.perf_counter() - start, cpu_seconds() - cpu
    same = all((one_by_one[(r.job.name, r.job.resolution, b)] is None) == bool(r.reason) and (
        r.reason or equal(one_by_one[(r.job.name, r.job.resolution, b)], r.features[b]))
        for r in results for b in r.job.batches)
    print(f"{len(jobs)} timm models x resolution, {configs} configs (AMP inference, RTX 4090 + PRO 6000 batches)")
    methods = pd.Series([r.method or "failed" for r in results]).value_counts().to_dict()
    print(f"  one featurisation per config, 1 process: {old:.1f} s wall, {configs / old:.2f} configs/s; "
          f"{old_cpu:.1f} CPU s = {configs / old_cpu:.2f} configs per CPU s")
    print(f"  the import's path (one build per model), {workers} warm workers: {new:.1f} s wall, "
          f"{configs / new:.2f} configs/s; {new_cpu:.1f} CPU s = {configs / new_cpu:.2f} configs per CPU s, "
          f"i.e. {workers * configs / new_cpu:.2f} configs/s on {workers} idle cores; methods {methods}")
    print(f"  identical features: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timm", type=int, default=0, help="first N timm models (0: the default zoo instead)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.timm:
        timm_rate(args.timm, args.workers)
    else:
        default_zoo()


if __name__ == "__main__":
    main()
