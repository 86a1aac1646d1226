"""Fast featurisation of many imported configs: one build per model, exact batch scaling, warm workers.

An imported table often lists the same model at several batch sizes (and on several devices). The
features of one ``FeatureJob`` (model, resolution, precision, mode) are computed once for all its batch
sizes:

* the model is built once on the meta device and stepped at two probe batches (2 and 4; batch 1 would
  trip BatchNorm's "more than one value per channel" check in training); its fx graph (which has no
  batch dimension) is traced once;
* the batch-proportional features (FLOPs, MACs, activation and input bytes, Gianniti complexities) must
  be exactly proportional (value at 4 == 2 x value at 2, an even integer), and every other feature must be
  equal at both probes; then each requested batch gets ``value(2) / 2 * batch`` — exact integers, the
  same numbers a direct featurisation at that batch gives. Otherwise every batch is featurised directly
  (``method == "direct"``);
* jobs run in a pool of warm worker processes forked after torch, torchvision and timm are imported.

A model that cannot be built or stepped gives no numbers: ``reason`` holds the builder's one-line error.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from perfzoo.io import InputError
from perfzoo.precision import BUILD_DTYPES

PROBE_BATCHES = (2, 4)
PROPORTIONAL = ("flops", "flops_fw", "macs", "activation_bytes", "input_bytes", "complexity_fw", "complexity_bw")
DERIVED = ("train_mem_estimate_bytes",)
PER_CALL = ("model_id", "mode", "batch")
GRAPH = ("graph_nodes", "graph_edges", "graph_error")


@dataclass(frozen=True)
class FeatureJob:
    """One model to featurise at one resolution, precision and mode, for a set of batch sizes."""

    builder: str
    name: str
    precision: str
    resolution: int
    mode: str
    batches: tuple[int, ...]
    num_classes: int = 1000


@dataclass
class FeatureResult:
    """Features per batch of a job, or the reason none exist."""

    job: FeatureJob
    features: dict[int, dict[str, Any]] = field(default_factory=dict)
    reason: str = ""
    method: str = ""
    probes: tuple[dict[str, Any], dict[str, Any]] | None = None


#: probe features (or the failure) per (builder, name, precision, resolution, mode, num_classes) of this process
_CACHE: dict[tuple, FeatureResult] = {}


def _cache_key(job: FeatureJob) -> tuple:
    return (job.builder, job.name, job.precision, job.resolution, job.mode, job.num_classes)


def _from_cache(job: FeatureJob) -> FeatureResult | None:
    """The job's result from cached probes when every batch scales exactly (or the cached failure)."""
    cached = _CACHE.get(_cache_key(job))
    if cached is None:
        return None
    if cached.reason:
        return FeatureResult(job, reason=cached.reason)
    if cached.probes is None:
        return None
    scaled = {b: scale_features(*cached.probes, b) for b in job.batches}
    if any(f is None for f in scaled.values()):
        return None
    return FeatureResult(job, scaled, method="scaled", probes=cached.probes)


def _builder(job: FeatureJob) -> Callable[[], Any]:
    """A build function that constructs the model once and hands the same module to every step."""
    import torch

    from perfzoo.builders import build_model

    shape = (3, job.resolution, job.resolution)
    built: list[Any] = []

    def build() -> Any:
        if not built:
            dtype = getattr(torch, BUILD_DTYPES[job.precision])
            built.append(build_model(job.builder, job.name, {}, job.num_classes, shape).to(dtype))
        return built[0]

    return build


def scale_features(low: dict[str, Any], high: dict[str, Any], batch: int) -> dict[str, Any] | None:
    """Features at ``batch`` from the two probe batches, or None when they do not scale exactly."""
    ratio = PROBE_BATCHES[1] // PROBE_BATCHES[0]
    out = dict(low)
    for key in PROPORTIONAL:
        a, b = low[key], high[key]
        if b != a * ratio or int(a) != a or int(a) % PROBE_BATCHES[0]:
            return None
        out[key] = int(a) // PROBE_BATCHES[0] * batch
    for key, value in low.items():
        if key in (*PROPORTIONAL, *DERIVED, *PER_CALL):
            continue
        same = value == high[key] or (value != value and high[key] != high[key])  # NaN == NaN here
        if not same:
            return None
    k = 4 if low["mode"] == "training" else 1
    out["train_mem_estimate_bytes"] = out["weight_bytes"] * k + out["activation_bytes"]
    out["batch"] = batch
    return out


def featurise_job(job: FeatureJob) -> FeatureResult:
    """Featurise one job (in the calling process); see the module docstring."""
    from perfzoo.features import featurise

    build, shape = _builder(job), (3, job.resolution, job.resolution)
    label = f"timm:{job.name}" if job.builder == "timm" else f"{job.builder}:{job.name}"
    try:
        dtype = BUILD_DTYPES[job.precision]
        low = featurise(build, shape, PROBE_BATCHES[0], job.mode, dtype, label)[0]
        high = featurise(build, shape, PROBE_BATCHES[1], job.mode, dtype, label, trace_graph=False)[0]
        probes = [low, {**high, **{k: low[k] for k in GRAPH}}]  # the fx graph does not depend on the batch
        scaled = {b: scale_features(probes[0], probes[1], b) for b in job.batches}
        if all(f is not None for f in scaled.values()):
            return FeatureResult(job, scaled, method="scaled", probes=(probes[0], probes[1]))
        direct = {b: featurise(_builder(job), shape, b, job.mode, dtype, label)[0] for b in job.batches}
        return FeatureResult(job, direct, method="direct")
    except InputError as exc:
        return FeatureResult(job, reason=str(exc))


def _warm_imports() -> None:
    """Import what every featurisation needs, once, before the workers fork."""
    import timm  # noqa: F401
    import torchvision  # noqa: F401

    import perfzoo.features  # noqa: F401


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)


def featurise_jobs(jobs: Iterable[FeatureJob], workers: int | None = None, progress: bool = False
                   ) -> list[FeatureResult]:
    """Results of every job, in order; ``workers`` warm processes (default: the usable CPU cores).

    Probe features are cached per process by (model, resolution, precision, mode), so the same model
    imported from several tables is built once.
    """
    from tqdm import tqdm

    jobs = list(jobs)
    results: dict[int, FeatureResult] = {}
    for i, job in enumerate(jobs):
        cached = _from_cache(job)
        if cached is not None:
            results[i] = cached
    todo = [i for i in range(len(jobs)) if i not in results]
    workers = workers or len(os.sched_getaffinity(0))
    bar = tqdm(total=len(todo), desc="features", file=sys.stderr, disable=not progress, mininterval=1)
    if workers <= 1 or len(todo) <= 1:
        computed = (featurise_job(jobs[i]) for i in todo)
        _collect(todo, computed, results, bar)
    else:
        _warm_imports()
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init) as pool:
            _collect(todo, pool.map(featurise_job, [jobs[i] for i in todo], chunksize=2), results, bar)
    bar.close()
    return [results[i] for i in range(len(jobs))]


def _collect(todo: list[int], computed: Iterable[FeatureResult], results: dict[int, FeatureResult],
             bar: Any) -> None:
    for i, result in zip(todo, computed, strict=True):
        results[i] = result
        if result.reason or result.probes is not None:
            _CACHE[_cache_key(result.job)] = result
        bar.update()
