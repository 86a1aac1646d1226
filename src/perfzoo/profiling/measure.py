"""CPU measurement inside one isolated worker (build a config, warm up, time iterations adaptively, then
time its operators, :mod:`perfzoo.profiling.op_timing`), and
the table of measurement functions per kind that a worker runs (cpu, cuda, cpu_layers)."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from typing import Any

from perfzoo.models.builders import build_model
from perfzoo.profiling.core import (
    Measurement,
    make_optimizer,
    make_step,
    peak_rss_mb,
    reset_peak_rss,
    rss_components_mb,
    set_precision,
    synthetic_batch,
    time_cpu_iterations,
)
from perfzoo.profiling.cuda import measure_on_cuda
from perfzoo.profiling.layers import measure_layers_on_cpu
from perfzoo.profiling.op_timing import time_operators


def measure_on_cpu(spec: dict[str, Any], settings: dict[str, Any]) -> Measurement:
    """Measure one config on the CPU; peak memory = the worker's peak RSS above its baseline."""
    import torch  # lazy: importing torch takes ~3 s; the profiling parent never runs a model

    torch.set_num_threads(int(settings["threads"]))
    torch.manual_seed(0)
    gc.collect()
    baseline_mb = reset_peak_rss()
    baseline_parts = rss_components_mb()
    model = build_model(spec["builder"], spec["name"], json.loads(spec["builder_kwargs"]),
                        settings["num_classes"], tuple(json.loads(spec["input_shape"])))
    x, y = synthetic_batch(spec, settings["num_classes"], "cpu")
    model, x, context = set_precision(model, x, spec.get("precision", "fp32"), "cpu")
    # one optimizer for the timed steps and the per-op ones after them, so these find its state made
    optimizer = make_optimizer(model, settings["optimizer"]) if spec["mode"] == "training" else None
    step = make_step(model, x, y, spec["mode"], optimizer, context)
    for _ in range(settings["warmup_iters"]):
        step()
    times, reason = time_cpu_iterations(step, settings)
    peak_mb = peak_rss_mb() - baseline_mb  # read before the per-op steps, which must not change the labels
    # what the label is made of: each part's growth over the baseline after the timed steps (not at the peak)
    parts_after = rss_components_mb()
    extra: dict[str, Any] = {"threads": torch.get_num_threads(),
                             "rss_growth_mb": {part: round(parts_after[part] - baseline_parts[part], 3)
                                               for part in parts_after}}
    if settings.get("time_ops", True):
        extra["op_times"] = time_operators(
            lambda phase: make_step(model, x, y, spec["mode"], optimizer, context, phase),
            settings).as_dict()
    return Measurement(times, peak_mb, settings["warmup_iters"], reason, extra)


MEASURE: dict[str, Callable[[dict[str, Any], dict[str, Any]], Measurement]] = {
    "cpu": measure_on_cpu,
    "cuda": measure_on_cuda,
    "cpu_layers": measure_layers_on_cpu,
}
"""Measurement function per device kind (what an isolated worker runs)."""
