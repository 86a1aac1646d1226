"""The hardware rule's price of one operator call: a tiny call of each operator kind timed on the CPU.

``composed`` prices each call of kind k at a cost ``γ_k`` beside its costs per FLOP and per byte. The zoo's
operators at batch 1 touch 64 KB-1 MB each, so its fits cannot tell a cost per call from one per byte: on one
default run the leave-one-family-out folds put 14-27 µs on an elementwise call in eight folds and 0.1 µs in the
ninth, and a model of many small calls (a GRU's C++ loop, 1,283 elementwise calls per step) was then predicted at
three times its measured step. What a call costs when its bytes and FLOPs are next to nothing is a property of
the device and its software, measured here in a second, and ``composed`` shrinks its per-call costs towards it
(``bench/RESULTS.md``, "composed's per-call costs shrunk towards the device's tiny call").

Each kind of :data:`perfzoo.hardware.CALL_COST_KINDS` gets one representative aten call on an operand of a few
hundred floats (an elementwise add, a 1 x 64 by 64 x 64 matrix product, a 3 x 3 convolution over 4 x 8 x 8, ...),
under ``no_grad`` with the device's intra-op threads. Every kind is timed in turn within each round (``calls``
calls after a warm-up), so the machine's drift falls on every kind alike, and a kind's cost is the median over
the rounds. A GPU records the measurement as missing with its reason: a CUDA call's price is its launch, which
this CPU loop does not time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from perfzoo.hardware import CALL_COST_KINDS
from perfzoo.io import one_line

ROUNDS = 7
CALLS = 1000
WARMUP_CALLS = 200


def tiny_calls() -> dict[str, Callable[[], object]]:
    """One tiny call per kind of :data:`CALL_COST_KINDS`, on fixed random CPU operands."""
    import torch  # lazy: ~3 s import; the profiling parent only checks the device
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    v, w = randn(256), randn(256)
    row, square = randn(1, 64), randn(64, 64)
    image, kernel, depthwise = randn(1, 4, 8, 8), randn(4, 4, 3, 3), randn(4, 1, 3, 3)
    mean, var = torch.zeros(4), torch.ones(4)
    table, index = randn(64, 16), torch.tensor([[3]])
    q = randn(1, 1, 4, 16)
    calls: dict[str, Callable[[], object]] = {
        "elementwise": lambda: torch.add(v, w),
        "matmul": lambda: torch.addmm(v[:64], row, square),
        "conv": lambda: F.conv2d(image, kernel, padding=1),
        "conv_grouped": lambda: F.conv2d(image, depthwise, padding=1, groups=4),
        "norm": lambda: F.batch_norm(image, mean, var),
        "pool": lambda: F.max_pool2d(image, 2),
        "softmax": lambda: torch.softmax(v, 0),
        "reduction": lambda: v.sum(),
        "copy": lambda: v.clone(),
        "embedding": lambda: F.embedding(index, table),
        "attention": lambda: F.scaled_dot_product_attention(q, q, q),
        "optimizer": lambda: w.add_(v, alpha=1e-12),
    }
    return {kind: calls[kind] for kind in CALL_COST_KINDS}


def measure_call_costs(threads: int, rounds: int = ROUNDS, calls: int = CALLS) -> dict[str, Any]:
    """``{us: {kind: µs per call}, threads, rounds, calls}``: per kind the median over ``rounds`` rounds of the
    time of one of ``calls`` tiny calls (module docstring)."""
    import torch

    torch.set_num_threads(threads)
    fns = tiny_calls()
    times: dict[str, list[float]] = {kind: [] for kind in fns}
    with torch.no_grad():
        for fn in fns.values():
            for _ in range(WARMUP_CALLS):
                fn()
        for _ in range(rounds):
            for kind, fn in fns.items():
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                times[kind].append((time.perf_counter() - start) / calls * 1e6)
    return {"us": {kind: statistics.median(values) for kind, values in times.items()}, "threads": threads,
            "rounds": rounds, "calls": calls}


def call_costs(kind: str, threads: int) -> dict[str, Any]:
    """The hardware record's ``call_costs``: :func:`measure_call_costs` on a cpu device, else ``{"missing":
    reason}`` (never a number that was not measured)."""
    if kind != "cpu":
        return {"missing": f"not measured on kind {kind!r}: a call's price there is its launch, not timed here"}
    try:
        return measure_call_costs(threads)
    except Exception as exc:  # noqa: BLE001 - whatever torch raises, the record says why it is missing
        return {"missing": f"the measurement failed: {one_line(exc)}"}
