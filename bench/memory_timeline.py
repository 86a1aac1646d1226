"""The tensor memory a real CPU step allocates, against the meta-device simulation of the same step.

    python bench/memory_timeline.py MODEL[:BATCH:MODE[:RESOLUTION]] ...    # e.g. convnext_atto:16:training

For each timm model (random weights, ``num_classes`` 100, 64 px unless given): the profiled step
(:func:`perfzoo.profiling.core.make_step`, SGD with momentum in training) runs three times on the CPU at one
thread, then once under ``torch.profiler`` with ``profile_memory``: every allocation and free of PyTorch's CPU
allocator, in order, gives the peak of live tensor bytes above the step's start and the operator it happened in.
Beside it, :func:`perfzoo.features.memory.simulate_peak_memory` on the meta device: its peak above the bytes
live at the start of a timed step (weights, input and, in training, the optimizer state, which the simulation
creates in its first step). The difference is what a CPU kernel allocates through PyTorch's allocator that the
simulation does not see (oneDNN's reorders and workspaces); memory outside PyTorch's allocator (code pages, JIT
kernels, allocator fragmentation) is in neither, only in the peak-RSS label.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import timm  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from perfzoo.features.memory import simulate_peak_memory  # noqa: E402
from perfzoo.profiling.core import make_step  # noqa: E402
from perfzoo.profiling.temporaries import allocation_events  # noqa: E402

MIB = 2.0**20
WARM_STEPS = 3


def build(name: str, batch: int, resolution: int, device: str) -> tuple[torch.nn.Module, torch.Tensor]:
    with torch.device(device):
        model = timm.create_model(name, num_classes=100)
        return model, torch.randn(batch, 3, resolution, resolution)


def allocations(prof: profile) -> list[tuple[int, int, str]]:
    """(time, bytes (negative: freed), innermost operator) of every allocator event of the profiled step."""
    return allocation_events(prof.profiler.kineto_results.experimental_event_tree())


def real_peak(name: str, batch: int, mode: str, resolution: int) -> tuple[float, str, dict[str, float]]:
    """(peak live MiB above the step's start, the operator at the peak, MiB allocated per operator)."""
    model, x = build(name, batch, resolution, "cpu")
    step = make_step(model, x, torch.zeros(batch, dtype=torch.int64), mode, "sgd")
    for _ in range(WARM_STEPS):
        step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    live = peak = 0
    at, per_op = "-", collections.Counter()
    for _, size, op in allocations(prof):
        live += size
        per_op[op] += max(size, 0)
        if live > peak:
            peak, at = live, op
    return peak / MIB, at, {op: round(b / MIB, 1) for op, b in per_op.most_common(5)}


def simulated_peak(name: str, batch: int, mode: str, resolution: int) -> float:
    """The simulation's peak MiB above the bytes live at the start of a timed step."""
    model, x = build(name, batch, resolution, "meta")
    sim = simulate_peak_memory(model, x, mode)
    return (sim.peak_bytes - sim.start_bytes - sim.optimizer_bytes) / MIB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="+", help="MODEL:BATCH:MODE[:RESOLUTION]")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| config | real tensor peak above start (MiB) | at | simulated (MiB) | real - simulated "
          "| most allocated by |")
    print("|---|---|---|---|---|---|")
    for spec in args.configs:
        name, batch, mode, *rest = spec.split(":")
        resolution = int(rest[0]) if rest else 64
        real, at, per_op = real_peak(name, int(batch), mode, resolution)
        simulated = simulated_peak(name, int(batch), mode, resolution)
        print(f"| {name}@{resolution}px {mode} b{batch} | {real:.1f} | {at} | {simulated:.1f} "
              f"| {real - simulated:+.1f} | {per_op} |", flush=True)


if __name__ == "__main__":
    main()
