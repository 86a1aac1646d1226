"""LSTMs on the meta device as the CPU runs them (perfzoo.features.recurrent)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from perfzoo.features import meta
from perfzoo.features.meta import featurise
from perfzoo.features.ops import trace_step
from perfzoo.features.recurrent import RECURRENT_FLOP_FORMULAS, cpu_lstm, has_lstm

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
    with cpu_lstm():
        fused = model(x)
        states = model.lstm(x)
    assert fused.shape == generic.shape and fused.dtype == generic.dtype
    assert [tuple(t.shape) for t in (states[0], *states[1])] == [(4, 7, 16), (4, 4, 8), (4, 4, 8)]


def test_projections_and_grus_keep_the_generic_path():
    table = trace_step(*on_meta(proj_size=4), "inference", REGISTRY, "projected")
    assert "recurrent" not in set(table["kind"]) and "elementwise" in set(table["kind"])
    with torch.device("meta"):
        gru = nn.GRU(6, 8, batch_first=True)
    assert not has_lstm(gru)
    gru_table = trace_step(gru, torch.empty(4, 7, 6, device="meta"), "inference", REGISTRY, "gru")
    assert "recurrent" not in set(gru_table["kind"])


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
