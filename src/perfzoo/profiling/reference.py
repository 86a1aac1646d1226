"""A fixed reference step, measured like a config, so two moments' peak-memory labels can be compared.

The CPU's peak-memory label once counted the whole resident set above the worker's baseline, library code
that a step maps for the first time included, and that part was not fixed: on one 2-core VM, with the same code
and environment and no reboot, every label of the default zoo fell by 31-38 MB between two moments 90 minutes
apart, while repeats within each run agreed within 1 % (``bench/RESULTS.md``, "Peak-memory labels of the same
configs, 90 minutes apart"). The reference showed that the moving part was file-backed pages, and the label now
leaves them out (:class:`perfzoo.profiling.core.ResidentPeak`; ``bench/RESULTS.md``, "What the CPU memory
label's shift is made of"). A run's own noise floor cannot see a shift between moments, of this part or
another; a reference measured at both moments can. The hardware rule records :func:`memory_reference` in
``results/hardware/<device>.json``; ``bench/user_model.py`` measures it again beside a user's model.

The reference is ResNet-18 at 64 px, inference, batch 1, built and measured by the profiler's own code
(:func:`perfzoo.profiling.worker.run_isolated`) with fixed settings (:data:`REFERENCE_SETTINGS`, not the
run's ``profiling:`` block, so that every run measures the same thing).
"""

from __future__ import annotations

import statistics
from typing import Any

from perfzoo.models.zoo import expand_zoo, manifest_frame
from perfzoo.profiling.worker import run_isolated

REFERENCE_FAMILY = {"builder": "torchvision", "models": ["resnet18"], "resolutions": [64], "batch_sizes": [1],
                    "modes": ["inference"]}
REFERENCE_SETTINGS = {"warmup_iters": 3, "min_iters": 5, "max_iters": 10, "max_time_s": 0.3, "ci_target": 0.02,
                      "timeout_s": 120, "max_rss_mb": 8000, "num_classes": 1000, "optimizer": "sgd",
                      "time_ops": False}
"""The reference's own measurement settings (the device's ``threads`` are added)."""


def reference_config() -> dict[str, Any]:
    """The reference config as the zoo stage writes a manifest row."""
    zoo = {"zoo": {"num_classes": REFERENCE_SETTINGS["num_classes"],
                   "families": {"reference": REFERENCE_FAMILY}}}
    (row,) = manifest_frame(expand_zoo(zoo)).to_dict("records")
    return row


def memory_reference(kind: str, threads: int) -> dict[str, Any]:
    """``{config, peak_mem_mb, latency_ms, threads, rss_growth_mb}`` of one measurement of the reference on a
    ``kind`` device (``rss_growth_mb``: how much each part of the resident set,
    :func:`perfzoo.profiling.core.rss_components_mb`, grew over the step), or ``{"missing": reason}`` (kind
    cuda, or a failed measurement: never a number that was not measured)."""
    if kind != "cpu":
        return {"missing": f"no memory reference on kind {kind!r}: its label is the allocator's own count"}
    spec = reference_config()
    outcome = run_isolated(kind, spec, {**REFERENCE_SETTINGS, "threads": threads})
    if outcome.status != "ok":
        return {"missing": f"the reference step failed ({outcome.status}): {outcome.message}"}
    measurement = outcome.measurement
    return {"config": f"{spec['label']} {spec['mode']} b{spec['batch']}",
            "peak_mem_mb": round(float(measurement["peak_mem_mb"]), 3),
            "latency_ms": round(statistics.median(measurement["times_ms"]), 4), "threads": threads,
            "rss_growth_mb": measurement["extra"]["rss_growth_mb"]}
