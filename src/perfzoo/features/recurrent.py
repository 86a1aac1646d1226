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

The memory simulation runs the fused layer too (it steps under :func:`cpu_recurrent` with its ``allocate``), but
the fused layer's meta kernel returns its workspace empty, where the CPU keeps the gates and states of every time
step for the backward, and allocates temporaries inside the call: :class:`_SizedFusedLayer` holds those bytes as the
CPU does (the workspace from the forward of a training step to the layer's backward; none in ``eval()``, as
PyTorch passes ``train=False``; the temporaries within each call), sized by oneDNN's layout
(:func:`fused_workspace_bytes`, :func:`fused_temporary_bytes`). The simulated tensor peak of an LSTM step is then
within 4 % of PyTorch's CPU allocator peak from batch 8 up (20 % at batch 1, where the weights' reorders dominate;
``bench/lstm_memory.py``), where the generic path's gate tensors, which stood in for them before, were 2.2-2.5
times too low.

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


Allocate = Callable[[int], torch.Tensor]
"""Hands out ``n`` bytes the memory simulation counts for as long as the returned tensor lives (and no operator)."""

PAGE_BYTES = 4096
"""oneDNN starts every part of an RNN workspace on a page."""


def _good_ld(dim: int) -> int:
    """oneDNN's leading dimension for ``dim`` floats (``get_good_ld``): 64-byte aligned, never a multiple of 256."""
    ld = -(-dim // 16) * 16
    return ld + 16 if ld % 256 == 0 else ld


def _pages(nbytes: int) -> int:
    return -(-nbytes // PAGE_BYTES) * PAGE_BYTES


def fused_workspace_bytes(steps: int, batch: int, inputs: int, hidden: int) -> int:
    """Bytes of the workspace oneDNN's float32 LSTM layer returns (and keeps for the backward): the gates of every
    step, five per-step hidden-sized parts, and six state parts over ``steps + 1`` (forward and gradient states of
    the layer, the iteration and the cell), each page-aligned. Fitted to the workspace the CPU's
    ``mkldnn_rnn_layer`` returns (within 3 % from 16 × 4 × 32 × 64 to 98 × 32 × 40 × 128, T × B × I × H;
    ``tests/test_recurrent.py`` checks both functions against the operator)."""
    return (_pages(4 * steps * batch * _good_ld(4 * hidden)) + 5 * _pages(4 * steps * batch * hidden)
            + 6 * _pages(4 * (steps + 1) * batch * _good_ld(max(inputs, hidden))))


def fused_temporary_bytes(steps: int, batch: int, inputs: int, hidden: int, backward: bool) -> int:
    """Bytes the fused layer (``backward``: its backward) allocates and frees within the call: the gates of every
    step in oneDNN's layout and the weights reordered (the backward also a per-step hidden part and the weights'
    gradients). Fitted as :func:`fused_workspace_bytes`: the forward within 11 %, the backward within 20 % from
    batch 8 (30-37 % too high at batch 1 or at 16 × 4 × 32 × 64, where the weights dominate)."""
    gates, weights = 4 * steps * batch * _good_ld(4 * hidden), 4 * 4 * hidden * (inputs + hidden)
    return gates + (4 * steps * batch * hidden + 2 * weights if backward else weights)


class _SizedFusedLayer(torch.autograd.Function):
    """``mkldnn_rnn_layer`` on meta tensors holding the bytes the CPU's call holds: its workspace (the meta kernel
    returns it empty) for as long as the backward needs it, and its temporaries within the call and its backward.
    Saves what the operator's own autograd formula saves, so the tensors live as long."""

    @staticmethod
    def forward(ctx: Any, allocate: Allocate, x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
                b_ih: torch.Tensor, b_hh: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, reverse: bool,
                options: tuple[int, int, bool, bool, bool, bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden, num_layers, has_biases, bidirectional, batch_first, train = options
        out, hy, cy, workspace = RNN_LAYER(x, w_ih, w_hh, b_ih, b_hh, h0, c0, reverse, [], _LSTM_MODE, hidden,
                                           num_layers, has_biases, bidirectional, batch_first, train)
        shape = (x.shape[0], x.shape[1], x.shape[2], hidden)
        sized = allocate(fused_workspace_bytes(*shape)) if train else None  # eval(): no workspace
        allocate(fused_temporary_bytes(*shape, backward=False))  # freed at once, after the peak it makes
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, w_ih, w_hh, b_ih, b_hh, h0, c0, out, hy, cy, workspace, sized)
        ctx.allocate, ctx.reverse, ctx.options, ctx.shape = allocate, reverse, options, shape
        return out, hy, cy

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor | None, d_hy: torch.Tensor | None,
                 d_cy: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        x, w_ih, w_hh, b_ih, b_hh, h0, c0, out, hy, cy, workspace, _ = ctx.saved_tensors
        hidden, num_layers, has_biases, bidirectional, batch_first, train = ctx.options
        grads = RNN_LAYER_BACKWARD(x, w_ih, w_hh, b_ih, b_hh, h0, c0, out, hy, cy, d_out, d_hy, d_cy, ctx.reverse,
                                   _LSTM_MODE, hidden, num_layers, has_biases, train, bidirectional, [],
                                   batch_first, workspace)
        ctx.allocate(fused_temporary_bytes(*ctx.shape, backward=True))
        return (None, *grads, None, None)


def _fused_lstm(input: torch.Tensor, hx: Sequence[torch.Tensor], params: Sequence[torch.Tensor], has_biases: bool,
                num_layers: int, dropout: float, train: bool, bidirectional: bool, batch_first: bool,
                allocate: Allocate | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What ``at::native::mkldnn_rnn`` runs for an LSTM, on meta tensors (with ``allocate``: holding the bytes the
    CPU's fused layers hold, :class:`_SizedFusedLayer`)."""
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
            if allocate is None:
                out, h, c, _ = RNN_LAYER(x, w[0], w[1], b_ih, b_hh, h0[index], c0[index], direction > 0, [],
                                         _LSTM_MODE, hidden, num_layers, has_biases, bidirectional, batch_first, train)
            else:
                out, h, c = _SizedFusedLayer.apply(allocate, x, w[0], w[1], b_ih, b_hh, h0[index], c0[index],
                                                   direction > 0, (hidden, num_layers, has_biases, bidirectional,
                                                                   batch_first, train))
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
    """``torch._VF`` with ``lstm`` following the CPU's fused layer on meta tensors (holding its bytes through
    ``allocate`` where given) and ``gru``, ``rnn_tanh`` and ``rnn_relu`` the CPU's branch of the generic path; every
    other name as is."""

    def __init__(self, vf: Any, allocate: Allocate | None) -> None:
        self._vf = vf
        self.allocate = allocate

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
        if len(args) == 9 and not kwargs and cpu_runs_fused_lstm(args[0], args[1], args[2], bool(args[3])):
            return _fused_lstm(*args, allocate=self.allocate)
        return self._vf.lstm(*args, **kwargs)  # packed sequences, projections, other dtypes and devices


@contextlib.contextmanager
def cpu_recurrent(allocate: Allocate | None = None) -> Iterator[None]:
    """Within this context, recurrent layers on meta tensors run as on the CPU: ``nn.GRU`` and ``nn.RNN`` by the
    CPU's branch of the generic path, ``nn.LSTM`` by the fused layer where the CPU would use it (with ``allocate``,
    the memory simulation's, holding the bytes the CPU's fused layer holds beyond its outputs).

    ``torch.nn.modules.rnn._VF``, which the modules' ``forward`` looks up when it calls, is replaced for the
    duration (and restored after). Nested use keeps the outermost.
    """
    original = rnn._VF
    if isinstance(original, _VFAsOnCPU):
        yield
        return
    rnn._VF = _VFAsOnCPU(original, allocate)
    try:
        yield
    finally:
        rnn._VF = original



@contextlib.contextmanager
def cpu_kernels() -> Iterator[None]:
    """Attention (:func:`perfzoo.features.attention.cpu_attention`) and recurrent layers (:func:`cpu_recurrent`) on
    the meta device as the CPU runs them: what the operator trace and the FLOP count step under."""
    with cpu_attention(), cpu_recurrent():
        yield
