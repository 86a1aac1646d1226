"""``nn.TransformerEncoderLayer``'s inference on the meta device as the CPU runs it, offline: not adopted.

    python bench/encoder_fast_path.py ops                          # the meta trace of one layer beside the CPU's
    python bench/encoder_fast_path.py eval RESULTS [RESULTS ...]   # the predictors on both traces of the encoder

In inference (eval mode, no gradient, no hooks on the layer, no mask, ...), ``nn.TransformerEncoderLayer.forward``
takes PyTorch's fast path on a CPU tensor: one call of ``aten._transformer_encoder_layer_fwd`` per layer. Its check
accepts the devices it lists ("cpu", "cuda", "xpu" and the private-use backend's name), not "meta", so perfzoo's
meta step takes the layer's general path (``nn.MultiheadAttention``'s projections, the flash kernel, separate
feed-forward products and activations), which the CPU does not run. What the fused call runs on the CPU
(``torch.profiler``, one thread): the query-key-value product (``mm``), ``_transform_bias_rescale_qkv``, the *math*
attention (``bmm`` to a ``B·H × L × L`` score matrix, ``_softmax`` into it, ``bmm`` into the query's part of the
buffer), a copy to put the heads back, ``addmm``, ``add_`` of the input, ``layer_norm``, ``_addmm_activation``
(the first feed-forward product with its ReLU or GELU), ``addmm``, ``add_``, ``layer_norm``.

This script mirrors it: within :func:`cpu_encoder_layers`, a layer whose input is on the meta device takes PyTorch's
own fast-path check with "meta" standing for the private-use backend's name (and without the
``torch.device("meta")`` contexts a step may run in, which the check takes for a tensor subclass), and the fused
call on meta tensors runs :func:`encoder_layer_as_on_cpu`, the operators above. A meta kernel of
``_transform_bias_rescale_qkv`` is registered (the three heads' tensors are views of one buffer, as on the CPU), a
FLOP formula of ``_addmm_activation`` added, both operators given kinds (matmul, elementwise), and an encoder layer
counted as an attention block. :func:`install` patches perfzoo's featuriser with all of it (this process only).

``ops`` prints the operators the mirrored meta step dispatches for one layer beside the children of the CPU's fused
call in ``torch.profiler``. ``eval`` featurises the first run's zoo manifest with the mirror, replaces the changed
configs' feature columns (the encoder's inference configs) in each run's dataset, and refits ``composed``,
``composed_blend``, ``memory_sim`` and ``memory_blend`` on every split of each run, both ways (MAPE %, ``select`` =
mean of family_monte_carlo and stratified_kfold).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from this_checkout import use_this_checkout

ROOT = use_this_checkout()

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.backend_registration as backend_registration  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._device import DeviceContext  # noqa: E402

ENCODER_LAYER = torch.ops.aten._transformer_encoder_layer_fwd
TRANSFORM_QKV = torch.ops.aten._transform_bias_rescale_qkv
ADDMM_ACTIVATION = torch.ops.aten._addmm_activation


def _addmm_activation_flops(bias_shape: torch.Size, mat1_shape: torch.Size, mat2_shape: torch.Size, *args: Any,
                            out_shape: Any = None, **kwargs: Any) -> int:
    """The product's FLOPs, as ``addmm``'s (the bias and the activation are not counted)."""
    rows, inner = mat1_shape
    return 2 * rows * inner * mat2_shape[1]


ENCODER_FLOP_FORMULAS = {ADDMM_ACTIVATION: _addmm_activation_flops}
"""FLOP formulas of the fused encoder layer's operators that ``FlopCounterMode`` has none of."""


def _transform_bias_rescale_qkv_meta(qkv: torch.Tensor, qkv_bias: torch.Tensor, num_heads: int
                                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CPU kernel's outputs on meta tensors: query, key and value ``(B, heads, L, E / heads)``, three parts
    of one new buffer."""
    batch, length, three_e = qkv.shape
    head_dim = three_e // 3 // num_heads
    buffer = qkv.new_empty((3 * batch, num_heads, length, head_dim))
    return buffer[:batch], buffer[batch:2 * batch], buffer[2 * batch:]


_LIBRARY: torch.library.Library | None = None
if not torch._C._dispatch_has_kernel_for_dispatch_key(TRANSFORM_QKV.default.name(), "Meta"):
    _LIBRARY = torch.library.Library("aten", "IMPL")  # kept: the registration lasts as long as the object
    _LIBRARY.impl("_transform_bias_rescale_qkv", _transform_bias_rescale_qkv_meta, "Meta")


def attention_as_on_cpu(x: torch.Tensor, num_heads: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                        proj_weight: torch.Tensor, proj_bias: torch.Tensor) -> torch.Tensor:
    """The fused layer's self-attention (``_native_multi_head_attention`` without a mask or weights returned) as
    the CPU's kernel runs it, operator for operator."""
    batch, length, embed = x.shape
    heads_batch, head_dim = batch * num_heads, embed // num_heads
    qkv = torch.ops.aten._unsafe_view(torch.mm(x.reshape(batch * length, embed), qkv_weight.t()),
                                      [batch, length, 3 * embed])
    query, key, value = TRANSFORM_QKV(qkv, qkv_bias, num_heads)
    del qkv  # freed here, as the kernel does
    scores = torch.bmm(query.view(heads_batch, length, head_dim),
                       key.view(heads_batch, length, head_dim).transpose(1, 2)).view(batch, num_heads, length, length)
    torch.ops.aten._softmax.out(scores, -1, False, out=scores)
    context = query.view(heads_batch, length, head_dim)  # the kernel writes the context into the query's part
    torch.bmm(scores.view(heads_batch, length, length), value.reshape(heads_batch, length, head_dim), out=context)
    del scores
    merged = context.view(batch, num_heads, length, head_dim).permute(0, 2, 1, 3).contiguous()
    projected = torch.addmm(proj_bias, merged.view(batch * length, embed), proj_weight.t())
    return projected.view(batch, length, embed)


def _feed_forward(x: torch.Tensor, weight_1: torch.Tensor, bias_1: torch.Tensor, weight_2: torch.Tensor,
                  bias_2: torch.Tensor, use_gelu: bool) -> torch.Tensor:
    batch, length, embed = x.shape
    hidden = ADDMM_ACTIVATION(bias_1, x.view(batch * length, embed), weight_1.t(), use_gelu=use_gelu)
    hidden = hidden.view(batch, length, -1)
    out = torch.addmm(bias_2, hidden.view(batch * length, hidden.shape[-1]), weight_2.t())
    return out.view(batch, length, -1)


def encoder_layer_as_on_cpu(src: torch.Tensor, embed_dim: int, num_heads: int, qkv_weight: torch.Tensor,
                            qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                            use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: torch.Tensor,
                            norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
                            ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor,
                            ffn_bias_2: torch.Tensor, mask: torch.Tensor | None = None,
                            mask_type: int | None = None) -> torch.Tensor:
    """``aten._transformer_encoder_layer_fwd`` (without a mask) as the CPU's kernel runs it, operator for
    operator (module docstring); the arguments are the fused operator's."""
    if mask is not None:
        raise ValueError("the fused encoder layer's masked attention is not mirrored on the meta device")

    def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = attention_as_on_cpu(x, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias)
    x.add_(src)
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    x = _feed_forward(x, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, use_gelu)
    x.add_(residual)
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


def _fused_call(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``torch._transformer_encoder_layer_fwd`` that runs :func:`encoder_layer_as_on_cpu` on meta tensors."""
    @functools.wraps(original)
    def fused(src: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if src.device.type != "meta":
            return original(src, *args, **kwargs)
        return encoder_layer_as_on_cpu(src, *args, **kwargs)

    return fused


@contextlib.contextmanager
def _meta_device_contexts_left() -> Iterator[None]:
    """Without the ``torch.device("meta")`` contexts the step may run in (restored after), where they are the only
    torch-function modes: the fast-path check takes any such mode for a tensor subclass's handler and refuses. The
    fused call's operators make every tensor from their meta arguments, so nothing needs the context."""
    modes = torch.overrides._get_current_function_mode_stack()
    if not modes or not all(isinstance(m, DeviceContext) and torch.device(m.device).type == "meta" for m in modes):
        yield
        return
    with contextlib.ExitStack() as stack:
        for _ in modes:
            stack.enter_context(torch.overrides._pop_mode_temporarily())
        yield


def _forward_as_on_cpu(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``TransformerEncoderLayer.forward`` whose fast-path check takes an unmasked meta input in inference as the
    CPU's."""
    @functools.wraps(original)
    def forward(self: nn.Module, src: torch.Tensor, src_mask: torch.Tensor | None = None,
                src_key_padding_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if src.device.type != "meta" or src_mask is not None or src_key_padding_mask is not None or self.training:
            return original(self, src, src_mask, src_key_padding_mask, is_causal)
        name = backend_registration._privateuse1_backend_name
        backend_registration._privateuse1_backend_name = "meta"
        try:
            with _meta_device_contexts_left():
                return original(self, src, src_mask, src_key_padding_mask, is_causal)
        finally:
            backend_registration._privateuse1_backend_name = name

    forward._perfzoo_cpu_encoder = True
    return forward


@contextlib.contextmanager
def cpu_encoder_layers() -> Iterator[None]:
    """Within this context, ``nn.TransformerEncoderLayer`` on meta tensors takes the fast path where the CPU would,
    and its fused call runs the CPU's operators (module docstring). Nested use is harmless."""
    layer = nn.TransformerEncoderLayer
    if getattr(layer.forward, "_perfzoo_cpu_encoder", False):
        yield
        return
    forward, fused = layer.forward, torch._transformer_encoder_layer_fwd
    layer.forward, torch._transformer_encoder_layer_fwd = _forward_as_on_cpu(forward), _fused_call(fused)
    try:
        yield
    finally:
        layer.forward, torch._transformer_encoder_layer_fwd = forward, fused


def _also(original: Callable[[], contextlib.AbstractContextManager[None]]
          ) -> Callable[[], contextlib.AbstractContextManager[None]]:
    @contextlib.contextmanager
    def both(*args: Any, **kwargs: Any) -> Iterator[None]:
        with original(*args, **kwargs), cpu_encoder_layers():
            yield

    return both


def install() -> None:
    """Patch perfzoo's featuriser (this process): the mirror in the operator trace, the FLOP count and the memory
    simulation, the two operators' kinds and FLOPs, an encoder layer as an attention block."""
    from perfzoo.features import attention, meta, ops

    meta.cpu_kernels = _also(meta.cpu_kernels)
    attention.cpu_attention = _also(attention.cpu_attention)  # simulate_peak_memory imports it when it runs
    meta.RECURRENT_FLOP_FORMULAS = {**meta.RECURRENT_FLOP_FORMULAS, **ENCODER_FLOP_FORMULAS}
    ops._KIND_NAMES["matmul"] = ops._KIND_NAMES["matmul"] | {"_addmm_activation"}
    ops._KIND_NAMES["elementwise"] = ops._KIND_NAMES["elementwise"] | {"_transform_bias_rescale_qkv"}
    ops.recorded_op_kind.cache_clear()
    counts_as_attention = meta._is_attention
    meta._is_attention = lambda module: counts_as_attention(module) or isinstance(module, nn.TransformerEncoderLayer)


def show_ops() -> None:
    from torch.profiler import ProfilerActivity, profile
    from torch.utils._python_dispatch import TorchDispatchMode

    class Dispatched(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            self.ops.append(func._overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    torch.set_num_threads(1)
    layer = nn.TransformerEncoderLayer(128, 4, 512, batch_first=True).eval()
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        layer(torch.randn(8, 128, 128))
    fused = [e for e in prof.events() if e.name == "aten::_transformer_encoder_layer_fwd"][0]
    children = []
    for child in sorted(fused.cpu_children, key=lambda e: e.time_range.start):
        inner = child.cpu_children if child.name == "aten::_native_multi_head_attention" else [child]
        children += [e.name.removeprefix("aten::") for e in sorted(inner, key=lambda e: e.time_range.start)]
    with torch.device("meta"):
        layer = nn.TransformerEncoderLayer(128, 4, 512, batch_first=True).eval()
    with torch.no_grad(), cpu_encoder_layers(), Dispatched() as dispatched:
        layer(torch.empty(8, 128, 128, device="meta"))
    print("CPU, children of the fused call:", " ".join(children))
    print("meta, dispatched by the mirror: ", " ".join(dispatched.ops))


KEY = ["model_id", "mode", "batch"]
METHODS = (("latency_ms", "composed", True), ("latency_ms", "composed_blend", False),
           ("peak_mem_mb", "memory_sim", False), ("peak_mem_mb", "memory_blend", False))


def evaluate(runs: list[Path]) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from composed_shrinkage import SELECTION_SPLITS, SPLITS, scores, with_module_calls

    from perfzoo.config import load_config
    from perfzoo.features.meta import featurise_manifest

    install()
    first = runs[0]
    config = load_config(first.parent / "config.yaml")
    mirrored, _ = featurise_manifest(pd.read_parquet(first / "zoo" / "manifest.parquet"),
                                     config["zoo"]["num_classes"], progress=False,
                                     optimizer=config["profiling"]["optimizer"])
    rows = {}
    for results in runs:
        data = with_module_calls(results, pd.read_parquet(results / "dataset" / "dataset.parquet"))
        columns = [c for c in mirrored.columns if c in data.columns and c not in KEY]
        both = data.drop(columns=columns).merge(mirrored[KEY + columns], on=KEY, how="left",
                                                validate="many_to_one")[data.columns]
        changed = both[columns].astype(str).ne(data[columns].astype(str)).any(axis=1)
        print(f"{results}: {int(changed.sum())} rows changed ("
              f"{', '.join(sorted(set(data.loc[changed, 'label'] + ' ' + data.loc[changed, 'mode'])))})")
        for trace, table in (("general path", data), ("fused path mirrored", both)):
            for target, regressor, op_times in METHODS:
                params = {"op_times_path": str(results / "features" / "op_times.parquet")} if op_times else {}
                metrics = scores(results, params, SPLITS, table, regressor=regressor, target=target)
                rows[(results.parent.name, regressor, trace)] = {
                    **metrics["mape"].to_dict(), "select": metrics.loc[list(SELECTION_SPLITS), "mape"].mean()}
    frame = pd.DataFrame(rows).T[[*SPLITS, "select"]]
    frame.index.names = ["run", "method", "encoder trace"]
    pd.set_option("display.width", 250)
    print(frame.round(2).to_string())
    print("\nmean over runs")
    print(frame.groupby(level=["method", "encoder trace"]).mean().round(2).to_string())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("ops", "eval"))
    parser.add_argument("results", type=Path, nargs="*", help="finished default runs' results/ folders (eval)")
    args = parser.parse_args()
    if args.what == "ops":
        show_ops()
    else:
        evaluate([r.resolve() for r in args.results])


if __name__ == "__main__":
    main()
