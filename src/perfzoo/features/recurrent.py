"""Recurrent layers on the meta device as the CPU runs them: oneDNN's fused layer for an LSTM where the CPU would
use it, the CPU's branch of the generic path for a GRU or an RNN.

``nn.LSTM`` calls ``torch._VF.lstm``. On a CPU tensor of float32 (PyTorch built with oneDNN, as the PyPI wheels
are) that runs one fused operator per layer and direction, ``aten.mkldnn_rnn_layer`` (and in training its
backward, ``aten.mkldnn_rnn_layer_backward``): the whole sequence in one call (``torch.profiler`` on the CPU:
``aten::lstm`` → 2 × ``aten::mkldnn_rnn_layer`` for two layers). On the meta device the same call takes
PyTorch's generic path instead: a matrix product and about ten element-wise operators per time step and layer,
several thousand calls for a sequence of a hundred steps, which the CPU never makes. :func:`cpu_recurrent` makes the
meta step follow the CPU: within it, ``_VF.lstm`` on meta float32 tensors (no projections, no packed sequence)
runs what ``at::native::mkldnn_rnn`` runs: the input made time-major and contiguous, ``mkldnn_rnn_layer`` per
layer and direction, the directions' outputs concatenated, dropout between layers in training, the final
states stacked. The operator trace files the fused operators under kind ``recurrent``, and
:data:`RECURRENT_FLOP_FORMULAS` gives ``FlopCounterMode`` their FLOPs (the gate products; the element-wise
gate arithmetic is not counted, as for any element-wise operator).

The memory simulation keeps the generic path for an LSTM (it steps under :func:`cpu_recurrent` with
``fused_lstm=False``): the fused layer's meta kernel returns its workspace empty, where the CPU keeps the gates of
every time step for the backward, and the generic path's gate tensors stand in for them. On
``examples/keyword_lstm.py``, fitted on a default run, the fused layer made ``memory_sim`` under-predict every
config (MAPE 32 % against 11 %; ``bench/RESULTS.md``, "LSTMs as the CPU runs them"). Holding the fused layer's
workspace and temporaries at the sizes oneDNN allocates makes the simulated tensor peak match PyTorch's CPU
allocator within 1-4 %, but the CPU label (the resident set) stays below it, as most of the workspace is never
touched in the forward pass, and ``memory_sim`` then over-predicts the LSTM more (``bench/RESULTS.md``, "An LSTM's
workspace: allocated is not resident"; not taken).

``nn.GRU`` and ``nn.RNN`` (``_VF.gru``, ``_VF.rnn_tanh``, ``_VF.rnn_relu``) run by PyTorch's generic path on the
CPU, but not by the same branch as on the meta device: ``FullLayer`` in ``aten/src/ATen/native/RNN.cpp`` computes
the input's gate products for the whole sequence in one ``linear`` when the input is on the CPU, and each time step
then adds its hidden product to its slice; on any other device (the meta device too) every step computes both
products. Within :func:`cpu_recurrent` these calls on meta tensors run :func:`_generic_rnn`, the CPU's branch
op for op (the whole sequence's input product, per step the cell with it precomputed, the outputs stacked, dropout
between layers in training), so that the operator trace counts one large product per layer instead of one per
step, and the memory simulation sees the sequence's input products live, as the CPU holds them
(``bench/RESULTS.md``, "GRUs as the CPU runs them").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import rnn

from perfzoo.features.attention import cpu_attention

RNN_LAYER = torch.ops.aten.mkldnn_rnn_layer
RNN_LAYER_BACKWARD = torch.ops.aten.mkldnn_rnn_layer_backward
_LSTM_MODE = 2
"""``ideep::rnn_kind::LSTM``, the ``mode`` argument of the fused layer."""


def _gate_flops(input_shape: Sequence[int], w_ih_shape: Sequence[int], w_hh_shape: Sequence[int]) -> int:
    """FLOPs of an LSTM layer's gate products over the sequence: 2 · steps · batch · 4H · (input + H)."""
    steps_and_batch = input_shape[0] * input_shape[1]
    return 2 * steps_and_batch * w_ih_shape[0] * (w_ih_shape[1] + w_hh_shape[1])


def _layer_flops(input_shape: Sequence[int], w_ih_shape: Sequence[int], w_hh_shape: Sequence[int], *args: Any,
                 out_shape: Any = None, **kwargs: Any) -> int:
    return _gate_flops(input_shape, w_ih_shape, w_hh_shape)


def _layer_backward_flops(input_shape: Sequence[int], w_ih_shape: Sequence[int], w_hh_shape: Sequence[int],
                          *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return 2 * _gate_flops(input_shape, w_ih_shape, w_hh_shape)  # gradients of the inputs and of the weights


RECURRENT_FLOP_FORMULAS = {RNN_LAYER: _layer_flops, RNN_LAYER_BACKWARD: _layer_backward_flops}
"""FLOP formulas of the CPU's fused LSTM layer and its backward, for ``FlopCounterMode(custom_mapping=...)``."""


def cpu_runs_fused_lstm(input: Any, hx: Any, params: Sequence[torch.Tensor], has_biases: bool) -> bool:
    """Whether the CPU would run ``_VF.lstm`` with these arguments by oneDNN's fused layer (meta tensors)."""
    if not (isinstance(input, torch.Tensor) and input.device.type == "meta" and input.dtype == torch.float32):
        return False
    if not (isinstance(hx, (tuple, list)) and len(hx) == 2 and hx[0].shape[-1] == hx[1].shape[-1]):
        return False  # a projection (proj_size) makes h smaller than c: the CPU's generic path
    if len(params) % (4 if has_biases else 2) or input.numel() == 0:
        return False
    return torch.backends.mkldnn.is_available() and bool(torch.backends.mkldnn.enabled)


def _fused_lstm(input: torch.Tensor, hx: Sequence[torch.Tensor], params: Sequence[torch.Tensor], has_biases: bool,
                num_layers: int, dropout: float, train: bool, bidirectional: bool, batch_first: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What ``at::native::mkldnn_rnn`` runs for an LSTM, on meta tensors."""
    x = (input.transpose(0, 1) if batch_first else input).contiguous()
    h0, c0 = hx[0].contiguous(), hx[1].contiguous()
    directions = 2 if bidirectional else 1
    per_layer = 4 if has_biases else 2
    hidden = h0.shape[-1]
    hy, cy = [], []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            w = params[index * per_layer:(index + 1) * per_layer]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (torch.zeros(w[0].shape, dtype=w[0].dtype, device="meta"),
                                                          torch.zeros(w[1].shape, dtype=w[1].dtype, device="meta"))
            out, h, c, _ = RNN_LAYER(x, w[0], w[1], b_ih, b_hh, h0[index], c0[index], direction > 0, [], _LSTM_MODE,
                                     hidden, num_layers, has_biases, bidirectional, batch_first, train)
            outputs.append(out)
            hy.append(h)
            cy.append(c)
        x = outputs[0] if directions == 1 else torch.cat(outputs, -1)
        if dropout and train and layer < num_layers - 1:
            x = F.dropout(x, dropout, training=True)
    return (x.transpose(0, 1) if batch_first else x), torch.stack(hy, 0), torch.stack(cy, 0)


Cell = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
"""One time step of a cell with its input's gate products precomputed: ``(input gates, hidden, w_hh, b_hh)`` → the
next hidden state."""


def _gru_cell(input_gates: torch.Tensor, hidden: torch.Tensor, w_hh: torch.Tensor,
              b_hh: torch.Tensor | None) -> torch.Tensor:
    """``GRUCell`` of ``RNN.cpp`` with ``pre_compute_input`` (its in-place operators as there)."""
    ih = input_gates.unsafe_chunk(3, 1)
    hh = F.linear(hidden, w_hh, b_hh).unsafe_chunk(3, 1)
    reset = hh[0].add_(ih[0]).sigmoid_()
    update = hh[1].add_(ih[1]).sigmoid_()
    new = ih[2].add(hh[2].mul_(reset)).tanh_()
    return (hidden - new).mul_(update).add_(new)


def _simple_cell(nonlinearity: Callable[[torch.Tensor], torch.Tensor]) -> Cell:
    """``SimpleCell`` of ``RNN.cpp`` (``nn.RNN``) with ``pre_compute_input``."""
    def cell(input_gates: torch.Tensor, hidden: torch.Tensor, w_hh: torch.Tensor,
             b_hh: torch.Tensor | None) -> torch.Tensor:
        return nonlinearity(F.linear(hidden, w_hh, b_hh).add_(input_gates))
    return cell


GENERIC_CELLS: dict[str, Cell] = {"gru": _gru_cell, "rnn_tanh": _simple_cell(torch.tanh),
                                  "rnn_relu": _simple_cell(torch.relu)}
"""The ``_VF`` calls :func:`cpu_recurrent` runs by :func:`_generic_rnn` on meta tensors, and their cells."""

Weights = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"]
"""``(w_ih, w_hh, b_ih, b_hh)`` of one layer and direction (no biases: None)."""


def _steps(cell: Cell, steps: Sequence[torch.Tensor], hidden: torch.Tensor, weights: Weights
           ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``FullLayer``'s loop over precomputed input products: every step's output (its hidden state), the last."""
    outputs = []
    for step in steps:
        hidden = cell(step, hidden, weights[1], weights[3])
        outputs.append(hidden)
    return outputs, hidden


def _layer(cell: Cell, x: torch.Tensor, hidden: Sequence[torch.Tensor], weights: Sequence[Weights]
           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``FullLayer`` (one direction) or ``FullBidirectionalLayer`` on a CPU input: (output, final hidden states)."""
    input_w = F.linear(x, weights[0][0], weights[0][2])
    steps = input_w.unbind(0)
    outputs, forward_hidden = _steps(cell, steps, hidden[0], weights[0])
    forward = torch.stack(outputs, 0)
    if len(weights) == 1:
        return forward, [forward_hidden]
    input_w = F.linear(x, weights[1][0], weights[1][2])  # the forward products stay live until here, as in C++
    steps = input_w.unbind(0)
    outputs, backward_hidden = _steps(cell, steps[::-1], hidden[1], weights[1])
    backward = torch.stack(outputs[::-1], 0)
    return torch.cat([forward, backward], forward.dim() - 1), [forward_hidden, backward_hidden]


def _generic_rnn(cell: Cell, input: torch.Tensor, hx: torch.Tensor, params: Sequence[torch.Tensor],
                 has_biases: bool, num_layers: int, dropout: float, train: bool, bidirectional: bool,
                 batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``at::native``'s ``gru``/``rnn_tanh``/``rnn_relu`` runs on a CPU tensor, on meta tensors."""
    x = input.transpose(0, 1) if batch_first else input
    hiddens = hx.unbind(0)
    directions = 2 if bidirectional else 1
    per_layer = 4 if has_biases else 2
    finals: list[torch.Tensor] = []
    for layer in range(num_layers):
        first = layer * directions
        weights = [tuple(params[i * per_layer:(i + 1) * per_layer]) + ((None, None) if not has_biases else ())
                   for i in range(first, first + directions)]
        x, final = _layer(cell, x, hiddens[first:first + directions], weights)  # type: ignore[arg-type]
        finals += final
        if dropout and train and layer < num_layers - 1:
            x = F.dropout(x, dropout, training=True)
    return (x.transpose(0, 1) if batch_first else x), torch.stack(finals, 0)


def _cpu_runs_generic_rnn(args: tuple, kwargs: dict) -> bool:
    """Whether a ``_VF.gru``/``rnn_*`` call is an unpacked one on meta tensors, which the CPU would run by
    :func:`_generic_rnn` (a packed sequence passes its batch sizes second and its hidden state third)."""
    return (len(args) == 9 and not kwargs and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta"
            and args[0].numel() > 0 and isinstance(args[1], torch.Tensor) and isinstance(args[2], (list, tuple)))


class _VFAsOnCPU:
    """``torch._VF`` with ``lstm`` following the CPU's fused layer on meta tensors (if ``fused_lstm``) and ``gru``,
    ``rnn_tanh`` and ``rnn_relu`` the CPU's branch of the generic path; every other name as is."""

    def __init__(self, vf: Any, fused_lstm: bool) -> None:
        self._vf = vf
        self.fused_lstm = fused_lstm

    def __getattr__(self, name: str) -> Any:
        if name in GENERIC_CELLS:
            return self._generic(name)
        return getattr(self._vf, name)

    def _generic(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if _cpu_runs_generic_rnn(args, kwargs):
                return _generic_rnn(GENERIC_CELLS[name], *args)
            return getattr(self._vf, name)(*args, **kwargs)  # packed sequences, other devices
        return call

    def lstm(self, *args: Any, **kwargs: Any) -> Any:
        if (self.fused_lstm and len(args) == 9 and not kwargs
                and cpu_runs_fused_lstm(args[0], args[1], args[2], bool(args[3]))):
            return _fused_lstm(*args)
        return self._vf.lstm(*args, **kwargs)  # packed sequences, projections, other dtypes and devices


@contextlib.contextmanager
def cpu_recurrent(fused_lstm: bool = True) -> Iterator[None]:
    """Within this context, recurrent layers on meta tensors run as on the CPU: ``nn.GRU`` and ``nn.RNN`` by the
    CPU's branch of the generic path, ``nn.LSTM`` by the fused layer where the CPU would use it (``fused_lstm``;
    else by the generic path as on the meta device).

    ``torch.nn.modules.rnn._VF``, which the modules' ``forward`` looks up when it calls, is replaced for the
    duration (and restored after). Nested use keeps the outermost.
    """
    original = rnn._VF
    if isinstance(original, _VFAsOnCPU):
        yield
        return
    rnn._VF = _VFAsOnCPU(original, fused_lstm)
    try:
        yield
    finally:
        rnn._VF = original



def has_lstm(model: nn.Module) -> bool:
    """Whether ``model`` holds an ``nn.LSTM``, whose fused layer :func:`cpu_recurrent` runs only for the trace."""
    return any(isinstance(module, nn.LSTM) for module in model.modules())


@contextlib.contextmanager
def cpu_kernels() -> Iterator[None]:
    """Attention (:func:`perfzoo.features.attention.cpu_attention`) and recurrent layers (:func:`cpu_recurrent`) on
    the meta device as the CPU runs them: what the operator trace and the FLOP count step under."""
    with cpu_attention(), cpu_recurrent():
        yield
