"""Language models built from their dimensions: decoder-only (causal) and encoder transformers.

A model is an :class:`LMConfig` (width, depth, heads, feed-forward size, vocabulary, positions, norm,
activation, positional encoding, tied embeddings, biases), taken from a named preset and overridden by
keyword arguments. The network is plain torch with random weights (nothing is downloaded): token and
(learned) position embeddings, pre-norm blocks of self-attention through
``torch.nn.functional.scaled_dot_product_attention`` (causal for decoders; rotary positions applied to
queries and keys when ``positional`` is ``rotary``) and a feed-forward block (GELU, ReLU or SwiGLU), a
final norm and a vocabulary head. Input: token ids of shape ``(batch, seq)``; output: logits of shape
``(batch, seq, vocab)``, next-token logits at every position for a decoder, token logits for an encoder.

Presets follow the published architectures; where they differ, the cost is the same to within a few
parameters per layer: BERT's post-norm blocks are built pre-norm with a final norm, its token-type
embeddings and MLM transform are left out, and OPT's two extra learned positions are not added.

torch is imported lazily: the Snakefile imports this module (through the builders) to check the config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from perfzoo.io import InputError, suggest

NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "relu", "swiglu")
POSITIONALS = ("learned", "rotary")
ROPE_BASE = 10000.0


@dataclass(frozen=True)
class LMConfig:
    """The dimensions and layout of one language model."""

    d_model: int
    layers: int
    heads: int
    ffn: int  # hidden width of the feed-forward block (of each of SwiGLU's two input projections)
    vocab: int
    max_positions: int  # longest sequence (the size of the learned position table)
    causal: bool = True  # decoder (causal self-attention) or encoder
    norm: str = "layernorm"  # one of NORMS
    activation: str = "gelu"  # one of ACTIVATIONS
    positional: str = "learned"  # one of POSITIONALS
    tied: bool = True  # the vocabulary head shares the token embedding's weight
    bias: bool = True  # biases in the attention and feed-forward projections


PRESETS: dict[str, LMConfig] = {
    # small generic bases, meant to be sized with kwargs
    "decoder": LMConfig(d_model=256, layers=4, heads=4, ffn=1024, vocab=32000, max_positions=2048),
    "encoder": LMConfig(d_model=256, layers=4, heads=4, ffn=1024, vocab=32000, max_positions=2048, causal=False),
    # Radford et al. 2019, GPT-2 small (HF config gpt2: n_embd 768, n_layer 12, n_head 12, n_ctx 1024)
    "gpt2": LMConfig(d_model=768, layers=12, heads=12, ffn=3072, vocab=50257, max_positions=1024),
    # Brown et al. 2020, Table 2.1 "GPT-3 XL": n_layers 24, d_model 2048, context 2048; the table's n_heads 24
    # and d_head 128 do not multiply to 2048, so 16 heads of 128 (heads change no parameter count)
    "gpt3-xl": LMConfig(d_model=2048, layers=24, heads=16, ffn=8192, vocab=50257, max_positions=2048),
    # Zhang et al. 2022, Table 1 (OPT-1.3B: 24 layers, 32 heads, d_model 2048), ReLU feed-forward
    "opt-1.3b": LMConfig(d_model=2048, layers=24, heads=32, ffn=8192, vocab=50272, max_positions=2048,
                         activation="relu"),
    # Devlin et al. 2019, BERT-large (L=24, H=1024, A=16), WordPiece vocabulary 30,522, 512 positions
    "bert-large": LMConfig(d_model=1024, layers=24, heads=16, ffn=4096, vocab=30522, max_positions=512,
                           causal=False),
    # Touvron et al. 2023, LLaMA 7B (dim 4096, 32 layers, 32 heads, SwiGLU hidden 11008, RMSNorm, rotary)
    "llama": LMConfig(d_model=4096, layers=32, heads=32, ffn=11008, vocab=32000, max_positions=4096,
                      norm="rmsnorm", activation="swiglu", positional="rotary", tied=False, bias=False),
}
FIELDS = tuple(f.name for f in dataclasses.fields(LMConfig))
_CHOICES = {"norm": NORMS, "activation": ACTIVATIONS, "positional": POSITIONALS}


def lm_config(name: str, overrides: dict[str, Any], where: str = "language_model") -> LMConfig:
    """The preset ``name`` with ``overrides`` applied; a bad name, key or value raises InputError naming it."""
    if name not in PRESETS:
        raise InputError(f"{where}: unknown language model preset {name!r}{suggest(name, list(PRESETS))}")
    for key, value in overrides.items():
        _check_field(key, value, where)
    config = dataclasses.replace(PRESETS[name], **overrides)
    if config.d_model % config.heads:
        raise InputError(f"{where}: d_model {config.d_model} is not a multiple of heads {config.heads}")
    if config.positional == "rotary" and (config.d_model // config.heads) % 2:
        raise InputError(f"{where}: rotary positions need an even head width, got {config.d_model // config.heads}")
    return config


def _check_field(key: str, value: Any, where: str) -> None:
    if key not in FIELDS:
        raise InputError(f"{where}.{key}: not a language model argument{suggest(key, list(FIELDS))}")
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            raise InputError(f"{where}.{key}: {value!r} is not one of {', '.join(_CHOICES[key])}")
    elif key in ("causal", "tied", "bias"):
        if not isinstance(value, bool):
            raise InputError(f"{where}.{key}: expected true or false, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}.{key}: expected a positive integer, got {value!r}")


def build_language_model(config: LMConfig) -> Any:
    """The ``nn.Module`` of ``config`` with random weights, on the current default device."""
    return _classes()["LanguageModel"](config)


def _classes() -> dict[str, type]:
    """The module classes, defined on first use so that importing this module does not import torch."""
    if not _CLASSES:
        _CLASSES.update(_define_classes())
    return _CLASSES


_CLASSES: dict[str, type] = {}


def _define_classes() -> dict[str, type]:  # noqa: C901 - one closure per class keeps torch lazy
    import torch  # lazy: seconds to import; the Snakefile imports this module to check the config
    import torch.nn.functional as F  # noqa: N812 - the usual name
    from torch import nn

    def norm(config: LMConfig) -> nn.Module:
        return nn.RMSNorm(config.d_model) if config.norm == "rmsnorm" else nn.LayerNorm(config.d_model)

    class RotaryEmbedding(nn.Module):
        """Rotary positions (Su et al. 2021) applied to queries and keys of shape (batch, heads, seq, head_dim)."""

        def __init__(self, head_dim: int) -> None:
            super().__init__()
            inv_freq = 1.0 / ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            positions = torch.arange(q.shape[-2], device=q.device, dtype=self.inv_freq.dtype)
            angles = torch.outer(positions, self.inv_freq)
            cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
            return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

        @staticmethod
        def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            even, odd = x[..., 0::2], x[..., 1::2]
            return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    class ScaledDotProductAttention(nn.Module):
        """softmax(Q K^T / sqrt(d)) V through ``scaled_dot_product_attention`` (a layer of its own, so its
        FLOPs appear in the per-layer table)."""

        def __init__(self, causal: bool) -> None:
            super().__init__()
            self.causal = causal

        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    class SelfAttention(nn.Module):
        """Multi-head self-attention: fused QKV projection, optional rotary positions, output projection."""

        def __init__(self, config: LMConfig) -> None:
            super().__init__()
            self.heads, self.head_dim = config.heads, config.d_model // config.heads
            self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
            self.rotary = RotaryEmbedding(config.d_model // config.heads) if config.positional == "rotary" else None
            self.core = ScaledDotProductAttention(config.causal)
            self.out = nn.Linear(config.d_model, config.d_model, bias=config.bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch, seq = x.shape[0], x.shape[1]  # not unpacked: torch.fx traces this forward
            q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
            if self.rotary is not None:
                q, k = self.rotary(q, k)
            return self.out(self.core(q, k, v).transpose(1, 2).reshape(batch, seq, -1))

    class FeedForward(nn.Module):
        """Two-layer MLP (GELU or ReLU), or SwiGLU: down(silu(gate(x)) * up(x))."""

        def __init__(self, config: LMConfig) -> None:
            super().__init__()
            self.gated = config.activation == "swiglu"
            self.up = nn.Linear(config.d_model, config.ffn, bias=config.bias)
            self.gate = nn.Linear(config.d_model, config.ffn, bias=config.bias) if self.gated else None
            self.act = {"gelu": nn.GELU, "relu": nn.ReLU, "swiglu": nn.SiLU}[config.activation]()
            self.down = nn.Linear(config.ffn, config.d_model, bias=config.bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.gate is not None:
                return self.down(self.act(self.gate(x)) * self.up(x))
            return self.down(self.act(self.up(x)))

    class Block(nn.Module):
        """Pre-norm transformer block: x + attention(norm(x)), then x + feed_forward(norm(x))."""

        def __init__(self, config: LMConfig) -> None:
            super().__init__()
            self.norm1, self.attention = norm(config), SelfAttention(config)
            self.norm2, self.feed_forward = norm(config), FeedForward(config)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attention(self.norm1(x))
            return x + self.feed_forward(self.norm2(x))

    class LanguageModel(nn.Module):
        """Token ids (batch, seq) -> logits (batch, seq, vocab); see :class:`LMConfig`."""

        def __init__(self, config: LMConfig) -> None:
            super().__init__()
            self.config = config
            self.embed = nn.Embedding(config.vocab, config.d_model)
            learned = config.positional == "learned"
            self.positions = nn.Embedding(config.max_positions, config.d_model) if learned else None
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
            self.norm = norm(config)
            self.head = nn.Linear(config.d_model, config.vocab, bias=False)
            if config.tied:
                self.head.weight = self.embed.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            seq = tokens.shape[1]
            torch._assert(seq <= self.config.max_positions,  # traceable by torch.fx, unlike an if
                          f"sequence longer than max_positions {self.config.max_positions}")
            x = self.embed(tokens)
            if self.positions is not None:
                x = x + self.positions(torch.arange(seq, device=tokens.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return {"LanguageModel": LanguageModel}
