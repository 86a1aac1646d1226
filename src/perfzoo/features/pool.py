"""Fast featurisation of many imported configs: one build per model, warm workers, exact batch scaling.

An imported table often lists the same model at several batch sizes (and on several devices). The
features of one ``FeatureJob`` (model, resolution, precision, mode) are computed once for all its batch
sizes, on one build of the model on the meta device, whose fx graph (which has no batch dimension) is
traced once:

* a job with fewer than :data:`SCALED_FROM` batches is featurised at each of its batches
  (``method == "direct"``): a featurisation costs about what the memory simulation every batch needs
  anyway (the FLOP count and operator trace ride along in its steps), so probing costs more than it saves;
* a job with more batches is stepped at probe batches 2 and 4 (batch 1 would trip BatchNorm's "more
  than one value per channel" check in training). The batch-dependent features (FLOPs, MACs, activation
  and input bytes, Gianniti complexities) must be exactly proportional to the batch (value at 4 == 2 x
  value at 2, an even integer), or — checked with a third probe at batch 8 — exactly affine with an
  integer slope (a part computed once per step, such as a relative position bias); the operator totals
  must be missing at every probe (a step that could not be traced): the bytes an operator reads from cache
  (``bytes_cached``, :data:`perfzoo.features.ops.CACHE_BYTES`) are not a line in the batch (what fits at a
  probe need not fit at a larger batch), so a traced step is featurised directly; every other feature must
  be equal at all probes. Then each requested batch gets its value on that line:
  exact integers, the numbers a direct featurisation at that batch gives (``method == "scaled"``).
  Otherwise every batch is featurised directly. The simulated peak memory (``sim_*`` columns, a maximum
  over the step, not a line in the batch) is simulated at every batch;
* jobs run in a pool of warm worker processes forked after torch, torchvision and timm are imported.

A model that cannot be built or stepped gives no numbers: ``reason`` holds the builder's one-line error.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from tqdm import tqdm

from perfzoo.io import InputError
from perfzoo.models.builders import build_model
from perfzoo.hardware.precision import BUILD_DTYPES

PROBE_BATCHES = (2, 4, 8)
SCALED_FROM = 5
"""Fewest batches a job is batch-scaled for; fewer are featurised directly (see the module docstring)."""
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
    probes: tuple[dict[str, Any], ...] | None = None


#: probe features, directly featurised batches (or the failure) per (builder, name, precision, resolution,
#: mode, num_classes) of this process
_CACHE: dict[tuple, FeatureResult] = {}


def _cache_key(job: FeatureJob) -> tuple:
    return (job.builder, job.name, job.precision, job.resolution, job.mode, job.num_classes)


def featuriser_source_digest() -> str:
    """Digest of every module of :mod:`perfzoo.features` and :mod:`perfzoo.models` (the operator trace and its
    kinds, the memory simulation, the builders): a change to any of them may change the features."""
    digest = hashlib.sha256()
    for package in (Path(__file__).parent, Path(__file__).parents[1] / "models"):
        for path in sorted(package.glob("*.py")):
            digest.update(f"{package.name}/{path.name}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _versions() -> dict[str, str]:
    """What the cached numbers depend on: torch, torchvision, timm and perfzoo's featuriser source."""
    return {"torch": version("torch"), "torchvision": version("torchvision"), "timm": version("timm"),
            "featuriser_source": featuriser_source_digest()}


def load_cache(path: str | Path) -> int:
    """Load probe features and directly featurised batches saved by :func:`featurise_jobs` (``cache_path``)
    for the same library versions; entries of other versions are ignored, as is a line another process left
    unfinished. Returns the number of entries loaded."""
    path = Path(path)
    if not path.exists():
        return 0
    versions, loaded = _versions(), 0
    with path.open() as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)  # a writer appends whole lines under an exclusive lock (_save)
        lines = handle.read().splitlines()
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # cut short when its writer died: that model is featurised again
            continue
        if entry["versions"] != versions:
            continue
        key = tuple(entry["key"])
        job = FeatureJob(*key[:5], batches=(), num_classes=key[5])
        probes = tuple(entry["probes"]) if entry["probes"] else None
        direct = {int(b): f for b, f in entry.get("features", {}).items()}
        _remember(FeatureResult(job, direct, reason=entry["reason"], probes=probes))
        loaded += 1
    return loaded


def _save(path: Path, result: FeatureResult) -> None:
    """Append ``result`` to the cache file as one line, under an exclusive lock: import jobs of one workflow that
    run at the same time share the file."""
    entry = {"key": list(_cache_key(result.job)), "versions": _versions(), "reason": result.reason,
             "probes": list(result.probes) if result.probes else None,
             "features": {} if result.probes else {str(b): f for b, f in result.features.items()}}
    line = (json.dumps(entry, default=float) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(line)
        handle.flush()


def _remember(result: FeatureResult) -> None:
    """Cache a result, adding its directly featurised batches to those cached for the same model before."""
    key = _cache_key(result.job)
    before = _CACHE.get(key)
    if before is not None and not result.reason and not result.probes:
        result = FeatureResult(result.job, {**before.features, **result.features}, probes=before.probes)
    _CACHE[key] = result


def _from_cache(job: FeatureJob) -> FeatureResult | None:
    """The job's result from its cached batches, or from cached probes when every batch scales exactly (or
    the cached failure)."""
    cached = _CACHE.get(_cache_key(job))
    if cached is None:
        return None
    if cached.reason:
        return FeatureResult(job, reason=cached.reason)
    if cached.features and all(b in cached.features for b in job.batches) and not cached.probes:
        return FeatureResult(job, {b: dict(cached.features[b]) for b in job.batches}, method="direct")
    if cached.probes is None:
        return None
    scaled = _scaled(cached.probes, job.batches)
    if scaled is None:
        return None
    return FeatureResult(job, _simulate_batches(job, scaled), method="scaled", probes=cached.probes)


def job_builder(job: FeatureJob) -> Callable[[], Any]:
    """A build function that constructs the model once and hands the same module to every step."""
    import torch  # lazy: torch takes seconds to import, and an import without featurisation never needs it

    shape = (3, job.resolution, job.resolution)
    built: list[Any] = []

    def build() -> Any:
        if not built:
            dtype = getattr(torch, BUILD_DTYPES[job.precision])
            built.append(build_model(job.builder, job.name, {}, job.num_classes, shape).to(dtype))
        return built[0]

    return build


def _line(values: list[Any]) -> tuple[int, int] | None:
    """(intercept, per-sample slope) of a feature exactly affine over the probe batches, else None.

    Two probes must lie on a line through the origin; with a third probe (taken only when they do not),
    the three must lie on one line with an integer slope (a batch-independent part, such as a relative
    position bias computed once per step, makes the intercept)."""
    if any(int(v) != v for v in values):
        return None
    values = [int(v) for v in values]
    b0, b1 = PROBE_BATCHES[0], PROBE_BATCHES[1]
    if values[0] * b1 == values[1] * b0 and values[0] % b0 == 0:
        return 0, values[0] // b0
    if len(values) < 3:
        return None
    rise, run = values[1] - values[0], b1 - b0
    if rise % run or (values[2] - values[1]) * run != rise * (PROBE_BATCHES[2] - b1):
        return None
    slope = rise // run
    return values[0] - slope * b0, slope


def scale_features(probes: tuple[dict[str, Any], ...], batch: int) -> dict[str, Any] | None:
    """Features at ``batch`` from the probe batches, or None when they do not scale exactly."""
    from perfzoo.features.memory import SIM_COLUMNS  # lazy: torch takes seconds to import
    from perfzoo.features.op_kinds import OP_FEATURES

    out = dict(probes[0])
    for key in PROPORTIONAL:
        line = _line([p[key] for p in probes])
        if line is None:
            return None
        out[key] = line[0] + line[1] * batch
    if any(p[key] == p[key] for p in probes for key in OP_FEATURES):  # traced: bytes from cache, no line
        return None
    for key, value in probes[0].items():
        if key in (*PROPORTIONAL, *DERIVED, *PER_CALL, *SIM_COLUMNS, "sim_error", *OP_FEATURES):  # computed above
            continue
        if not all(value == p[key] or (value != value and p[key] != p[key]) for p in probes[1:]):  # NaN==NaN
            return None
    k = 4 if probes[0]["mode"] == "training" else 1
    out["train_mem_estimate_bytes"] = out["weight_bytes"] * k + out["activation_bytes"]
    out["batch"] = batch
    return out


def _scaled(probes: tuple[dict[str, Any], ...], batches: tuple[int, ...]) -> dict[int, dict[str, Any]] | None:
    scaled = {b: scale_features(probes, b) for b in batches}
    return None if any(f is None for f in scaled.values()) else scaled


def _job_label(job: FeatureJob) -> str:
    return f"timm:{job.name}" if job.builder == "timm" else f"{job.builder}:{job.name}"


def _simulate_batches(job: FeatureJob, scaled: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Batch-scaled features with the simulated memory (``sim_*``) of each batch: a peak is a maximum over
    the step, not a line in the batch, so it is simulated rather than scaled."""
    from perfzoo.features.memory import feature_row  # lazy: torch takes seconds to import
    from perfzoo.features.meta import simulated_memory

    build, shape, dtype = job_builder(job), (3, job.resolution, job.resolution), BUILD_DTYPES[job.precision]
    for batch, features in scaled.items():
        simulate = functools.partial(simulated_memory, build, shape, batch, job.mode, dtype,
                                     model_id=_job_label(job))
        features.update(feature_row(simulate))
    return scaled


def featurise_job(job: FeatureJob) -> FeatureResult:
    """Featurise one job (in the calling process); see the module docstring."""
    at = _featurise_at(job)
    try:
        if len(job.batches) < SCALED_FROM:  # the probes would cost more than they save
            return FeatureResult(job, {b: at(b) for b in job.batches}, method="direct")
        probes: tuple[dict[str, Any], ...] = (at(PROBE_BATCHES[0]), at(PROBE_BATCHES[1]))
        scaled = _scaled(probes, job.batches)
        if scaled is None:
            probes = (*probes, at(PROBE_BATCHES[2]))
            scaled = _scaled(probes, job.batches)
        if scaled is not None:
            return FeatureResult(job, _simulate_batches(job, scaled), method="scaled", probes=probes)
        direct = {b: _featurise_at(job)(b) for b in job.batches}  # each batch on a build of its own
        return FeatureResult(job, direct, method="direct")
    except InputError as exc:
        return FeatureResult(job, reason=str(exc))


def _featurise_at(job: FeatureJob) -> Callable[[int], dict[str, Any]]:
    """Featurisation of the job at a batch, every call stepping the same build, the fx graph (which has no
    batch dimension) traced at the first call only."""
    from perfzoo.features.meta import featurise  # lazy: torch takes seconds to import

    build, shape = job_builder(job), (3, job.resolution, job.resolution)
    label, dtype = _job_label(job), BUILD_DTYPES[job.precision]
    graph: dict[str, Any] = {}

    def at(batch: int) -> dict[str, Any]:
        features = featurise(build, shape, batch, job.mode, dtype, label, trace_graph=not graph)[0]
        if not graph:
            graph.update({k: features[k] for k in GRAPH})
            return features
        return {**features, **graph}

    return at


def featurise_jobs(jobs: Iterable[FeatureJob], workers: int | None = None, progress: bool = False,
                   cache_path: str | Path | None = None) -> list[FeatureResult]:
    """Results of every job, in order; ``workers`` warm processes (default: the usable CPU cores).

    Probe features and directly featurised batches are cached per process by (model, resolution, precision,
    mode), so the same model imported from several tables is built once; with ``cache_path`` they are also
    appended to that JSON lines file as they finish (with the library versions) and loaded from it first.
    """
    if cache_path is not None:
        load_cache(cache_path)
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
        _collect(todo, computed, results, bar, cache_path)
    else:
        from perfzoo.features.meta import forked_pool  # lazy: torch, torchvision and timm, as the workers need

        with forked_pool(workers) as pool:
            _collect(todo, pool.map(featurise_job, [jobs[i] for i in todo], chunksize=1), results, bar,
                     cache_path)
    bar.close()
    return [results[i] for i in range(len(jobs))]


def _collect(todo: list[int], computed: Iterable[FeatureResult], results: dict[int, FeatureResult],
             bar: Any, cache_path: str | Path | None) -> None:
    for i, result in zip(todo, computed, strict=True):
        results[i] = result
        if result.reason or result.probes is not None or result.method == "direct":
            _remember(result)
            if cache_path is not None:
                _save(Path(cache_path), result)
        bar.update()
