"""Where an LSTM's memory goes on the CPU: PyTorch's allocator in a real step against the meta-device simulation, and
what oneDNN's fused layer allocates per call.

    PYTHONPATH=src python bench/lstm_memory.py            # about a minute, one thread

Why: ``memory_sim`` under-predicts ``examples/keyword_lstm.py`` at every config (bench/RESULTS.md, "Where the LSTM's
memory goes"). Two tables, both in MiB of PyTorch's CPU allocator (``torch.profiler`` with ``profile_memory``):

* per config (the README's LSTM at batches 1, 8 and 32, and one- to three-layer LSTMs of other sizes; inference and
  training, SGD with momentum): the real step's peak of live tensor bytes above its start and the operator at the peak
  (``bench/memory_timeline.py``'s ``real_peak``), the simulation's (``simulate_peak_memory``, as the profiled rows'
  ``sim_peak_bytes`` without the bytes live at the start), and their difference in units of one layer's *gate bytes*
  (T × B × 4H × 4: the four gates of every time step, float32);
* per fused layer call (``aten.mkldnn_rnn_layer`` on CPU tensors, one layer, T × B × I → H): the workspace it returns
  (its fourth output) and the temporary it allocates above what it returns, in gate bytes, with ``train`` false and
  true.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import memory_timeline  # noqa: E402
from keyword_lstm import build as keyword_lstm  # noqa: E402
from perfzoo.features.memory import simulate_peak_memory  # noqa: E402
from perfzoo.profiling.temporaries import profiled_calls, temporary_bytes  # noqa: E402

MIB = 2.0**20
FEATURES = 40
MODELS = [("keyword_lstm", 128, 2, 98, b) for b in (1, 8, 32)] + [
    ("lstm", 128, 1, 98, 8), ("lstm", 128, 1, 98, 32), ("lstm", 128, 1, 50, 32), ("lstm", 256, 1, 98, 16),
    ("lstm", 64, 1, 200, 16), ("lstm", 128, 2, 98, 32), ("lstm", 128, 3, 98, 16)]
"""(model, hidden H, layers, time steps T, batch B); every input has 40 features per time step."""
LAYERS = [(16, 4, 32, 64), (98, 32, 40, 128), (98, 8, 128, 128), (50, 16, 40, 256), (98, 1, 40, 128)]
"""(T, B, I, H) of the fused layer calls."""


class LastStep(nn.Module):
    """An LSTM over the sequence and a linear head on its last step (the keyword spotter's shape)."""

    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(FEATURES, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0][:, -1])


def gate_mib(hidden: int, steps: int, batch: int) -> float:
    return steps * batch * 4 * hidden * 4 / MIB


def model_rows() -> None:
    print("| model | H | layers | T | B | mode | gate MiB | real peak | at | simulated | (real - sim) / gate |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, hidden, layers, steps, batch in MODELS:
        def build(_name: str, b: int, _resolution: int, device: str, hidden: int = hidden, layers: int = layers,
                  steps: int = steps, name: str = name) -> tuple[nn.Module, torch.Tensor]:
            with torch.device(device):
                model = keyword_lstm() if name == "keyword_lstm" else LastStep(hidden, layers)
                return model, torch.randn(b, steps, FEATURES)

        memory_timeline.build = build  # real_peak builds through the module's build
        for mode in ("inference", "training"):
            real, at, _ = memory_timeline.real_peak(name, batch, mode, 0)
            model, x = build(name, batch, 0, "meta")
            sim = simulate_peak_memory(model, x, mode)
            simulated = (sim.peak_bytes - sim.start_bytes - sim.optimizer_bytes) / MIB
            gate = gate_mib(hidden, steps, batch)
            print(f"| {name} | {hidden} | {layers} | {steps} | {batch} | {mode} | {gate:.2f} | {real:.2f} | {at} "
                  f"| {simulated:.2f} | {(real - simulated) / gate:.2f} |", flush=True)


def layer_rows() -> None:
    print("\n| T | B | I | H | train | workspace / gate | temporary / gate |")
    print("|---|---|---|---|---|---|---|")
    layer = torch.ops.aten.mkldnn_rnn_layer.default
    for steps, batch, inputs, hidden in LAYERS:
        x, h0, c0 = torch.randn(steps, batch, inputs), torch.randn(batch, hidden), torch.randn(batch, hidden)
        weights = (torch.randn(4 * hidden, inputs), torch.randn(4 * hidden, hidden), torch.randn(4 * hidden),
                   torch.randn(4 * hidden))
        gate = gate_mib(hidden, steps, batch) * MIB
        for train in (False, True):
            args = (x, *weights, h0, c0, False, [], 2, hidden, 1, True, False, False, train)  # mode 2: LSTM
            layer(*args)
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                workspace = layer(*args)[3]
            (call,) = profiled_calls(prof, "aten::mkldnn_rnn_layer")
            print(f"| {steps} | {batch} | {inputs} | {hidden} | {train} "
                  f"| {workspace.numel() * workspace.element_size() / gate:.3f} | {temporary_bytes(call) / gate:.3f} |",
                  flush=True)


def main() -> None:
    torch.set_num_threads(1)
    model_rows()
    layer_rows()


if __name__ == "__main__":
    main()
