"""Memory a CPU convolution allocates inside itself, in a real step and replayed alone (one layer at a time).

    python bench/conv_temporary.py MODEL[:BATCH:MODE[:RESOLUTION]] ...    # e.g. convnext_atto:16:training

Why: ``bench/memory_timeline.py`` finds the real CPU step of convnext's training 11-14 MiB above the meta-device
simulation, inside ``aten::convolution_backward``. For each timm model (random weights, 100 classes, 64 px unless
given; one thread) the profiled step runs three times, then once with every convolution call's arguments recorded
(``convolution_backward`` in training, ``convolution`` in inference), then once under ``torch.profiler`` with
``profile_memory``; the same step runs once more on the meta device, its calls' arguments recorded alike. Per call,
the *temporary* is the peak of the bytes allocated inside the operator (its child operators included) above the
bytes it still holds when it returns (its outputs). It is reported four ways:

* ``step``: inside the real step;
* ``alone``: the same call replayed alone on random CPU tensors of the recorded shapes and strides;
* ``meta strides``: replayed alone with the shapes and strides of the same call in the meta-device step (a meta
  convolution's output is always contiguous, a CPU one keeps a channels-last input's layout), as a simulation
  that replays the meta trace would have to;
* ``batch 1``: ``alone`` at batch 1 (whether the temporary depends on the batch).

Printed: per config the largest temporary of each kind and the worst ``|step - alone|``; per layer shape whose
temporary exceeds 0.25 MiB, the four values.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from memory_timeline import MIB, WARM_STEPS, build  # noqa: E402
from perfzoo.features.memory import is_channels_last  # noqa: E402
from perfzoo.profiling.core import make_step  # noqa: E402
from perfzoo.profiling.temporaries import profiled_calls, temporary_bytes  # noqa: E402

OPERATORS = {"training": torch.ops.aten.convolution_backward.default, "inference": torch.ops.aten.convolution.default}
BATCHED = {"training": (0, 1), "inference": (0,)}
"""Positions of the operator's arguments that carry the batch (a backward's output grad and input; the input)."""


def replayed(op, args: tuple, mode: str, batch: int | None = None) -> int:  # noqa: ANN001
    """The temporary of ``op(*args)`` run alone on random CPU tensors of the arguments' shapes and strides (CPU or
    meta tensors); ``batch`` replaces the batch of the batched arguments, which keep their layout."""
    def real(t: torch.Tensor, i: int) -> torch.Tensor:
        if batch is None:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu").normal_()
        shape = (batch, *t.shape[1:]) if i in BATCHED[mode] else tuple(t.shape)
        layout = torch.channels_last if is_channels_last(t) else torch.contiguous_format
        return torch.empty(shape, dtype=t.dtype).normal_().contiguous(memory_format=layout)

    tensors = tuple(real(a, i) if isinstance(a, torch.Tensor) else a for i, a in enumerate(args))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, torch.no_grad():
        op(*tensors)
    (call,) = profiled_calls(prof, operator_name(op))
    return temporary_bytes(call)


def warm_step(name: str, batch: int, mode: str, resolution: int, device: str):  # noqa: ANN201 - make_step's closure
    """The profiled step of the model on ``device``, after warm steps on the CPU."""
    model, x = build(name, batch, resolution, device)
    step = make_step(model, x, torch.zeros(batch, dtype=torch.int64, device=device), mode, "sgd")
    for _ in range(WARM_STEPS if device == "cpu" else 0):
        step()
    return step


def recorded_calls(op, step) -> list[tuple]:  # noqa: ANN001
    """The arguments of every call of ``op`` in one run of ``step``."""
    calls: list[tuple] = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is op:
                calls.append(tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args))
            return func(*args, **(kwargs or {}))

    with Recording():
        step()
    return calls


def operator_name(op) -> str:  # noqa: ANN001
    return "aten::" + op._schema.name.split("::")[1]


def layout(t: torch.Tensor) -> str:
    if t.is_contiguous():
        return "contiguous"
    return "channels_last" if t.is_contiguous(memory_format=torch.channels_last) else "strided"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="+", help="MODEL[:BATCH:MODE[:RESOLUTION]]")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        pass  # the profiler's first start in a process takes about a second
    for spec in args.configs:
        parts = spec.split(":")
        name, batch, mode, resolution = [*parts, *("16", "training", "64")[len(parts) - 1:]]
        report(spec, name, int(batch), mode, int(resolution))


def report(spec: str, name: str, batch: int, mode: str, resolution: int) -> None:
    op = OPERATORS[mode]
    step = warm_step(name, batch, mode, resolution, "cpu")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    in_step = [temporary_bytes(call) for call in profiled_calls(prof, operator_name(op))]
    calls = recorded_calls(op, step)
    on_meta = recorded_calls(op, warm_step(name, batch, mode, resolution, "meta"))
    if not len(in_step) == len(calls) == len(on_meta):
        raise SystemExit(f"{spec}: {len(in_step)} profiled calls, {len(calls)} recorded, {len(on_meta)} on meta")
    worst, largest, shown = 0, [0, 0, 0, 0], set()
    for step_bytes, call, meta_call in zip(in_step, calls, on_meta, strict=True):
        values = (step_bytes, replayed(op, call, mode), replayed(op, meta_call, mode), replayed(op, call, mode, batch=1))
        worst = max(worst, abs(values[0] - values[1]))
        largest = [max(a, b) for a, b in zip(largest, values, strict=True)]
        tensor = call[BATCHED[mode][-1]]
        key = (tuple(tensor.shape), tuple(call[BATCHED[mode][-1] + 1].shape), layout(tensor))
        if max(values) > 0.25 * MIB and key not in shown:
            shown.add(key)
            print(f"  input {key[0]} {key[2]}, weight {key[1]}: step {values[0] / MIB:.2f}, alone "
                  f"{values[1] / MIB:.2f}, meta strides {values[2] / MIB:.2f}, batch 1 {values[3] / MIB:.2f} MiB")
    print(f"{spec}: {len(calls)} calls; largest temporary (MiB): step {largest[0] / MIB:.2f}, alone "
          f"{largest[1] / MIB:.2f}, meta strides {largest[2] / MIB:.2f}, batch 1 {largest[3] / MIB:.2f}; "
          f"worst |step - alone| {worst / MIB:.4f} MiB")


if __name__ == "__main__":
    main()
