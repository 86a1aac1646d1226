"""Recurrent layers on the meta device as the CPU runs them (perfzoo.features.recurrent)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.flop_counter import FlopCounterMode

from perfzoo.features import meta
from perfzoo.features.meta import featurise
from perfzoo.features.memory import simulate_peak_memory
from perfzoo.features.ops import trace_step
from perfzoo.features.recurrent import GENERIC_CELLS, RECURRENT_FLOP_FORMULAS, _generic_rnn, cpu_recurrent, has_lstm
from perfzoo.profiling.core import make_step
from perfzoo.profiling.temporaries import allocation_events, profiled_calls

REGISTRY = FlopCounterMode(display=False, custom_mapping=RECURRENT_FLOP_FORMULAS).flop_registry


class Tagger(nn.Module):
    """An LSTM over (batch, steps, features) and a linear head on every step."""

    def __init__(self, features: int = 6, hidden: int = 8, layers: int = 2, bidirectional: bool = False,
                 proj_size: int = 0) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional,
                            proj_size=proj_size)
        width = (proj_size or hidden) * (2 if bidirectional else 1)
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0]).mean(dim=1)


def on_meta(batch: int = 4, steps: int = 7, **kwargs: object) -> tuple[nn.Module, torch.Tensor]:
    with torch.device("meta"):
        return Tagger(**kwargs), torch.empty(batch, steps, 6)


def test_the_cpu_runs_a_float32_lstm_by_one_fused_layer_per_layer():
    model, x = Tagger(), torch.randn(4, 7, 6)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x)
    names = [event.key for event in prof.key_averages()]
    assert "aten::mkldnn_rnn_layer" in names and "aten::sigmoid" not in names


@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_trace_records_the_fused_layers_with_the_gate_flops(bidirectional):
    model, x = on_meta(bidirectional=bidirectional)
    table = trace_step(model, x, "inference", REGISTRY, "tagger")
    fused = table[table["kind"] == "recurrent"]
    directions = 2 if bidirectional else 1
    assert len(fused) == 2 * directions and (table["kind"] == "elementwise").sum() < 7  # no per-step gate arithmetic
    first, second = 2 * 4 * 7 * 4 * 8 * (6 + 8), 2 * 4 * 7 * 4 * 8 * (8 * directions + 8)
    assert fused["flops"].sum() == directions * (first + second)
    training = trace_step(*on_meta(bidirectional=bidirectional), "training", REGISTRY, "tagger")
    backward = training[(training["kind"] == "recurrent") & (training["phase"] == "backward")]
    assert len(backward) == 2 * directions and backward["flops"].sum() == 2 * fused["flops"].sum()


def test_the_fused_layers_give_the_generic_paths_outputs():
    model, x = on_meta(bidirectional=True)
    generic = model(x)
    with cpu_recurrent():
        fused = model(x)
        states = model.lstm(x)
    assert fused.shape == generic.shape and fused.dtype == generic.dtype
    assert [tuple(t.shape) for t in (states[0], *states[1])] == [(4, 7, 16), (4, 4, 8), (4, 4, 8)]


def test_projections_keep_the_generic_path():
    table = trace_step(*on_meta(proj_size=4), "inference", REGISTRY, "projected")
    assert "recurrent" not in set(table["kind"]) and "elementwise" in set(table["kind"])


@pytest.mark.parametrize("name, module", [("gru", nn.GRU), ("rnn_tanh", nn.RNN),
                                          ("rnn_relu", partial(nn.RNN, nonlinearity="relu"))])
@pytest.mark.parametrize("bidirectional, bias", [(False, True), (True, False)])
def test_the_cpus_branch_of_grus_and_rnns_gives_their_outputs_and_gradients(name, module, bidirectional, bias):
    """The premise of the replacement: op for op the CPU's branch, so it must compute what the modules compute."""
    torch.manual_seed(0)
    layer = module(5, 7, num_layers=2, batch_first=True, bidirectional=bidirectional, bias=bias)
    x, h0 = torch.randn(3, 4, 5, requires_grad=True), torch.randn(4 if bidirectional else 2, 3, 7)
    out, h = layer(x, h0)
    ours, ours_h = _generic_rnn(GENERIC_CELLS[name], x, h0, layer._flat_weights, bias, 2, 0.0, True, bidirectional,
                                True)
    torch.testing.assert_close((ours, ours_h), (out, h))
    inputs = [x, *layer.parameters()]
    torch.testing.assert_close(torch.autograd.grad(ours.sum() + ours_h.sum(), inputs),
                               torch.autograd.grad(out.sum() + h.sum(), inputs))


def test_a_gru_is_traced_with_one_input_product_per_layer_as_on_the_cpu():
    with torch.device("meta"):
        gru = nn.GRU(6, 8, batch_first=True)
    assert not has_lstm(gru)
    table = trace_step(gru, torch.empty(4, 7, 6, device="meta"), "inference", REGISTRY, "gru")
    assert "recurrent" not in set(table["kind"])
    products = table[table["kind"] == "matmul"]
    assert len(products) == 1 + 7  # the sequence's input product, then one hidden product per step (not 2 per step)
    assert products["flops"].sum() == 2 * 4 * 7 * 3 * 8 * (6 + 8)


def cpu_tensor_peak(model: nn.Module, x: torch.Tensor, mode: str) -> int:
    """Bytes PyTorch's CPU allocator holds at the peak of a step above its start: the third of three steps, all
    profiled, so that every block a step frees was allocated under the profiler and counts; the previous step's
    gradients, which the step drops first (``set_to_none``), are dropped before its start, as the simulation's
    peak above its start counts them."""
    step = make_step(model, x, torch.zeros(x.shape[0], dtype=torch.int64), mode, "sgd")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(2):
            step()
        for parameter in model.parameters():
            parameter.grad = None
        with record_function("measured step"):
            step()
    (measured,) = profiled_calls(prof, "measured step")
    live = start = peak = 0
    for time, size, _ in allocation_events(prof.profiler.kineto_results.experimental_event_tree()):
        if time > measured.end_time_ns:
            break
        if time < measured.start_time_ns:
            start = live = live + size
        else:
            live += size
            peak = max(peak, live - start)
    return peak


class Classifier(nn.Module):
    """A two-layer GRU over (batch, steps, features) and a linear head on its last step."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(12, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(x)[0][:, -1])


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_grus_simulated_peak_is_the_cpu_allocators_peak(mode):
    """The CPU holds the sequence's input products while it steps; the meta device's own branch does not (the
    simulation of ``examples/sequence_model.py`` was 1.8 times too low in inference before it followed the CPU)."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        real = cpu_tensor_peak(Classifier(), torch.randn(8, 50, 12), mode)
    finally:
        torch.set_num_threads(threads)
    with torch.device("meta"):
        model, x = Classifier(), torch.empty(8, 50, 12)
    sim = simulate_peak_memory(model, x, mode)
    assert sim.peak_bytes - sim.start_bytes - sim.optimizer_bytes == pytest.approx(real, rel=0.01)


def test_featurise_traces_the_fused_layer_and_simulates_memory_by_the_generic_path(monkeypatch):
    features, _ = featurise(Tagger, (7, 6), 4, "training", "float32", "tagger")
    assert features["op_recurrent_count"] == 4 and features["op_trace_error"] == ""
    assert features["op_elementwise_count"] < 10
    inference, _ = featurise(Tagger, (7, 6), 4, "inference", "float32", "tagger")
    monkeypatch.setattr(meta, "has_lstm", lambda model: False)  # the shared steps: one path for everything
    monkeypatch.setattr("perfzoo.features.recurrent.cpu_runs_fused_lstm", lambda *args: False)
    generic, _ = featurise(Tagger, (7, 6), 4, "training", "float32", "tagger")
    assert features["sim_peak_bytes"] == generic["sim_peak_bytes"]  # the simulation keeps the generic path
    # the fused backward also computes the gradient of the first layer's input, which the generic one skips
    assert generic["flops"] < features["flops"] < 1.15 * generic["flops"]
    generic_inference, _ = featurise(Tagger, (7, 6), 4, "inference", "float32", "tagger")
    assert inference["flops"] == generic_inference["flops"]  # the same gate products
