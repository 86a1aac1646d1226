"""Whose allocations put the CPU memory label above the simulated heap: a real training step's whole allocation
stream, recorded by heaptrack, replayed through glibc with and without the allocations that are not PyTorch's tensors.

    python bench/heap_interleave.py [--batches 1 8 32] [--depth 6] [--replays 3]

Needs heaptrack (the Debian package ``heaptrack``). Per batch, in fresh processes that import torch and timm before
the baseline (as the profiling worker has them) and run at one thread:

* the label as the profiler takes it (:class:`perfzoo.profiling.core.ResidentPeak`) of the default zoo's
  ``vit_tiny_patch16_224`` at 64 px with ``depth`` blocks and the config's classes, built by
  :func:`perfzoo.models.builders.build_model`, trained for three steps (:func:`perfzoo.profiling.core.make_step`, SGD
  with momentum);
* the same under heaptrack: the allocations and frees between two marker allocations (one before the baseline, one
  after the steps), each classed by its stack (:meth:`Record.kind`): PyTorch's CPU allocator (``c10::alloc_cpu``),
  MKL and oneDNN, libstdc++'s ``operator new`` elsewhere (autograd's and the dispatcher's objects, tensors' headers),
  other (Python's objects);
* that window replayed ``--replays`` times per class set (a block of each size allocated and written, freed where the
  step freed it; tensors by ``posix_memalign`` at 64 bytes as PyTorch allocates them, the rest by ``malloc``), each
  measured as the label is: tensors only, tensors and MKL/oneDNN, tensors and ``operator new``, everything.

heaptrack records a free by the allocation's record (size and stack), not its address, so a free is matched to the
latest live block of that record. Prints one JSON line per measurement and a table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from memory_env_probe import CHILD  # noqa: E402

from perfzoo.config import load_config  # noqa: E402

BEFORE, AFTER = 12_345_677, 7_654_321
"""Sizes of the two marker allocations that bound the recorded window."""
CLASS_SETS = {
    "tensors": {"tensor"},
    "tensors + MKL/oneDNN": {"tensor", "mkl"},
    "tensors + operator new": {"tensor", "operator new"},
    "everything": {"tensor", "mkl", "operator new", "other"},
}

REPLAY = """
import ctypes, gc, pickle, sys
import timm, torch
from perfzoo.profiling.core import ResidentPeak
torch.set_num_threads(1)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
events = pickle.load(open(sys.argv[1], "rb"))
kept = set(sys.argv[2].split(","))
live = {}
gc.collect()
peak = ResidentPeak.start()
for sign, record, size, kind in events:
    if kind not in kept:
        continue
    if sign == "+":
        if kind == "tensor":
            block = ctypes.c_void_p()
            libc.posix_memalign(ctypes.byref(block), 64, size)
            address = block.value
        else:
            address = libc.malloc(size)
        ctypes.memset(address, 1, size)
        live.setdefault(record, []).append(address)
    elif live.get(record):
        libc.free(live[record].pop())
peak.close_phase()
print(round(peak.label_mb, 1))
"""


def run_child(argv: list[str]) -> float:
    """The label a child prints on a line of its own (heaptrack prints after it); the child imports this
    checkout's perfzoo."""
    done = subprocess.run(argv, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    return float(next(line for line in reversed(done.stdout.split()) if line.replace(".", "", 1).isdigit()))


class Record:
    """heaptrack's interpreted record (format version 3): strings, instruction pointers, stacks, allocation
    records and the ``+``/``-`` events, each referring to an allocation record."""

    def __init__(self, path: Path) -> None:
        text = subprocess.run(["zstdcat", str(path)], capture_output=True, text=True, check=True).stdout
        self.strings: list[str] = [""]
        self.ips: list[tuple[int, list[int]]] = [(0, [])]
        self.stacks: list[tuple[int, int]] = [(0, 0)]
        self.records: list[tuple[int, int]] = []
        self.events: list[tuple[str, int]] = []
        for line in text.splitlines():
            kind = line[:1]
            if kind == "s":
                self.strings.append(line.split(" ", 2)[2] if line.count(" ") >= 2 else "")
            elif kind == "i":
                fields = line.split()
                self.ips.append((int(fields[2], 16), [int(f, 16) for f in fields[3::3]]))
            elif kind == "t":
                fields = line.split()
                self.stacks.append((int(fields[1], 16), int(fields[2], 16)))
            elif kind == "a":
                fields = line.split()
                self.records.append((int(fields[1], 16), int(fields[2], 16)))
            elif kind in ("+", "-"):
                self.events.append((kind, int(line[2:], 16)))

    def frames(self, stack: int) -> list[tuple[str, str]]:
        """(module file name, its function names) of every frame of ``stack``, innermost first."""
        frames = []
        while stack:
            ip, stack = self.stacks[stack]
            module, functions = self.ips[ip]
            name = self.strings[module].rsplit("/", 1)[-1] if module < len(self.strings) else ""
            frames.append((name, " ".join(self.strings[f] for f in functions if 0 < f < len(self.strings))))
        return frames

    def kind(self, record: int) -> str:
        """``tensor`` (PyTorch's CPU allocator), ``mkl`` (a frame of MKL or oneDNN: GEMM buffers, primitives,
        JIT-generated kernels), ``operator new`` (the first caller outside heaptrack and libc is libstdc++: the
        dispatcher's and autograd's objects, tensors' headers) or ``other`` (Python's objects, the rest)."""
        frames = self.frames(self.records[record][1])
        text = " ".join(functions for _, functions in frames)
        if "c10::alloc_cpu" in text:
            return "tensor"
        if any(mark in text for mark in ("mkl_", "dnnl", "ideep", "Xbyak")):
            return "mkl"
        caller = next((name for name, _ in frames if name not in ("libheaptrack_preload.so", "libc.so.6")), "")
        return "operator new" if caller.startswith("libstdc++") else "other"

    def window(self) -> list[tuple[str, int, int, str]]:
        """The events between the two markers: (sign, record, bytes, kind)."""
        sizes = [self.records[r][0] for _, r in self.events]
        start = next(i for i, (s, _) in enumerate(self.events) if s == "+" and sizes[i] == BEFORE) + 2
        end = next(i for i, (s, _) in enumerate(self.events) if s == "+" and sizes[i] == AFTER)
        kinds: dict[int, str] = {}
        return [(sign, r, self.records[r][0], kinds.setdefault(r, self.kind(r))) for sign, r in self.events[start:end]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--replays", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("heaptrack") is None:
        raise SystemExit("heaptrack not found: install the Debian package heaptrack")
    classes = int(load_config(ROOT / "config.yaml")["zoo"]["num_classes"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        step = Path(tmp) / "step.py"
        step.write_text(CHILD)
        replay = Path(tmp) / "replay.py"
        replay.write_text(REPLAY)
        for batch in args.batches:
            argv = [str(step), str(batch), str(args.depth), str(classes), "3", str(BEFORE), str(AFTER)]
            label = run_child([sys.executable, *argv])
            run_child(["heaptrack", "-o", f"{tmp}/b{batch}", sys.executable, *argv])
            window = Record(Path(f"{tmp}/b{batch}.zst")).window()
            counts = Counter(kind for sign, _, _, kind in window if sign == "+")
            mib = Counter()
            for sign, _, size, kind in window:
                mib[kind] += size / 2**20 if sign == "+" else 0
            events = Path(tmp) / f"b{batch}.pkl"
            events.write_bytes(pickle.dumps(window))
            row = {"batch": batch, "label_mb": label, "allocations": dict(counts),
                   "allocated_mib": {k: round(v, 1) for k, v in mib.items()}}
            for name, kinds in CLASS_SETS.items():
                row[name] = [run_child([sys.executable, str(replay), str(events), ",".join(sorted(kinds))])
                             for _ in range(args.replays)]
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("| batch | label (no heaptrack) | " + " | ".join(f"replay: {n}" for n in CLASS_SETS) + " |")
    print("|---|---|" + "---|" * len(CLASS_SETS))
    for row in rows:
        cells = [f"{statistics.median(row[n]):.1f} ({min(row[n]):.1f}-{max(row[n]):.1f})" for n in CLASS_SETS]
        print(f"| {row['batch']} | {row['label_mb']:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
