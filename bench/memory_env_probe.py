"""A training step's CPU memory label under allocator settings: what part of it is the allocators' retention.

    python bench/memory_env_probe.py [--batches 1 8 32] [--depth 6]

Measures, each in a fresh process at one thread, the profiler's CPU memory label (the worker's peak resident set
without file-backed pages above its baseline, :class:`perfzoo.profiling.core.ResidentPeak`, taken after ``gc`` and
before the model is built) of six training steps (:func:`perfzoo.profiling.core.make_step`, SGD with momentum) of the
default zoo's ``vit_tiny_patch16_224`` at 64 px with ``depth`` blocks and the default config's classes, built as the
zoo builds it (:func:`perfzoo.models.builders.build_model`), at each batch, under the allocator settings of
:data:`SETTINGS`: glibc's and MKL's defaults (the workflow's), MKL's buffer cache off, glibc's mmap threshold fixed at
128 KiB (every block from 128 KiB up mapped on its own and returned when freed, so the heap keeps only smaller ones)
and at 64 KiB (batch 8's 102 KiB activations mapped too), one arena. Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from perfzoo.config import load_config  # noqa: E402

SETTINGS = {
    "defaults": {},
    "MKL_DISABLE_FAST_MM=1": {"MKL_DISABLE_FAST_MM": "1"},
    "MALLOC_MMAP_THRESHOLD_=131072": {"MALLOC_MMAP_THRESHOLD_": "131072"},
    "MALLOC_MMAP_THRESHOLD_=65536": {"MALLOC_MMAP_THRESHOLD_": "65536"},
    "MALLOC_ARENA_MAX=1": {"MALLOC_ARENA_MAX": "1"},
}

CHILD = """
import ctypes, gc, sys
import timm, torch  # imported before the baseline, as the profiling worker has them (build_model imports lazily)
from perfzoo.models.builders import build_model
from perfzoo.profiling.core import ResidentPeak, make_step
torch.set_num_threads(1)
batch, depth, classes, steps = (int(a) for a in sys.argv[1:5])
markers = [int(a) for a in sys.argv[5:7]]  # sizes of two allocations around the measurement (heap_interleave.py)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
x, y = torch.randn(batch, 3, 64, 64), torch.randint(0, classes, (batch,))
gc.collect()
if markers:
    libc.free(libc.malloc(markers[0]))
peak = ResidentPeak.start()
model = build_model("timm", "vit_tiny_patch16_224", {"depth": depth}, classes, (3, 64, 64))
step = make_step(model, x, y, "training", "sgd")
for _ in range(steps):
    step()
peak.close_phase()
if markers:
    libc.free(libc.malloc(markers[1]))
print(round(peak.label_mb, 1))
"""
"""A child's arguments: batch, depth, classes, steps and, optionally, the sizes of two marker allocations made
and freed before the baseline and after the steps (:mod:`heap_interleave` cuts its window between them)."""
STEPS = 6


def measure(batch: int, depth: int, classes: int, env: dict[str, str]) -> float:
    """The label (MB) of one fresh process with ``env`` added to this one's environment."""
    argv = [sys.executable, "-c", CHILD, str(batch), str(depth), str(classes), str(STEPS)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **env})
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--depth", type=int, default=6)
    args = parser.parse_args()
    classes = load_config(ROOT / "config.yaml")["zoo"]["num_classes"]
    for batch in args.batches:
        for name, env in SETTINGS.items():
            print(json.dumps({"batch": batch, "depth": args.depth, "setting": name,
                              "label_mb": measure(batch, args.depth, classes, env)}), flush=True)


if __name__ == "__main__":
    main()
