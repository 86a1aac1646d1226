"""Memory a device's kernels allocate inside themselves that no meta kernel shows, measured by the hardware rule.

oneDNN's backward-weights pass of a 7 × 7 depthwise convolution with a channels-last gradient (ConvNeXt's blocks)
allocates a temporary of about 257 times the layer's weight bytes on an AVX-512 CPU and 65 times on AVX2: its
blocked weight layout pads each channel's kernel (``bench/RESULTS.md``, "Memory a CPU convolution allocates inside
itself"). The factor belongs to the CPU's instruction set and oneDNN's version, not to the model, so the hardware
rule measures it on the profiled CPU (:func:`depthwise_temporary`) and ``memory_sim`` prices the simulated feature
``sim_cl_depthwise_weight_bytes`` with it instead of fitting a coefficient that a zoo without such a family in
training cannot identify.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from perfzoo.io import one_line

DEPTHWISE_CHANNELS = 256
DEPTHWISE_MAP = 8
"""The measured layer: a 7 × 7 depthwise convolution over 256 channels of an 8 × 8 map at batch 1 (the factor is
the same for 40-384 channels, maps of 8-16 and batches 1-16: ``bench/conv_temporary.py``)."""


def allocation_events(nodes: Iterable[Any]) -> list[tuple[int, int, str]]:
    """(start time in ns, bytes (negative: freed), innermost operator or "-") of every allocator event at or below
    ``nodes`` (nodes of ``torch.profiler``'s event tree, profiled with ``profile_memory``), in time order."""
    found, stack = [], list(nodes)
    while stack:
        n = stack.pop()
        stack.extend(n.children)
        if type(n.extra_fields).__name__ == "_ExtraFields_Allocation":
            found.append((n.start_time_ns, n.extra_fields.alloc_size, n.parent.name if n.parent is not None else "-"))
    return sorted(found)


def temporary_bytes(node: Any) -> int:  # noqa: ANN401 - the profiler's event tree
    """Peak bytes the allocator handed out at or below ``node`` above the bytes still held when it returns."""
    live = peak = 0
    for _, size, _ in allocation_events([node]):
        live += size
        peak = max(peak, live)
    return peak - live


def profiled_calls(prof: Any, name: str) -> list[Any]:  # noqa: ANN401 - torch.profiler.profile
    """The profiled calls of the operator ``name``, in the order they started."""
    found, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        n = stack.pop()
        (found.append(n) if n.name == name else stack.extend(n.children))
    return sorted(found, key=lambda n: n.start_time_ns)


def measure_depthwise_temporary(threads: int, channels: int = DEPTHWISE_CHANNELS) -> dict[str, Any]:
    """``{weight_bytes, temporary_bytes, factor, channels, threads}`` of one channels-last depthwise backward on the
    CPU with ``threads`` intra-op threads (the call runs once unmeasured, then once under ``torch.profiler`` with
    ``profile_memory``)."""
    import torch  # lazy: ~3 s import; the profiling parent only checks the device
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    shape = (1, channels, DEPTHWISE_MAP, DEPTHWISE_MAP)
    x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
    grad = torch.randn(shape).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(channels, 1, 7, 7)
    args = (grad, x, weight, None, (1, 1), (3, 3), (1, 1), False, (0, 0), channels, (False, True, False))
    backward = torch.ops.aten.convolution_backward.default
    backward(*args)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        backward(*args)
    (call,) = profiled_calls(prof, "aten::convolution_backward")
    weight_bytes = weight.numel() * weight.element_size()
    temporary = temporary_bytes(call)
    return {"weight_bytes": weight_bytes, "temporary_bytes": temporary, "factor": temporary / weight_bytes,
            "channels": channels, "threads": threads}


def depthwise_temporary(kind: str, threads: int) -> dict[str, Any]:
    """The hardware record's ``depthwise_temporary``: :func:`measure_depthwise_temporary` on a cpu device, else
    ``{"missing": reason}`` (never a number that was not measured)."""
    if kind != "cpu":
        return {"missing": f"not measured on kind {kind!r}: a oneDNN (CPU) temporary"}
    try:
        return measure_depthwise_temporary(threads)
    except Exception as exc:  # noqa: BLE001 - whatever the profiler raises, the record says why it is missing
        return {"missing": f"the measurement failed: {one_line(exc)}"}
