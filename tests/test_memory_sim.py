"""Peak memory simulated on the meta device (perfzoo.features.memory) and its calibrated regressor."""

from __future__ import annotations

import math
import time
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from perfzoo.features.memory import HEAP_MAX_BYTES, SIM_COLUMNS, SIM_STEPS, is_channels_last, simulate_peak_memory
from perfzoo.features.meta import MODEL_COLUMNS, featurise, simulated_memory
from perfzoo.fitting import fit_split, regressor_inputs, unsupported_reason
from perfzoo.hardware import DEPTHWISE_TEMPORARY_FACTOR, hardware_calibration
from perfzoo.io import InputError
from perfzoo.models.builders import build_model
from perfzoo.profiling.core import ResidentPeak
from perfzoo.profiling.temporaries import depthwise_temporary, measure_depthwise_temporary
from perfzoo.regressors import MemorySimRegressor, load_regressor, make_regressor
from perfzoo.regressors.memory import term_contributions
from step_models import HIDDEN, IN, OUT, CachesOnFirstCall

WEIGHT_BYTES = 4 * (IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT)  # two float32 Linear layers with bias


def two_linear(batch: int) -> tuple[nn.Module, torch.Tensor]:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT)), torch.empty(batch, IN)


def input_bytes(batch: int) -> int:
    return batch * IN * 4 + batch * 8  # float32 inputs and int64 class targets


def hidden_bytes(batch: int) -> int:
    return batch * HIDDEN * 4


@pytest.mark.parametrize("batch", [4, 4096])
def test_inference_peak_is_weights_inputs_and_two_hidden_tensors(batch: int) -> None:
    # no_grad: the first Linear's output lives until the ReLU's output exists, then is freed; the second
    # Linear's output (batch x 4) is smaller than the hidden pair
    result = simulate_peak_memory(*two_linear(batch), "inference")
    assert result.weight_bytes == WEIGHT_BYTES and result.input_bytes == input_bytes(batch)
    assert result.start_bytes == WEIGHT_BYTES + input_bytes(batch)
    assert result.activation_bytes == 2 * hidden_bytes(batch)
    assert result.peak_bytes == WEIGHT_BYTES + input_bytes(batch) + 2 * hidden_bytes(batch)
    assert result.grad_bytes == result.optimizer_bytes == 0


@pytest.mark.parametrize("optimizer, state_bytes",
                         [("sgd", WEIGHT_BYTES), ("adam", 2 * WEIGHT_BYTES + 4 * 4)])
def test_training_peak_holds_weights_optimizer_state_gradients_and_saved_activations(
        optimizer: str, state_bytes: int) -> None:
    # at a large batch the peak is in the second step's backward through the ReLU: the saved ReLU output,
    # the gradient flowing into it and the gradient it returns (three batch x hidden tensors, plus the
    # loss's two scalars), with the optimizer state of the first step (SGD: one momentum buffer per
    # weight; Adam: two moments and one float32 step counter per parameter tensor) and the gradients of the
    # second Linear layer already accumulated
    batch = 4096
    result = simulate_peak_memory(*two_linear(batch), "training", optimizer)
    assert result.weight_bytes == WEIGHT_BYTES and result.input_bytes == input_bytes(batch)
    assert result.optimizer_bytes == state_bytes
    assert result.grad_bytes == 4 * (HIDDEN * OUT + OUT)
    assert result.activation_bytes == 3 * hidden_bytes(batch) + 2 * 4
    assert result.peak_bytes == (result.weight_bytes + result.input_bytes + result.optimizer_bytes
                                 + result.grad_bytes + result.activation_bytes)


@pytest.mark.parametrize("batch", [4, 2**20])
def test_heap_churn_counts_what_both_steps_allocate_below_the_largest_heap_block(batch: int) -> None:
    # each inference step allocates the first Linear's output, the ReLU's and the second Linear's (batch x 4);
    # at 2**20 samples a hidden tensor is 64 MiB, a block glibc always maps on its own, so only the outputs count
    result = simulate_peak_memory(*two_linear(batch), "inference")
    out_bytes = batch * OUT * 4
    heap_sized = [b for b in (hidden_bytes(batch), hidden_bytes(batch), out_bytes) if b < HEAP_MAX_BYTES]
    assert hidden_bytes(2**20) >= HEAP_MAX_BYTES > out_bytes
    assert result.heap_churn_bytes == SIM_STEPS * sum(heap_sized)


class _CountsCalls(nn.Sequential):
    """Rebinds a Python attribute in every call (no tensor kept)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls = getattr(self, "calls", 0) + 1
        return super().forward(x)


class _KeepsInAList(nn.Linear):
    """Appends each output to a list it holds (the list stays the same object)."""

    def __init__(self) -> None:
        super().__init__(IN, HIDDEN)
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept.append(super().forward(x))
        return self.kept[-1]


class _WarmsUpInADict(nn.Linear):
    """Counts its calls in a dict it holds (no tensor kept, no attribute rebound) and takes a wider path after
    the first."""

    def __init__(self) -> None:
        super().__init__(IN, HIDDEN)
        self.seen = {"calls": 0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen["calls"] += 1
        y = super().forward(x)
        return y if self.seen["calls"] == 1 else torch.cat([y, y * 2], dim=1)


class _SwitchesAHeldObject(nn.Linear):
    """Flips a flag of a plain object it holds, three levels down (a list of objects in a dict), and from then on
    takes another path."""

    def __init__(self) -> None:
        super().__init__(IN, HIDDEN)
        self.config = {"stages": [types.SimpleNamespace(fused=False)]}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stage = self.config["stages"][0]
        if not stage.fused:
            stage.fused = True
            return super().forward(x)
        return super().forward(x).relu().exp()


def _simulated(model: nn.Module, x: torch.Tensor, repeats: bool, monkeypatch: pytest.MonkeyPatch
               ) -> tuple[object, int]:
    """(simulation, model calls) with the repeat of a step that leaves nothing allowed or not."""
    import perfzoo.features.memory as memory

    calls: list[int] = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with monkeypatch.context() as patch:
        if not repeats:
            patch.setattr(memory, "_repeats_itself", lambda *_: lambda: False)
        return simulate_peak_memory(model, x, "inference"), len(calls)


@pytest.mark.parametrize("batch", [4, 4096])
def test_an_inference_step_that_leaves_nothing_runs_once_and_counts_as_both(
        batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    once, calls = _simulated(*two_linear(batch), repeats=True, monkeypatch=monkeypatch)
    both, both_calls = _simulated(*two_linear(batch), repeats=False, monkeypatch=monkeypatch)
    assert (calls, both_calls) == (1, SIM_STEPS)
    assert once == both


@pytest.mark.parametrize("build", [
    lambda: CachesOnFirstCall(),
    lambda: _CountsCalls(nn.Linear(IN, HIDDEN), nn.ReLU()),
    lambda: _KeepsInAList(),
    lambda: _WarmsUpInADict(),
    lambda: _SwitchesAHeldObject(),
], ids=["keeps a tensor", "rebinds an attribute", "keeps a tensor in a list", "updates a held dict in place",
        "changes a held object in place"])
def test_an_inference_step_that_leaves_state_behind_is_replayed_again(
        build: Callable[[], nn.Module], monkeypatch: pytest.MonkeyPatch) -> None:
    def model_and_input() -> tuple[nn.Module, torch.Tensor]:
        with torch.device("meta"):
            return build(), torch.empty(64, IN)

    again, calls = _simulated(*model_and_input(), repeats=True, monkeypatch=monkeypatch)
    both, _ = _simulated(*model_and_input(), repeats=False, monkeypatch=monkeypatch)
    assert calls == SIM_STEPS and again == both


def test_only_an_inference_step_keeps_its_heap_events_for_a_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step's allocations are kept for the heap model's repeat where a step can be counted as one
    (inference); a training step is always replayed, so its tracker keeps none (and refuses a repeat)."""
    import perfzoo.features.memory as memory

    trackers: list = []
    original = memory._LiveBytes.__init__

    def recording(self: object, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        trackers.append(self)

    monkeypatch.setattr(memory._LiveBytes, "__init__", recording)
    simulate_peak_memory(*two_linear(4), "inference")
    simulate_peak_memory(*two_linear(4), "training")
    inference, training = trackers
    assert inference.first_step_heap_events and not training.first_step_heap_events
    with pytest.raises(RuntimeError, match="keep_first_step"):
        training.repeat_first_step_in_heap()


def test_training_churn_holds_both_steps_gradients_and_the_optimizer_state_created_once() -> None:
    # set_to_none: each step allocates every gradient anew; the first step creates SGD's momentum buffers
    inference = simulate_peak_memory(*two_linear(4), "inference")
    sgd = simulate_peak_memory(*two_linear(4), "training", "sgd")
    adam = simulate_peak_memory(*two_linear(4), "training", "adam")
    assert sgd.heap_churn_bytes >= SIM_STEPS * WEIGHT_BYTES + WEIGHT_BYTES > inference.heap_churn_bytes
    assert adam.heap_churn_bytes > sgd.heap_churn_bytes  # two moments and Adam's temporaries


def test_training_needs_more_than_inference_and_adam_more_than_sgd() -> None:
    inference = simulate_peak_memory(*two_linear(64), "inference")
    sgd = simulate_peak_memory(*two_linear(64), "training", "sgd")
    adam = simulate_peak_memory(*two_linear(64), "training", "adam")
    assert inference.peak_bytes < sgd.peak_bytes < adam.peak_bytes
    assert inference.op_kinds < sgd.op_kinds < adam.op_kinds and sgd.onednn_conv == 0


def test_convolution_is_flagged_and_columns_reach_the_feature_table() -> None:
    def cnn() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))

    feats, _ = featurise(cnn, (3, 8, 8), 2, "training", model_id="cnn")
    assert list(feats) == MODEL_COLUMNS and set(SIM_COLUMNS) <= set(feats)
    assert feats["sim_onednn_conv"] == 1 and feats["sim_weight_bytes"] == feats["weight_bytes"]
    assert feats["sim_peak_bytes"] > feats["sim_start_bytes"] > feats["weight_bytes"]
    assert feats["sim_heap_peak_bytes"] >= feats["sim_peak_bytes"]  # the heap holds at least the live bytes
    direct = simulated_memory(cnn, (3, 8, 8), 2, "training", model_id="cnn")
    assert direct.features() == {k: feats[k] for k in SIM_COLUMNS}


def test_the_tracker_runs_each_storage_through_the_heap_model_in_order_and_a_training_step_leaves_holes() -> None:
    from perfzoo.features.heap import footprint_peak
    from perfzoo.features.memory import _LiveBytes

    tracker = _LiveBytes()
    with torch.device("meta"):
        first = torch.empty(100_000, dtype=torch.uint8)
        tracker.add(first, "activation")
        tracker.add(torch.empty(50_000, dtype=torch.uint8), "activation")  # freed at once: the last reference
        held = torch.empty(60_000, dtype=torch.uint8)
        tracker.add(held, "activation")
        del first
        tracker.add(torch.empty(120_000, dtype=torch.uint8), "activation")
    events = [("a", 1, 100_000), ("a", 2, 50_000), ("f", 2), ("a", 3, 60_000), ("f", 1), ("a", 4, 120_000), ("f", 4)]
    assert tracker.heap.peak == footprint_peak(events)
    sim = simulate_peak_memory(*two_linear(64), "training", "sgd")
    assert sim.heap_peak_bytes > sim.peak_bytes  # the backward's freed activations stay resident in the heap


def conv1d_front(batch: int, device: str) -> tuple[nn.Module, torch.Tensor]:
    """The user example's Conv1d front end over 12 x 256 samples: small enough at batch 1 for PyTorch's own
    kernel, on oneDNN from batch 2."""
    with torch.device(device):
        model = nn.Sequential(nn.Conv1d(12, 128, 7, stride=2, padding=3), nn.ReLU(), nn.Flatten(),
                              nn.Linear(128 * 128, 10))
        return model, torch.randn(batch, 12, 256)


@pytest.mark.parametrize("batch", [1, 8])
def test_onednn_flag_follows_the_backend_the_cpu_runs(batch: int) -> None:
    model, x = conv1d_front(batch, "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            model(x)
    finally:
        torch.set_num_threads(threads)
    on_onednn = "aten::mkldnn_convolution" in {event.key for event in prof.key_averages()}
    assert on_onednn == (batch > 1)  # the premise, on the real CPU
    for mode in ("inference", "training"):
        assert simulate_peak_memory(*conv1d_front(batch, "meta"), mode).onednn_conv == int(on_onednn)


class _DepthwiseBlock(nn.Module):
    """A 7 x 7 depthwise convolution followed by a norm and a linear layer over channels last (ConvNeXt's
    block), or by a ``BatchNorm2d`` (a MobileNet-style block, whose gradients stay contiguous)."""

    def __init__(self, channels_last_norm: bool) -> None:
        super().__init__()
        self.dw = nn.Conv2d(16, 16, 7, padding=3, groups=16)
        self.channels_last_norm = channels_last_norm
        self.norm = nn.LayerNorm(16) if channels_last_norm else nn.BatchNorm2d(16)
        self.pw = nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dw(x)
        if self.channels_last_norm:
            x = self.pw(self.norm(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        else:
            x = self.norm(x)
        return self.head(x.mean(dim=(2, 3)))


def _cpu_gradient_is_channels_last(model: nn.Module) -> bool:
    """Whether the real CPU step's depthwise ``convolution_backward`` gets a channels-last gradient."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is torch.ops.aten.convolution_backward.default:
                seen.append(is_channels_last(args[0]))
            return func(*args, **(kwargs or {}))

    with Seen():
        model(torch.randn(2, 16, 8, 8)).sum().backward()
    return seen == [True]


@pytest.mark.parametrize("channels_last_norm", [True, False])
def test_a_depthwise_weight_gradient_from_a_channels_last_gradient_is_counted_in_training_only(
        channels_last_norm: bool) -> None:
    assert _cpu_gradient_is_channels_last(_DepthwiseBlock(channels_last_norm)) == channels_last_norm  # premise
    with torch.device("meta"):
        model, x = _DepthwiseBlock(channels_last_norm), torch.empty(2, 16, 8, 8)
    training = simulate_peak_memory(model, x, "training").cl_depthwise_weight_bytes
    assert training == (16 * 49 * 4 if channels_last_norm else 0)  # the weight's bytes, whatever the batch
    assert simulate_peak_memory(model, x, "inference").cl_depthwise_weight_bytes == 0


def test_recording_the_convolutions_keeps_no_tensor_alive() -> None:
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Conv1d(16, 16, 3, padding=1) for _ in range(3)))
        x = torch.empty(4, 16, 256)
    result = simulate_peak_memory(model, x, "inference")
    assert result.onednn_conv == 1
    assert result.activation_bytes == 2 * x.numel() * 4  # one convolution's input and output, no earlier one


def test_three_billion_parameter_transformer_is_simulated_without_real_memory() -> None:
    kwargs = {"d_model": 2560, "heads": 20, "layers": 38}
    build = lambda: build_model("transformer", "encoder", kwargs, 10, (16,))  # noqa: E731
    simulated_memory(lambda: nn.Linear(2, 2), (2,), 1, "training")  # lazy imports out of the measurement
    resident = ResidentPeak.start()
    started = time.perf_counter()
    result = simulated_memory(build, (16,), 1, "training", "int64", "adam", model_id="encoder-3b")
    resident.close_phase()
    seconds, grown_mb = time.perf_counter() - started, resident.total_mb  # the whole resident set, files included
    assert result.weight_bytes > 4 * 3_000_000_000  # > 3e9 float32 parameters
    assert result.peak_bytes >= result.weight_bytes * 3  # weights, both Adam moments, gradients on top
    assert grown_mb < 256, f"simulating took {grown_mb:.0f} MiB of real memory"
    assert seconds < 60


def test_a_step_without_meta_kernel_names_the_model() -> None:
    class NeedsValue(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * float(x.sum().item())  # .item() reads data a meta tensor does not have

    with torch.device("meta"):
        model, x = NeedsValue(), torch.empty(2, 3)
    with pytest.raises(InputError, match="model odd-one: inference step failed .*meta"):
        simulate_peak_memory(model, x, "inference", model_id="odd-one")
    with pytest.raises(InputError, match="model real: .*meta device, found tensors on cpu"):
        simulate_peak_memory(nn.Linear(2, 2), torch.zeros(1, 2), "inference", model_id="real")
    with pytest.raises(InputError, match="model broken: build failed"):
        simulated_memory(lambda: 1 / 0, (2,), 1, "inference", model_id="broken")
    with pytest.raises(InputError, match="unknown optimizer 'lbfgs'"):
        simulate_peak_memory(*two_linear(2), "training", "lbfgs", model_id="m")


# --------------------------------------------------------------------------- the calibrated regressor

COEF = {"cpu": [9.0, 1.0, 0.4, 0.3, 5.0, 35.0, 257.0], "gpu": [30.0, 1.0, 1.2, 0.0, 0.0, 0.0, 0.0]}


def sim_frame(n: int, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """Rows on two devices whose label is exactly the regressor's model with COEF."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "device": np.where(np.arange(n) % 2, "cpu", "gpu"), "mode": rng.choice(["inference", "training"], n),
        "sim_heap_peak_bytes": rng.uniform(1, 3000, n) * 2**20,
        "sim_activation_bytes": rng.uniform(0, 200, n) * 2**20,
        "sim_op_kinds": rng.integers(3, 40, n).astype(float),
        "sim_onednn_conv": rng.integers(0, 2, n).astype(float),
        "sim_cl_depthwise_weight_bytes": np.where(rng.uniform(size=n) < 0.3, rng.uniform(0.01, 0.1, n), 0) * 2**20,
        "flops": rng.uniform(1, 2, n)})
    training = (frame["mode"] == "training").to_numpy(dtype=float)
    activation = frame["sim_activation_bytes"] / 2**20
    terms = np.column_stack([training, frame["sim_heap_peak_bytes"] / 2**20, activation, training * activation,
                             np.sqrt(frame["sim_op_kinds"]), frame["sim_onednn_conv"],
                             frame["sim_cl_depthwise_weight_bytes"] / 2**20])
    coef = np.array([COEF[d] for d in frame["device"]])
    return frame, (terms * coef).sum(axis=1)


def test_regressor_recovers_per_device_calibration_and_round_trips(tmp_path: Path) -> None:
    X, y = sim_frame(120)
    reg = make_regressor("memory_sim").fit(X, y)
    for device, coef in COEF.items():
        np.testing.assert_allclose(reg.coefficients(device).to_numpy(), coef, rtol=1e-6, atol=1e-6)
    test, y_test = sim_frame(30, seed=1)
    np.testing.assert_allclose(reg.predict(test), y_test, rtol=1e-6)
    reg.save(tmp_path / "memory_sim.json")
    loaded = load_regressor(tmp_path / "memory_sim.json")
    assert isinstance(loaded, MemorySimRegressor)
    np.testing.assert_array_equal(loaded.predict(test), reg.predict(test))
    unseen = test.assign(device="tpu")  # a device without training rows: the coefficients fitted on all rows
    np.testing.assert_array_equal(loaded.coefficients("tpu").to_numpy(), reg.global_coef_)
    assert not np.allclose(loaded.predict(unseen), loaded.predict(test))


def test_a_step_that_allocates_and_runs_nothing_is_predicted_to_add_no_memory() -> None:
    X, y = sim_frame(120)
    reg = MemorySimRegressor().fit(X, y)
    empty = X.iloc[:2].assign(mode="inference", sim_heap_peak_bytes=0.0, sim_activation_bytes=0.0, sim_op_kinds=0.0,
                              sim_onednn_conv=0.0, sim_cl_depthwise_weight_bytes=0.0)
    np.testing.assert_array_equal(reg.predict(empty), [0.0, 0.0])  # no constant term to carry over


def test_a_term_no_training_row_exercises_has_no_coefficient_and_its_rows_no_prediction(tmp_path: Path) -> None:
    X, y = sim_frame(120)
    without = X["sim_cl_depthwise_weight_bytes"] == 0  # e.g. the one family with such convolutions held out
    reg = MemorySimRegressor().fit(X[without], y[without.to_numpy()])
    for device, coef in COEF.items():
        fitted = reg.coefficients(device).to_numpy()
        np.testing.assert_allclose(fitted[:-1], coef[:-1], rtol=1e-6, atol=1e-6)
        assert np.isnan(fitted[-1])  # unknown, not 0
    np.testing.assert_allclose(reg.predict(X[without]), y[without.to_numpy()], rtol=1e-6)  # rows without it: priced
    held_out = X[~without]
    assert np.isnan(reg.predict(held_out)).all()
    assert reg.unpriced_terms(held_out.iloc[:1]) == [["cl_depthwise_weight_mib"]]
    notes = reg.prediction_notes(held_out)
    assert len(notes) == 1 and "'cl_depthwise_weight_mib'" in notes[0] and f"{len(held_out)} row(s)" in notes[0]
    assert DEPTHWISE_TEMPORARY_FACTOR in notes[0] and reg.prediction_notes(X[without]) == []
    reg.save(tmp_path / "memory_sim.json")  # an unknown coefficient stays unknown in the file
    assert np.isnan(load_regressor(tmp_path / "memory_sim.json").coefficients("cpu").iloc[-1])


def test_a_term_without_coefficient_adds_nothing_where_unexercised_and_nan_where_exercised() -> None:
    """The sum the regressor and the benchmarks (bench/memory_terms.py, bench/onednn_primitives.py) price rows by."""
    coef = np.array([0.5, 1.0, np.nan])  # the last term: no training row exercised it
    out = term_contributions(np.array([[1.0, 2.0, 0.0], [1.0, 2.0, 3.0], [np.nan, 2.0, 0.0]]), coef)
    np.testing.assert_array_equal(out[0], [0.5, 2.0, 0.0])
    np.testing.assert_array_equal(out[1, :2], [0.5, 2.0])
    assert np.isnan(out[1, 2]) and np.isnan(out[2, 0])  # an exercised term without a price; a missing feature
    assert list(np.isnan(out.sum(axis=1))) == [False, True, True]


def test_a_prediction_averages_the_fold_models_that_can_price_the_row_and_says_which_could_not(
        tmp_path: Path) -> None:
    from perfzoo.evaluate import Calibration
    from perfzoo.prediction import Predictor

    X, y = sim_frame(120)
    without = X["sim_cl_depthwise_weight_bytes"] == 0
    folds = {"held_out": MemorySimRegressor().fit(X[without], y[without.to_numpy()]),
             "all": MemorySimRegressor().fit(X, y), "again": MemorySimRegressor().fit(X, y)}
    predictor = Predictor("peak_mem_mb", "memory_sim", "leave_one_family_out", tmp_path / "m.json", folds, {}, 5.0,
                          50, Calibration(0.1, 40))
    rows = pd.concat([X[~without].iloc[:2], X[without].iloc[:1]])
    point, lo, hi, method = predictor.predict(rows)
    np.testing.assert_allclose(point, y[rows.index.to_numpy()], rtol=1e-6)  # the two folds that priced each row
    assert (lo < point).all() and (point < hi).all()
    assert "1 of 3 fold models give no prediction; the point is the mean of the others" in method
    assert "'cl_depthwise_weight_mib' is exercised by 2 row(s) but by no training row" in method
    none = {"held_out": folds["held_out"]}
    point, *_ = Predictor("peak_mem_mb", "memory_sim", "leave_one_family_out", tmp_path / "m.json", none, {}, 5.0,
                          50, Calibration(0.1, 40)).predict(rows)
    assert np.isnan(point[:2]).all() and np.isfinite(point[2])  # no fold can price it: no number


def test_a_measured_factor_prices_the_term_where_no_training_row_could() -> None:
    X, y = sim_frame(120)
    X[DEPTHWISE_TEMPORARY_FACTOR] = np.where(X["device"] == "cpu", 257.0, np.nan)  # measured on the cpu only
    without = X["sim_cl_depthwise_weight_bytes"] == 0
    reg = MemorySimRegressor().fit(X[without], y[without.to_numpy()])
    held_out = X[~without]
    cpu = (held_out["device"] == "cpu").to_numpy()
    np.testing.assert_allclose(reg.predict(held_out[cpu]), y[~without.to_numpy()][cpu], rtol=1e-6)
    assert np.isnan(reg.predict(held_out[~cpu])).all()  # the gpu has neither the measurement nor a training row
    cpu = held_out[cpu]
    np.testing.assert_allclose(reg.row_coefficients(cpu)[:, -1], 257.0)
    assert np.isnan(reg.coefficients("cpu").iloc[-1])  # nothing fitted: the rows use the measurement
    # the measurement stands for the coefficient in the fit too: a wrong one moves the fitted terms, not f
    wrong = MemorySimRegressor().fit(X.assign(**{DEPTHWISE_TEMPORARY_FACTOR: np.where(
        X["device"] == "cpu", 100.0, np.nan)}), y)
    assert not np.allclose(wrong.coefficients("cpu").to_numpy()[:-1], COEF["cpu"][:-1], rtol=1e-3)
    right = MemorySimRegressor().fit(X, y)
    np.testing.assert_allclose(right.coefficients("cpu").to_numpy()[:-1], COEF["cpu"][:-1], rtol=1e-6, atol=1e-6)
    assert np.isnan(right.coefficients("cpu").iloc[-1])  # every cpu row measured: f is never fitted there
    np.testing.assert_allclose(right.coefficients("gpu").to_numpy(), COEF["gpu"], rtol=1e-6, atol=1e-6)


def test_the_fit_rule_passes_the_measured_factor_to_memory_sim_only() -> None:
    X, y = sim_frame(60)
    data = X.assign(**{DEPTHWISE_TEMPORARY_FACTOR: 257.0, "peak_mem_mb": y, "row_id": [f"r{i}" for i in range(60)],
                       "model_id": "m", "batch": 1, "family": "f", "label": "m", "is_training": 0.0})
    assert DEPTHWISE_TEMPORARY_FACTOR in regressor_inputs(data, device_calibration=True).columns
    assert DEPTHWISE_TEMPORARY_FACTOR not in regressor_inputs(data).columns  # no regressor sees it as a feature
    split = pd.DataFrame({"split": "s", "fold": 0, "row_id": data["row_id"], "set": ["train"] * 40 + ["test"] * 20})
    _, models, _ = fit_split(data, split, "peak_mem_mb", "memory_sim")
    fitted = next(iter(models.values()))
    assert np.isnan(fitted.coefficients("cpu").iloc[-1]) and fitted.row_coefficients(data)[0, -1] == 257.0
    _, models, _ = fit_split(data, split, "peak_mem_mb", "linear")
    assert DEPTHWISE_TEMPORARY_FACTOR not in next(iter(models.values())).feature_names_


def test_the_depthwise_temporary_is_one_factor_of_the_weight_bytes_on_this_cpu() -> None:
    """The premise of the measured term: oneDNN's backward-weights temporary of a channels-last depthwise
    convolution is the same multiple of its weight bytes for any channel count (40-256 here, as in ConvNeXt's
    stages), so one measurement per device prices every such layer."""
    small, large = measure_depthwise_temporary(1, channels=40), measure_depthwise_temporary(1)
    assert small["temporary_bytes"] > small["weight_bytes"] > 0
    assert small["factor"] == large["factor"] == large["temporary_bytes"] / large["weight_bytes"]
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX512", "AVX2"):  # the blocked layout pads each channel to SIMD width² floats (+1 row)
        width = 16 if capability == "AVX512" else 8
        assert large["factor"] == width * width + 1
    columns = hardware_calibration({"depthwise_temporary": large})
    assert columns[DEPTHWISE_TEMPORARY_FACTOR] == large["factor"]
    assert all(math.isnan(v) for c, v in columns.items() if c != DEPTHWISE_TEMPORARY_FACTOR)  # nothing else measured


def test_a_device_without_the_measurement_records_why_and_gets_no_number() -> None:
    missing = depthwise_temporary("cuda", 1)
    assert set(missing) == {"missing"} and "cuda" in missing["missing"]
    assert math.isnan(hardware_calibration({"depthwise_temporary": missing})[DEPTHWISE_TEMPORARY_FACTOR])
    assert math.isnan(hardware_calibration({})[DEPTHWISE_TEMPORARY_FACTOR])  # a record made before it existed


def test_coefficients_fitted_on_other_terms_are_refused(tmp_path: Path) -> None:
    X, y = sim_frame(60)
    doc = MemorySimRegressor().fit(X, y).to_document()
    doc["state"]["terms_"] = ["intercept", *doc["state"]["terms_"][1:]]  # a file of a version with a constant
    older = MemorySimRegressor.from_document(doc, "old.json")
    with pytest.raises(InputError, match="memory_sim fitted on terms intercept, .*refit"):
        older.predict(X)
    del doc["state"]["terms_"]
    with pytest.raises(InputError, match="old.json: 'memory_sim' regressor without fitted terms_"):
        MemorySimRegressor.from_document(doc, "old.json")


def test_regressor_gives_no_prediction_without_simulated_features() -> None:
    X, y = sim_frame(60)
    X.loc[0, "sim_heap_peak_bytes"] = math.nan  # a model the simulation failed on: left out of the fit
    reg = MemorySimRegressor().fit(X, y)
    assert reg.n_unusable_rows_ == 1
    assert np.isnan(reg.predict(X.iloc[:1]))[0] and np.isfinite(reg.predict(X.iloc[1:])).all()
    with pytest.raises(InputError, match="missing memory_sim column"):
        reg.predict(X.drop(columns="sim_op_kinds"))
    with pytest.raises(InputError, match="training rows with simulated features"):
        MemorySimRegressor().fit(X.iloc[:3], y[:3])
    with pytest.raises(InputError, match="log_target must be false"):
        MemorySimRegressor(log_target=True).fit(X, y)


def test_memory_sim_predicts_peak_memory_only() -> None:
    assert unsupported_reason("memory_sim", "peak_mem_mb") is None
    assert "peak memory" in unsupported_reason("memory_sim", "latency_ms")


# --------------------------------------------------------------------------- memory_sim blended with poly_lasso


def blend_frame(n: int, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """:func:`sim_frame`'s rows at batches 2-16, the label a little off memory_sim's model (so that the two members
    differ), and each device's measured depthwise factor."""
    X, y = sim_frame(n, seed)
    rng = np.random.default_rng(seed + 10)
    X["batch"] = rng.choice([2, 4, 8, 16], n).astype(float)
    X[DEPTHWISE_TEMPORARY_FACTOR] = np.where(X["device"] == "cpu", COEF["cpu"][-1], np.nan)
    return X, y * (1 + 0.05 * np.sin(np.arange(n)))


def test_memory_blend_is_the_geometric_mean_within_the_fitted_batches_and_memory_sim_outside(tmp_path: Path) -> None:
    X, y = blend_frame(120)
    blend = make_regressor("memory_blend").fit(X, y)
    sim = MemorySimRegressor().fit(X, y)
    poly = make_regressor("poly_lasso").fit(X.drop(columns=DEPTHWISE_TEMPORARY_FACTOR), y)
    assert DEPTHWISE_TEMPORARY_FACTOR not in blend.members_[1].feature_names_  # poly_lasso as on its own
    new, _ = blend_frame(8, seed=1)
    new["batch"] = [2, 16, 8, 4, 1, 32, 8, 8]  # 1 and 32 lie outside the fitted batches 2-16
    new.loc[6, "device"], new.loc[7, "mode"] = "npu", "serving"  # a device and a mode never fitted
    inside = np.array([True, True, True, True, False, False, False, False])
    np.testing.assert_array_equal(blend.inside_fitted_batches(new), inside)
    np.testing.assert_array_equal(blend.member_predictions(new), np.column_stack([sim.predict(new),
                                                                                 poly.predict(new)]))
    pred = blend.predict(new)
    np.testing.assert_allclose(pred[inside], np.sqrt(sim.predict(new) * poly.predict(new))[inside], rtol=1e-12)
    np.testing.assert_allclose(pred[~inside], sim.predict(new)[~inside], rtol=1e-14)  # exp(log(p)): one ulp
    assert not np.allclose(pred[inside], sim.predict(new)[inside], rtol=1e-3)  # poly_lasso had its say there
    blend.save(tmp_path / "blend.json")
    loaded = load_regressor(tmp_path / "blend.json")
    assert loaded.batch_ranges_ == blend.batch_ranges_ == {"cpu|inference": [2.0, 16.0], "cpu|training": [2.0, 16.0],
                                                           "gpu|inference": [2.0, 16.0], "gpu|training": [2.0, 16.0]}
    np.testing.assert_array_equal(loaded.predict(new), pred)


def test_memory_blend_gives_no_number_where_memory_sim_gives_none_even_outside_the_batches() -> None:
    X, y = blend_frame(120)
    blend = make_regressor("memory_blend").fit(X, y)
    new, _ = blend_frame(4, seed=2)
    new["batch"] = [4, 64, 4, 64]
    new.loc[[0, 1], "sim_heap_peak_bytes"] = np.nan  # the simulation failed on this model
    pred = blend.predict(new)
    assert np.isnan(pred[:2]).all() and np.isfinite(pred[2:]).all()


def test_a_blend_refuses_within_batches_that_names_no_member() -> None:
    X, y = blend_frame(40)
    with pytest.raises(InputError, match="within_batches names \\['linear'\\], which are not among the members"):
        make_regressor("memory_blend", within_batches=("linear",)).fit(X, y)
    with pytest.raises(InputError, match="missing .*batch"):
        make_regressor("memory_blend").fit(X.drop(columns="batch"), y)


def test_the_fit_rule_fits_memory_blend_on_peak_memory_with_the_measured_factor() -> None:
    from perfzoo.fitting import OPERATOR_FEATURE_REGRESSORS, applies_device_calibration

    assert unsupported_reason("memory_blend", "peak_mem_mb") is None
    assert "peak memory" in unsupported_reason("memory_blend", "latency_ms")
    assert applies_device_calibration("memory_blend") and "memory_blend" not in OPERATOR_FEATURE_REGRESSORS
    X, y = blend_frame(60)
    data = X.assign(peak_mem_mb=y, row_id=[f"r{i}" for i in range(60)], model_id="m", family="f", label="m",
                    is_training=0.0)
    split = pd.DataFrame({"split": "s", "fold": 0, "row_id": data["row_id"], "set": ["train"] * 40 + ["test"] * 20})
    _, models, _ = fit_split(data, split, "peak_mem_mb", "memory_blend")
    sim = next(iter(models.values())).members_[0]
    assert sim.row_coefficients(data[data["device"] == "cpu"])[0, -1] == COEF["cpu"][-1]


def test_a_step_the_profiled_loss_cannot_take_leaves_the_columns_missing_with_the_reason() -> None:
    def backbone() -> nn.Module:  # no classifier head: cross-entropy against class targets does not apply
        return nn.Conv2d(3, 4, 3)

    feats, _ = featurise(backbone, (3, 8, 8), 2, "training", model_id="headless")
    assert all(math.isnan(feats[k]) for k in SIM_COLUMNS)
    assert feats["sim_error"].startswith("model headless: training step failed in the memory simulation")
    assert math.isfinite(feats["flops"])  # the other features are unaffected
