"""Where the CPU peak-memory label goes beyond the live tensors: the C allocator's heap, not the kernels.

    python bench/heap_churn.py RESULTS KEY [KEY ...]

A KEY is ``<model_id>:<mode>:<batch>`` of ``RESULTS/zoo/manifest.parquet`` (a finished default run, read only).
For each, three fresh processes (torch, torchvision and timm imported and the interference probe run first, as
in a profiling worker; one thread):

* *label, default glibc*: the worker's label (:class:`perfzoo.profiling.core.ResidentPeak`) over the build and
  eight steps, with the label of each step;
* *label, fixed mmap threshold*: the same with ``MALLOC_MMAP_THRESHOLD_=131072``, which stops glibc from raising
  its threshold, so every block of 128 KiB or more is mapped on its own and returned when freed;
* *allocator peak*: the largest sum of bytes PyTorch's CPU allocator holds, kernels' internal buffers included,
  over the build and three steps (``torch.profiler`` with ``profile_memory``).

Printed as Markdown beside the run's label and the simulation's ``sim_peak_bytes`` and ``sim_heap_churn_bytes``
(computed here with the current code). The class count and the training step's optimizer are the run's, from the
``config.yaml`` beside RESULTS, checked against the run's feature provenance (``bench/memory_sim.py``).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

MIB = 2.0**20
STEPS, PROFILED_STEPS = 8, 3


def _config(manifest: pd.DataFrame, key: str) -> dict:
    """The manifest row of ``key`` (``model_id:mode:batch``)."""
    model_id, mode, batch = key.split(":")
    rows = manifest[(manifest["model_id"] == model_id) & (manifest["mode"] == mode) & (manifest["batch"] == int(batch))]
    if rows.empty:
        raise SystemExit(f"zoo/manifest.parquet: no config {key}")
    return rows.iloc[0].to_dict()


def _worker_like() -> None:
    """Imports and warm-up of a profiling worker before its baseline."""
    import timm  # noqa: F401
    import torch
    import torchvision  # noqa: F401

    import perfzoo.profiling.measure  # noqa: F401
    from perfzoo.profiling.interference import run_probe

    torch.set_num_threads(1)
    run_probe("cpu", 1, 0)
    torch.manual_seed(0)
    gc.collect()


def _step(job: dict):  # noqa: ANN202 - (model, step) of one config
    from perfzoo.models.builders import build_model
    from perfzoo.profiling.core import make_optimizer, make_step, synthetic_batch

    spec, classes = job["spec"], job["num_classes"]
    model = build_model(spec["builder"], spec["name"], json.loads(spec["builder_kwargs"]), classes,
                        tuple(json.loads(spec["input_shape"])))
    x, y = synthetic_batch(spec, classes, "cpu")
    optimizer = make_optimizer(model, job["optimizer"]) if spec["mode"] == "training" else None
    return model, make_step(model, x, y, spec["mode"], optimizer)


def child_label(job: dict) -> dict:
    from perfzoo.profiling.core import ResidentPeak

    _worker_like()
    resident = ResidentPeak.start()
    _, step = _step(job)
    for _ in range(STEPS):
        step()
        resident.close_phase()
    base = sum(resident.baseline.values()) - resident.baseline["file"]
    return {"label": resident.label_mb, "per_step": [round(p - base, 1) for p in resident.phase_peaks_mb]}


def child_allocator(job: dict) -> dict:
    from torch.profiler import ProfilerActivity, profile

    _worker_like()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _, step = _step(job)
        for _ in range(PROFILED_STEPS):
            step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return {"allocator_peak": peak / MIB}


def run_child(kind: str, job: dict, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", kind, json.dumps(job, default=int)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1] == "--child":
        result = {"label": child_label, "allocator": child_allocator}[sys.argv[2]](json.loads(sys.argv[3]))
        print(json.dumps(result))
        return
    from memory_sim import run_settings  # bench/: the run's class count and optimizer, checked against its provenance

    from perfzoo.features.meta import simulate_manifest

    results, keys = Path(sys.argv[1]), sys.argv[2:]
    num_classes, optimizer = run_settings(results, results.parent / "config.yaml")
    manifest = pd.read_parquet(results / "zoo" / "manifest.parquet")
    dataset = pd.read_parquet(results / "dataset" / "dataset.parquet")
    print("| config | run's label | label, default glibc (per step) | label, fixed mmap threshold | allocator peak "
          "| simulated peak | heap churn |\n|---|---|---|---|---|---|---|")
    for key in keys:
        spec = _config(manifest, key)
        job = {"spec": spec, "num_classes": num_classes, "optimizer": optimizer}
        model_id, mode, batch = key.split(":")
        run_label = dataset[(dataset["model_id"] == model_id) & (dataset["mode"] == mode)
                            & (dataset["batch"] == int(batch))]["peak_mem_mb"].iloc[0]
        sim = simulate_manifest(pd.DataFrame([spec]), num_classes, optimizer).iloc[0]
        default = run_child("label", job)
        fixed = run_child("label", job, {"MALLOC_MMAP_THRESHOLD_": "131072"})
        allocator = run_child("allocator", job)
        print(f"| {spec['label']} {mode} b{batch} | {run_label:.1f} | {default['label']:.1f} "
              f"({', '.join(map(str, default['per_step']))}) | {fixed['label']:.1f} | {allocator['allocator_peak']:.1f} "
              f"| {sim['sim_peak_bytes'] / MIB:.1f} | {sim['sim_heap_churn_bytes'] / MIB:.1f} |", flush=True)


if __name__ == "__main__":
    main()
