"""Attention on the meta device follows the CPU's choice of kernel (perfzoo.features.attention)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from perfzoo.features.attention import ATTENTION_FLOP_FORMULAS, cpu_attention
from perfzoo.features.memory import simulate_peak_memory

ATTENTION_OPS = ("attention", "softmax", "bmm")


class OpNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        if any(part in name for part in ATTENTION_OPS):
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def attention_ops(device: str, training: bool, dropout: float, mask: str) -> list[str]:
    """The attention operators one step of a multi-head attention block dispatches on ``device``."""
    torch.manual_seed(0)
    with torch.device(device):
        block = nn.MultiheadAttention(32, 4, dropout=dropout, batch_first=True)
        x = torch.randn(2, 6, 32)
        attn_mask = {"none": None, "bool": torch.ones(6, 6, dtype=torch.bool).triu(1),
                     "float": torch.zeros(6, 6)}[mask]
    block.train(training)
    # with gradients enabled, inference takes the module's general path on the CPU as well (its fused
    # inference fast path, `_native_multi_head_attention`, is not mirrored on the meta device)
    with OpNames() as seen, cpu_attention():
        out = block(x, x, x, need_weights=False, attn_mask=attn_mask)[0]
        if training:
            out.sum().backward()
    return seen.names


@pytest.mark.parametrize(("training", "dropout", "mask"), [
    (False, 0.0, "none"), (True, 0.0, "none"), (True, 0.1, "none"), (False, 0.0, "bool"), (True, 0.0, "float"),
])
def test_meta_step_runs_the_attention_kernels_the_cpu_runs(training: bool, dropout: float, mask: str) -> None:
    assert attention_ops("meta", training, dropout, mask) == attention_ops("cpu", training, dropout, mask)


def test_fused_attention_has_the_math_paths_forward_flops_and_saves_no_attention_matrix() -> None:
    with torch.device("meta"):
        q = torch.empty(8, 4, 256, 32, requires_grad=True)
    counts = {}
    for fused in (False, True):
        with (cpu_attention() if fused else torch.enable_grad()), FlopCounterMode(
                display=False, custom_mapping=ATTENTION_FLOP_FORMULAS) as counter:
            F.scaled_dot_product_attention(q, q, q)
        counts[fused] = counter.get_total_flops()
    assert counts[True] == counts[False] > 0

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = self.proj(x).view(8, 256, 4, 8).transpose(1, 2)
            return F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(8, 256, 32)

    with torch.device("meta"):
        model, x = Block(), torch.empty(8, 256, 32)
    peak = simulate_peak_memory(model, x, "training").activation_bytes
    with torch.device("meta"):
        model = Block()
    matrix = 8 * 4 * 256 * 256 * 4  # one attention matrix in float32: the math path keeps it for backward
    assert peak < matrix, f"{peak} bytes of activations at the peak: the attention matrix is held"


def test_unbatched_attention_runs_as_one_batch_as_on_the_cpu() -> None:
    def ops(device: str) -> list[tuple[str, tuple[int, ...]]]:
        q = torch.empty(6, 10, 16, device=device)
        with OpNames() as seen, cpu_attention():
            out = F.scaled_dot_product_attention(q, q, q)
        assert out.shape == q.shape
        return seen.names

    assert ops("meta") == ops("cpu") == ["_scaled_dot_product_flash_attention_for_cpu"]


def test_the_patch_is_undone_and_real_tensors_pass_through() -> None:
    original = F.scaled_dot_product_attention
    q = torch.randn(1, 2, 4, 8)
    with cpu_attention(), cpu_attention():
        assert F.scaled_dot_product_attention is not original
        torch.testing.assert_close(F.scaled_dot_product_attention(q, q, q), original(q, q, q))
    assert F.scaled_dot_product_attention is original


def _choice_on_full_cpu_tensors(query, key, value, mask, dropout: float, causal: bool) -> bool:  # type: ignore[no-untyped-def]
    """The CPU's backend choice on unwritten CPU tensors of exactly the meta tensors' shapes and strides."""
    def like(t):  # type: ignore[no-untyped-def]
        if t is None:
            return None
        cpu = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
        return cpu.requires_grad_(t.requires_grad and t.is_floating_point())

    choice = torch._fused_sdp_choice(like(query), like(key), like(value), like(mask), dropout, causal)
    return choice == torch.nn.attention.SDPBackend.FLASH_ATTENTION.value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("kv_batch", [4, 1])
@pytest.mark.parametrize("mask", ["none", "batch", "broadcast", "2d", "bool"])
@pytest.mark.parametrize("dropout, causal", [(0.0, False), (0.1, False), (0.0, True)])
def test_the_backend_choice_from_stand_ins_of_one_batch_element_is_the_full_batchs(
        dtype: torch.dtype, grad: bool, kv_batch: int, mask: str, dropout: float, causal: bool) -> None:
    from perfzoo.features.attention import cpu_picks_flash

    batch, heads, tokens, dim = 4, 2, 5, 8
    with torch.device("meta"):  # the query a view of a fused QKV projection, as timm's attention makes it
        qkv = torch.empty(batch, tokens, 3, heads, dim, dtype=dtype, requires_grad=grad)
        query = qkv.permute(2, 0, 3, 1, 4)[0]
        key = value = torch.empty(kv_batch, heads, tokens, dim, dtype=dtype)
        masks = {"none": None, "batch": torch.empty(batch, 1, tokens, tokens, dtype=dtype),
                 "broadcast": torch.empty(1, 1, tokens, tokens, dtype=dtype),
                 "2d": torch.empty(tokens, tokens, dtype=dtype), "bool": torch.empty(batch, 1, tokens, tokens,
                                                                                    dtype=torch.bool)}
    arguments = {"query": query, "key": key, "value": value, "attn_mask": masks[mask], "dropout_p": dropout,
                 "is_causal": causal, "scale": None, "enable_gqa": False}
    assert cpu_picks_flash(arguments) == _choice_on_full_cpu_tensors(query, key, value, masks[mask], dropout,
                                                                      causal)


def test_the_backend_choice_of_a_large_batch_allocates_no_full_size_stand_in() -> None:
    # a ViT at 518 px and batch 2,048: a stand-in of the whole batch would span 26 GB of CPU memory
    from perfzoo.features.attention import cpu_picks_flash

    with torch.device("meta"):
        qkv = torch.empty(2048, 1370, 3, 12, 64)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    arguments = {"query": query, "key": key, "value": value, "attn_mask": None, "dropout_p": 0.0,
                 "is_causal": False, "scale": None, "enable_gqa": False}
    assert cpu_picks_flash(arguments)


def test_the_backend_choice_is_seen_by_the_steps_recordings_as_the_cpus_own_call_without_stand_ins() -> None:
    class AllOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, str]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
            self.calls.append((func.overloadpacket.__name__, ",".join(sorted(devices))))
            return func(*args, **(kwargs or {}))

    with torch.device("meta"):
        query = key = value = torch.empty(2, 2, 5, 8)
        with cpu_attention(), AllOps() as recorded:
            F.scaled_dot_product_attention(query, key, value)
    names = [name for name, _ in recorded.calls]
    assert ("_fused_sdp_choice", "meta") in recorded.calls and "empty_strided" not in names
    assert all(device in ("meta", "") for _, device in recorded.calls)  # no CPU tensor in the step
