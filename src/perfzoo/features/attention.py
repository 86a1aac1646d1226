"""Attention on the meta device as the CPU runs it: the fused kernel where the CPU would pick it.

On the meta device ``F.scaled_dot_product_attention`` always takes PyTorch's math path (two batched matrix
products around a softmax, the full attention matrix materialised and, in training, saved for backward),
because its backend choice (``torch._fused_sdp_choice``) answers "math" for meta tensors. The CPU picks its
fused flash-attention kernel whenever it can (no dropout in training, 4-D inputs, ...), which never holds the
attention matrix. :func:`cpu_attention` makes the meta step follow the CPU's choice: it asks the CPU's choice
function about CPU stand-ins of the same shapes, dtypes and ``requires_grad`` (allocated, never written, so
their pages are never touched) and, where that is flash, calls the fused operator
``aten._scaled_dot_product_flash_attention_for_cpu`` on the meta tensors (its meta kernel gives the output
and the log-sum-exp it saves for backward). The operator trace then files the step's attention under kind
``attention`` as the CPU's measured per-operator times do, and the memory simulation sees the fused kernel's
tensors. :data:`ATTENTION_FLOP_FORMULAS` gives ``FlopCounterMode`` the FLOPs of the fused operator and its
backward (PyTorch's own SDPA formulas), which it has no entry for.

GPUs choose among their own fused kernels (flash, memory-efficient, cuDNN) by other rules; the CPU's choice
stands in for them on the meta device (they differ for dropout in training, which CUDA's flash kernel
supports). ``enable_gqa`` and any call that is not on the meta device pass through unchanged. Not mirrored:
the inference fast paths of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``
(``aten._native_multi_head_attention``, ``aten._transformer_encoder_layer_fwd``), which the CPU takes under
``no_grad`` and the meta device never does; their general path is traced instead. The CPU's fused encoder layer
runs the math attention (a materialised score matrix, ``bmm`` and ``_softmax``), not the flash kernel, and its
feed-forward product with the activation fused (``_addmm_activation``); the per-operator timer sees the whole
layer as one call of kind ``other`` (``bench/RESULTS.md``, the section on ``memory_sim``'s activation high-water
mark, its paragraph on the encoder). Mirrored on the meta device, the fused layer did not make the fits better
(``bench/encoder_fast_path.py``; ``bench/RESULTS.md``, "The encoder's fused inference layer mirrored").
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

FLASH_FOR_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
FLASH_FOR_CPU_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _flash_flops(query_shape: torch.Size, key_shape: torch.Size, value_shape: torch.Size, *args: Any,
                 out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _flash_backward_flops(grad_out_shape: torch.Size, query_shape: torch.Size, key_shape: torch.Size,
                          value_shape: torch.Size, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


ATTENTION_FLOP_FORMULAS = {FLASH_FOR_CPU: _flash_flops, FLASH_FOR_CPU_BACKWARD: _flash_backward_flops}
"""FLOP formulas of the CPU's fused attention operators, for ``FlopCounterMode(custom_mapping=...)``."""


def _stand_in(tensor: torch.Tensor | None, batch_of_one: bool = False) -> torch.Tensor | None:
    """An unwritten CPU tensor like ``tensor`` (shape, dtype, strides, requires_grad) for the backend choice;
    with ``batch_of_one``, of size 1 in its first dimension."""
    if tensor is None:
        return None
    shape = (1, *tensor.shape[1:]) if batch_of_one else tensor.shape
    stand_in = torch.empty_strided(shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
    return stand_in.requires_grad_(tensor.requires_grad and tensor.is_floating_point())


def _stand_ins(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """CPU stand-ins of the attention's tensors, of one batch element where the query, key and value share their
    batch (and the mask, where it has the query's dimensions and batch). The backend choice reads whether the
    batches agree, not how large they are, and a stand-in allocates the span of its strides: a query viewed
    out of a ViT's fused QKV projection at 518 px and batch 2,048 spans 26 GB."""
    batch = query.shape[0]
    shared = key.shape[0] == value.shape[0] == batch
    mask_shared = shared and mask is not None and mask.dim() == query.dim() and mask.shape[0] == batch
    return (_stand_in(query, shared), _stand_in(key, shared), _stand_in(value, shared),
            _stand_in(mask, mask_shared))


def _sdpa_arguments(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None, enable_gqa: bool = False) -> dict[str, Any]:
    return {"query": query, "key": key, "value": value, "attn_mask": attn_mask, "dropout_p": dropout_p,
            "is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}


def cpu_picks_flash(arguments: dict[str, Any]) -> bool:
    """Whether the CPU runs ``F.scaled_dot_product_attention`` with these arguments by its flash kernel."""
    tensors = [arguments[name] for name in ("query", "key", "value", "attn_mask")]
    if arguments["enable_gqa"] or any(t is not None and t.device.type != "meta" for t in tensors):
        return False
    if not tensors[0].dim() == tensors[1].dim() == tensors[2].dim() in (3, 4):
        return False  # the fused kernel takes 4-D inputs, or 3-D ones as one batch of heads
    with _disable_current_modes():  # the stand-ins are this module's, not the step's: no recording sees them
        query, key, value, mask = _stand_ins(*tensors)
        choice = torch._fused_sdp_choice(query, key, value, mask, arguments["dropout_p"], arguments["is_causal"],
                                         scale=arguments["scale"])
    # the CPU's own call of the choice, as the step's recordings (operator trace, memory) see it: on its tensors
    torch._fused_sdp_choice(*tensors, arguments["dropout_p"], arguments["is_causal"], scale=arguments["scale"])
    return choice == torch.nn.attention.SDPBackend.FLASH_ATTENTION.value


def _float_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the additive float mask the fused kernel takes (as ``scaled_dot_product_attention``
    converts it); on the meta device only its metadata matters."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device)


def _attention_as_on_cpu(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``scaled_dot_product_attention`` that runs the CPU's flash kernel on meta tensors where the CPU would."""
    @functools.wraps(original)
    def attention(*args: Any, **kwargs: Any) -> torch.Tensor:
        arguments = _sdpa_arguments(*args, **kwargs)
        if not cpu_picks_flash(arguments):
            return original(*args, **kwargs)
        query, key, value = (arguments[name] for name in ("query", "key", "value"))
        unbatched = query.dim() == 3  # the CPU runs 3-D inputs as one batch of heads, as here
        if unbatched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
        output, _ = FLASH_FOR_CPU(query, key, value, arguments["dropout_p"], arguments["is_causal"],
                                  attn_mask=_float_mask(arguments["attn_mask"], query.dtype), scale=arguments["scale"])
        return output.squeeze(0) if unbatched else output

    return attention


@contextlib.contextmanager
def cpu_attention() -> Iterator[None]:
    """Within this context, scaled-dot-product attention on meta tensors follows the CPU's backend choice.

    ``torch.nn.functional.scaled_dot_product_attention`` is replaced for the duration (and restored after),
    which every caller that looks it up when it calls sees: ``nn.MultiheadAttention``, timm's attention
    blocks, :mod:`perfzoo.models.language`. A ``TorchFunctionMode`` cannot do it: it does not see the calls
    made inside a Python function it intercepts (``F.multi_head_attention_forward``). Nested use is harmless.
    """
    original = F.scaled_dot_product_attention
    if getattr(original, "_perfzoo_cpu_attention", False):
        yield
        return
    patched = _attention_as_on_cpu(original)
    patched._perfzoo_cpu_attention = True  # type: ignore[attr-defined]
    F.scaled_dot_product_attention = patched
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
