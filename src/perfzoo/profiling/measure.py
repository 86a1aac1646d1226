"""CPU measurement inside one isolated worker (build a config, warm up, time iterations adaptively, then
time its operators, :mod:`perfzoo.profiling.op_timing`; later, on request, time the same step again in a second
window), and the table of measurement functions per kind that a worker runs (cpu, cuda, cpu_layers)."""

from __future__ import annotations

import gc
import json
import math
import time
from collections.abc import Callable
from typing import Any

from perfzoo.models.builders import build_model
from perfzoo.profiling.core import (
    Measurement,
    ResidentPeak,
    make_optimizer,
    make_step,
    set_precision,
    synthetic_batch,
    time_cpu_iterations,
)
from perfzoo.profiling.cuda import measure_on_cuda
from perfzoo.profiling.interference import MIN_COUNTED_WINDOW_S
from perfzoo.profiling.layers import measure_layers_on_cpu
from perfzoo.profiling.op_timing import step_op_times


REWARM_ITERS = 1
"""Steps run before a later window of a step the worker has already warmed up and timed."""


def warm_up(step: Callable[[], None], iterations: int, window_started: float,
            after_each: Callable[[], None] = lambda: None) -> int:
    """Run ``step`` ``iterations`` times (``after_each`` after every one), then again until the window begun at
    ``window_started`` (``time.perf_counter``) has lasted :data:`MIN_COUNTED_WINDOW_S`, so that the CPU counters
    can judge the window (a shorter one is left unjudged); return the steps run. Only the steps of a tiny config
    (a window of a few ms) are extended."""
    for _ in range(iterations):
        step()
        after_each()
    ran = iterations
    while time.perf_counter() - window_started < MIN_COUNTED_WINDOW_S:
        step()
        ran += 1
    if ran > iterations:
        after_each()
    return ran


def measure_on_cpu(spec: dict[str, Any], settings: dict[str, Any]) -> Measurement:
    """Measure one config on the CPU (:func:`open_cpu_measurement`'s first window)."""
    return open_cpu_measurement(spec, settings)[0]


def open_cpu_measurement(spec: dict[str, Any], settings: dict[str, Any]
                         ) -> tuple[Measurement, Callable[[], Measurement]]:
    """Measure one config on the CPU, and a function that times the same step again in a later window.

    Peak memory = the worker's peak resident set without file-backed pages, above its baseline
    (:class:`perfzoo.profiling.core.ResidentPeak`; a phase per configured warm-up step, one for any steps
    :func:`warm_up` adds, and one for the timed steps). The
    later window runs :data:`REWARM_ITERS` step(s) again (the worker waited while others ran: its caches are
    cold), then times iterations as the first did; its measurement has no memory label (NaN: the first
    window's is the config's). Either window warms up for longer where it would otherwise end before the CPU
    counters can judge it (:func:`warm_up`)."""
    import torch  # lazy: importing torch takes ~3 s; the profiling parent never runs a model

    window_started = time.perf_counter()

    torch.set_num_threads(int(settings["threads"]))
    torch.manual_seed(0)
    gc.collect()
    resident = ResidentPeak.start()
    model = build_model(spec["builder"], spec["name"], json.loads(spec["builder_kwargs"]),
                        settings["num_classes"], tuple(json.loads(spec["input_shape"])))
    x, y = synthetic_batch(spec, settings["num_classes"], "cpu")
    model, x, context = set_precision(model, x, spec.get("precision", "fp32"), "cpu")
    # one optimizer for the timed steps and the per-op ones after them, so these find its state made
    optimizer = make_optimizer(model, settings["optimizer"]) if spec["mode"] == "training" else None
    step = make_step(model, x, y, spec["mode"], optimizer, context)
    warmed = warm_up(step, settings["warmup_iters"], window_started, resident.close_phase)
    times, reason = time_cpu_iterations(step, settings)
    resident.close_phase()  # read before the per-op steps, which must not change the labels
    extra: dict[str, Any] = {"threads": torch.get_num_threads(), "peak_rss_total_mb": round(resident.total_mb, 3),
                             "rss_growth_mb": resident.growth_mb()}
    if (op_times := step_op_times(model, x, y, spec["mode"], optimizer, context, settings)) is not None:
        extra["op_times"] = op_times

    def again() -> Measurement:
        rewarmed = warm_up(step, REWARM_ITERS, time.perf_counter())
        later, why = time_cpu_iterations(step, settings)
        return Measurement(later, math.nan, rewarmed, why, {"threads": torch.get_num_threads()})

    return Measurement(times, resident.label_mb, warmed, reason, extra), again


MEASURE: dict[str, Callable[[dict[str, Any], dict[str, Any]], Measurement]] = {
    "cpu": measure_on_cpu,
    "cuda": measure_on_cuda,
    "cpu_layers": measure_layers_on_cpu,
}
"""Measurement function per device kind (what an isolated worker runs)."""
MEASURE_AGAIN: dict[str, Callable[[dict[str, Any], dict[str, Any]],
                                  tuple[Measurement, Callable[[], Measurement]]]] = {"cpu": open_cpu_measurement}
"""Kinds whose worker can time its step again in a later window (:class:`perfzoo.profiling.worker.HeldWorker`):
the first window's measurement and the function that times the next."""
