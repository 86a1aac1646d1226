"""Language models from their dimensions: shapes, causality, preset sizes, meta-device features, errors."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from perfzoo.config import validate_config
from perfzoo.features.meta import featurise
from perfzoo.io import InputError
from perfzoo.models.builders import build_model
from perfzoo.models.language import PRESETS, lm_config
from perfzoo.models.zoo import expand_zoo, manifest_frame
from perfzoo.prediction.spec import resolve_model
from perfzoo.profiling.core import make_step

TINY = {"d_model": 32, "layers": 2, "heads": 4, "ffn": 64, "vocab": 1000, "max_positions": 32}
LAYOUTS = {
    "gpt": {},
    "llama": {"norm": "rmsnorm", "activation": "swiglu", "positional": "rotary", "tied": False, "bias": False},
    "opt": {"activation": "relu"},
}

# Published sizes: GPT-2 small 124M (the released 124,439,808-parameter checkpoint; Radford et al. 2019
# list it as 117M); GPT-3 XL 1.3B (Brown et al. 2020, Table 2.1); OPT-1.3B 1.3B (Zhang et al. 2022,
# Table 1); BERT-large 340M (Devlin et al. 2019, section 3); LLaMA 7B 6.7B (Touvron et al. 2023, Table 2).
PUBLISHED_PARAMS = {"gpt2": 124e6, "gpt3-xl": 1.3e9, "opt-1.3b": 1.3e9, "bert-large": 340e6, "llama": 6.7e9}


def tiny(causal: bool = True, **layout) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("language_model", "decoder", {**TINY, "causal": causal, **layout}, 10).eval()


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_logits_have_one_row_per_token_over_the_vocabulary(layout) -> None:
    tokens = torch.randint(0, 1000, (3, 16))
    assert tiny(**layout)(tokens).shape == (3, 16, 1000)
    assert tiny(causal=False, **layout)(tokens).shape == (3, 16, 1000)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_decoder_logits_do_not_see_later_tokens_and_encoder_logits_do(layout) -> None:
    tokens = torch.randint(0, 1000, (2, 12))
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 1000
    with torch.no_grad():
        decoder, encoder = tiny(**layout), tiny(causal=False, **layout)
        before, after = decoder(tokens), decoder(changed)
        assert torch.equal(before[:, :8], after[:, :8])
        assert not torch.allclose(before[:, 8:], after[:, 8:])
        assert not torch.allclose(encoder(tokens)[:, :8], encoder(changed)[:, :8])


def test_tied_models_share_the_embedding_and_untied_do_not() -> None:
    model = tiny()
    assert model.head.weight is model.embed.weight
    model = tiny(tied=False)
    assert model.head.weight.data_ptr() != model.embed.weight.data_ptr()


@pytest.mark.parametrize("name", PUBLISHED_PARAMS)
def test_preset_parameter_counts_match_the_published_sizes(name) -> None:
    with torch.device("meta"):
        model = build_model("language_model", name, {}, 10)
    params = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.03)


@pytest.mark.parametrize(("name", "overrides"), [("gpt2", {"layers": 2}), ("llama", {"layers": 1}),
                                                 ("bert-large", {"layers": 1})])
def test_meta_features_count_every_projection_and_the_attention_matmuls(name, overrides) -> None:
    batch, seq = 2, 64
    config = lm_config(name, overrides)
    feats, layers = featurise(partial(build_model, "language_model", name, overrides, 10, (seq,)), (seq,), batch,
                              "inference", "int64", name)
    with torch.device("meta"):
        model = build_model("language_model", name, overrides, 10)
    linear_weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    attention = 2 * 2 * batch * seq * seq * config.d_model * config.layers  # Q K^T and A V (full square)
    assert feats["flops_fw"] == 2 * batch * seq * linear_weights + attention
    assert feats["n_attention"] == config.layers
    assert layers.loc[layers["category"] == "attention", "flops"].sum() == attention
    assert feats["graph_error"] == ""


def test_zoo_family_of_presets_expands_with_token_inputs(config) -> None:
    config["zoo"]["families"]["lm"] = {"builder": "language_model", "models": ["gpt2", "llama"],
                                       "grid": {"layers": [1, 2]}, "sequence_lengths": [64], "modes": ["inference"]}
    validate_config(config)
    manifest = manifest_frame(expand_zoo(config))
    lm = manifest[manifest["family"] == "lm"]
    assert lm["label"].tolist() == ["gpt2-layers1@seq64", "gpt2-layers2@seq64", "llama-layers1@seq64",
                                    "llama-layers2@seq64"]
    assert set(lm["dtype"]) == {"int64"} and set(lm["input_shape"]) == {"[64]"}


@pytest.mark.parametrize(("name", "kwargs", "error"), [
    ("gpt-2", {}, r"unknown language_model model 'gpt-2' \(did you mean: gpt2"),
    ("gpt2", {"n_layer": 2}, r"\[gpt2\]: language_model model 'gpt2' takes no argument 'n_layer' \(did you mean: layers"),
    ("gpt2", {"heads": 5}, r"\[gpt2\]: d_model 768 is not a multiple of heads 5"),
    ("gpt2", {"norm": "batchnorm"}, r"\[gpt2\]\.norm: 'batchnorm' is not one of layernorm, rmsnorm"),
    ("llama", {"d_model": 96, "heads": 32}, r"rotary positions need an even head width, got 3"),
    ("decoder", {"vocab": 500}, r"\[decoder\]: vocab 500 is below the 1000 token ids the profiler draws"),
])
def test_bad_language_model_is_a_config_error_naming_it(config, name, kwargs, error) -> None:
    config["zoo"]["families"]["lm"] = {"builder": "language_model", "models": [{"name": name, "kwargs": kwargs}]}
    with pytest.raises(InputError, match=error):
        validate_config(config)


def test_presets_can_be_named_for_prediction() -> None:
    spec = resolve_model("language_model:gpt3-xl")
    assert (spec.builder, spec.name, spec.input_shape, spec.dtype) == ("language_model", "gpt3-xl", (128,), "int64")
    assert set(PRESETS) >= {"gpt2", "gpt3-xl", "opt-1.3b", "bert-large", "llama"}


def test_training_step_of_a_language_model_updates_every_weight() -> None:
    """The profiled training step scores (batch, tokens, vocab) logits token by token."""
    model = build_model("language_model", "decoder", {"layers": 1, "d_model": 32, "heads": 2, "ffn": 64}, 10)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    x, y = torch.randint(0, 1000, (2, 8)), torch.randint(0, 10, (2,))
    make_step(model, x, y, "training", "sgd")()
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert unchanged == []
