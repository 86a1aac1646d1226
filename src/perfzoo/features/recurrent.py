"""LSTMs on the meta device as the CPU runs them: oneDNN's fused layer where the CPU would use it.

``nn.LSTM`` calls ``torch._VF.lstm``. On a CPU tensor of float32 (PyTorch built with oneDNN, as the PyPI wheels
are) that runs one fused operator per layer and direction, ``aten.mkldnn_rnn_layer`` (and in training its
backward, ``aten.mkldnn_rnn_layer_backward``): the whole sequence in one call (``torch.profiler`` on the CPU:
``aten::lstm`` → 2 × ``aten::mkldnn_rnn_layer`` for two layers). On the meta device the same call takes
PyTorch's generic path instead: a matrix product and about ten element-wise operators per time step and layer,
several thousand calls for a sequence of a hundred steps, which the CPU never makes. :func:`cpu_lstm` makes the
meta step follow the CPU: within it, ``_VF.lstm`` on meta float32 tensors (no projections, no packed sequence)
runs what ``at::native::mkldnn_rnn`` runs: the input made time-major and contiguous, ``mkldnn_rnn_layer`` per
layer and direction, the directions' outputs concatenated, dropout between layers in training, the final
states stacked. The operator trace files the fused operators under kind ``recurrent``, and
:data:`RECURRENT_FLOP_FORMULAS` gives ``FlopCounterMode`` their FLOPs (the gate products; the element-wise
gate arithmetic is not counted, as for any element-wise operator).

The memory simulation keeps the generic path (it steps under :func:`perfzoo.features.attention.cpu_attention`
alone): the fused layer's meta kernel returns its workspace empty, where the CPU keeps the gates of every time
step for the backward, and the generic path's gate tensors stand in for them. On ``examples/keyword_lstm.py``,
fitted on a default run, the fused layer made ``memory_sim`` under-predict every config (MAPE 32 % against
11 %; ``bench/RESULTS.md``, "LSTMs as the CPU runs them"). ``nn.GRU`` and ``nn.RNN`` run by the generic path
on the CPU too, as on the meta device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
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


class _VFAsOnCPU:
    """``torch._VF`` with ``lstm`` following the CPU's fused layer on meta tensors; every other name as is."""

    def __init__(self, vf: Any) -> None:
        self._vf = vf

    def __getattr__(self, name: str) -> Any:
        return getattr(self._vf, name)

    def lstm(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 9 and not kwargs and cpu_runs_fused_lstm(args[0], args[1], args[2], bool(args[3])):
            return _fused_lstm(*args)
        return self._vf.lstm(*args, **kwargs)  # packed sequences, projections, other dtypes and devices


@contextlib.contextmanager
def cpu_lstm() -> Iterator[None]:
    """Within this context, ``nn.LSTM`` on meta tensors runs the CPU's fused layer where the CPU would.

    ``torch.nn.modules.rnn._VF``, which ``nn.LSTM.forward`` looks up when it calls, is replaced for the
    duration (and restored after). Nested use is harmless.
    """
    original = rnn._VF
    if isinstance(original, _VFAsOnCPU):
        yield
        return
    rnn._VF = _VFAsOnCPU(original)
    try:
        yield
    finally:
        rnn._VF = original



def has_lstm(model: nn.Module) -> bool:
    """Whether ``model`` holds an ``nn.LSTM``, whose step :func:`cpu_lstm` changes."""
    return any(isinstance(module, nn.LSTM) for module in model.modules())


@contextlib.contextmanager
def cpu_kernels() -> Iterator[None]:
    """Attention (:func:`perfzoo.features.attention.cpu_attention`) and LSTMs (:func:`cpu_lstm`) on the meta
    device as the CPU runs them: what the operator trace and the FLOP count step under."""
    with cpu_attention(), cpu_lstm():
        yield
