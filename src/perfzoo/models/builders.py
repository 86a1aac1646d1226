"""Model builders: torchvision, timm, plain MLPs, transformer encoders, language models and user factories.

Every builder returns an ``nn.Module`` built with random weights (nothing is ever downloaded). Classifiers
map a batch of inputs to logits of shape ``(batch, num_classes)``; language models
(:mod:`perfzoo.models.language`) map token ids ``(batch, seq)`` to logits ``(batch, seq, vocab)``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.metadata
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from perfzoo.io import InputError, suggest, write_text
from perfzoo.models.language import FIELDS as LANGUAGE_MODEL_ARGS
from perfzoo.models.language import PRESETS as LANGUAGE_MODEL_PRESETS
from perfzoo.models.language import build_language_model, lm_config

BUILDER_NAMES = ("torchvision", "timm", "mlp", "transformer", "language_model", "python")
TOKEN_BUILDERS = ("transformer", "language_model")  # inputs are token ids of one sequence length
MLP_NAMES = ("mlp_small", "mlp_big", "mlp")
MLP_ARGS = ("in_features", "hidden")  # what _build_mlp takes
TRANSFORMER_NAMES = ("encoder",)
VOCAB_SIZE = 1000  # synthetic token ids are drawn below this


def _name_cache() -> Path:
    """Where the model-name lists are cached: the user's cache folder (``$XDG_CACHE_HOME``), shared by
    every workflow folder; ``.snakemake/`` of the current folder when there is no home."""
    base = os.environ.get("XDG_CACHE_HOME") or (
        str(Path.home() / ".cache") if os.environ.get("HOME") else ""
    )
    return Path(base) / "perfzoo" / "model-names" if base else Path(".snakemake") / "perfzoo-model-names"



def _cached_per_version(library: str, suffix: str, compute: Callable[[], Any]) -> Any:
    """``compute()`` (JSON-able), kept in the name cache per ``library`` version: read from there when it is."""
    cache = _name_cache() / f"{library}-{importlib.metadata.version(library)}{suffix}.json"
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):  # not cached yet, or unreadable: ask the library
        pass
    value = compute()
    with contextlib.suppress(OSError):  # a read-only cache folder only costs speed
        write_text(cache, json.dumps(value))  # atomic: parallel jobs may fill the cache at once
    return value


@functools.cache
def library_model_names(builder: str) -> tuple[str, ...]:
    """Model names a library offers; cached per library version so config checks stay fast."""

    def listed() -> list[str]:
        if builder == "timm":
            import timm  # lazy: seconds to import; the Snakefile imports this module to check the config

            return sorted(timm.list_models())
        import torchvision.models  # lazy: seconds to import; the Snakefile imports this module to check the config

        return sorted(torchvision.models.list_models())

    return tuple(_cached_per_version(builder, "", listed))


@functools.cache
def timm_tagged_models() -> frozenset[str]:
    """timm's ``<architecture>.<tag>`` names (a tag names pretrained weights, e.g. ``resnet50.a1_in1k``); cached per
    timm version like :func:`library_model_names`."""

    def listed() -> list[str]:
        import timm  # lazy: seconds to import; the Snakefile imports this module to check the config

        return sorted(timm.list_pretrained())

    return frozenset(_cached_per_version("timm", "-tagged", listed))


@functools.cache
def timm_renamed_models() -> dict[str, str]:
    """timm's table of former model names and the ``<architecture>.<tag>`` it builds for each now (e.g.
    ``tf_efficientnet_b0_ap`` -> ``tf_efficientnet_b0.ap_in1k``); names timm removed without a successor are
    left out. A tag timm no longer has (``vit_base_patch16_224_sam`` -> ``vit_base_patch16_224.sam``) is dropped:
    it names pretrained weights, and the architecture is what is featurised (random weights, the table's
    resolution and class count). Cached per timm version like :func:`library_model_names`."""

    def table() -> dict[str, str]:
        import timm.models  # lazy: seconds to import; the Snakefile imports this module to check the config

        tagged = timm_tagged_models()
        return {old: new if "." not in new or new in tagged else new.split(".", 1)[0]
                for old, new in sorted(timm.models.get_deprecated_models().items()) if new}

    return dict(_cached_per_version("timm", "-renamed", table))


def check_model_name(builder: str, name: str, where: str) -> None:
    """Raise InputError naming ``where`` if ``name`` is unknown to ``builder``."""
    if builder not in BUILDER_NAMES:
        raise InputError(f"{where}.builder: unknown builder {builder!r}{suggest(builder, BUILDER_NAMES)}")
    if builder in ("timm", "torchvision"):
        names = library_model_names(builder)
    elif builder == "mlp":
        names = list(MLP_NAMES)
    elif builder == "transformer":
        names = list(TRANSFORMER_NAMES)
    elif builder == "language_model":
        names = list(LANGUAGE_MODEL_PRESETS)
    else:
        check_factory_reference(name, where)
        return
    if name in names:
        return
    if builder == "timm" and _accepts_timm_name(name, names, where):
        return
    raise InputError(f"{where}: unknown {builder} model {name!r}{suggest(name, names)}")


def _accepts_timm_name(name: str, architectures: Sequence[str], where: str) -> bool:
    """Whether a timm name that is not an architecture is one with a weights tag (``resnet50.a1_in1k``: built with
    random weights all the same); InputError for a name timm renamed (naming the current one) or a known
    architecture's unknown tag."""
    if name in timm_renamed_models():
        raise InputError(f"{where}: timm model {name!r} was renamed: it is {timm_renamed_models()[name]!r} now")
    architecture, dot, tag = name.partition(".")
    if not dot or architecture not in architectures:
        return False
    if name not in timm_tagged_models():
        tags = sorted(n for n in timm_tagged_models() if n.startswith(f"{architecture}."))
        raise InputError(f"{where}: timm model {architecture!r} has no tag {tag!r}{suggest(name, tags)}")
    return True


def accepted_kwargs(builder: str, name: str) -> tuple[str, ...] | None:
    """The keyword arguments a builder's model takes, or None where that is not known without importing
    the library (timm, torchvision, the transformer classifier) or where it takes any (``**kwargs``)."""
    if builder == "mlp":
        return MLP_ARGS
    if builder == "language_model":
        return LANGUAGE_MODEL_ARGS
    if builder == "python":
        return _factory_parameters(name)
    return None


def check_model_kwargs(builder: str, name: str, kwargs: dict[str, Any], where: str) -> None:
    """Raise InputError naming ``where`` and the key if the model does not take one of ``kwargs`` (where
    that can be told without building it), or if a language model's dimensions do not fit together."""
    accepted = accepted_kwargs(builder, name)
    if accepted is not None:
        for key in kwargs:
            if key not in accepted:
                raise InputError(f"{where}: {builder} model {name!r} takes no argument {key!r}"
                                 f"{suggest(key, list(accepted)) or ' (it takes ' + ', '.join(accepted) + ')'}")
    if builder == "language_model":
        config = lm_config(name, kwargs, where)
        if config.vocab < VOCAB_SIZE:
            raise InputError(f"{where}: vocab {config.vocab} is below the {VOCAB_SIZE} token ids the profiler draws")


def _factory_parameters(ref: str) -> tuple[str, ...] | None:
    """Parameter names of a ``file.py:function`` factory read from its source (None: takes ``**kwargs``,
    or is not a plain function)."""
    path, _, func = ref.rpartition(":")
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except (OSError, SyntaxError, UnicodeDecodeError):  # reported by check_factory_reference
        return None
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func), None)
    if node is None or node.args.kwarg is not None:
        return None
    return tuple(a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs))


def check_factory_reference(ref: str, where: str) -> None:
    """Check a ``path/to/file.py:function`` reference without importing the file."""
    path, _, func = ref.rpartition(":")
    if not path or not func:
        raise InputError(f"{where}: expected 'path/to/file.py:function', got {ref!r}")
    if not Path(path).is_file():
        raise InputError(f"{where}: model file {path!r} not found")
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except SyntaxError as exc:
        raise InputError(f"{where}: {path}:{exc.lineno}: syntax error: {exc.msg}") from None
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    if func not in defined:
        raise InputError(f"{where}: {path} defines no function {func!r}{suggest(func, defined)}")


def build_model(
    builder: str, name: str, kwargs: dict[str, Any], num_classes: int, input_shape: tuple[int, ...] = ()
) -> Any:
    """Construct the model with random weights on the current default device."""
    kwargs = dict(kwargs)
    if builder in ("timm", "torchvision") and len(input_shape) == 3:
        sized = _with_image_size(builder, name, dict(kwargs), input_shape[-1])
        try:
            return _BUILDERS[builder](name, sized, num_classes)
        except TypeError as exc:
            if "img_size" in kwargs or not _rejects_argument(exc, "img_size"):
                raise
            # the module mentions img_size but this model's class takes none (timm's hieradet_*): it is
            # resolution-agnostic, so it is built as it is and runs at the input's size
    return _BUILDERS[builder](name, kwargs, num_classes)


def _rejects_argument(exc: TypeError, argument: str) -> bool:
    """Whether ``exc`` is Python's "got an unexpected keyword argument '<argument>'"."""
    return f"unexpected keyword argument '{argument}'" in str(exc)


def _with_image_size(builder: str, name: str, kwargs: dict[str, Any], side: int) -> dict[str, Any]:
    """Tell models with a fixed patch grid (ViT, Swin, ...) the input resolution."""
    if builder == "torchvision" and name.startswith("vit_"):
        kwargs.setdefault("image_size", side)
    if builder == "timm":
        import timm  # lazy: seconds to import; the Snakefile imports this module to check the config

        if timm.get_pretrained_cfg(name) is not None and _timm_takes_img_size(name):
            kwargs.setdefault("img_size", side)
    return kwargs


def _timm_takes_img_size(name: str) -> bool:
    import timm.models  # lazy: seconds to import; the Snakefile imports this module to check the config

    return _module_mentions_img_size(timm.models.model_entrypoint(name).__module__)


@functools.lru_cache(maxsize=None)
def _module_mentions_img_size(module_name: str) -> bool:
    """Whether a timm model module's source mentions ``img_size`` (its classes declare it in __init__)."""
    return "img_size" in inspect.getsource(sys.modules[module_name])


def _build_torchvision(name: str, kwargs: dict[str, Any], num_classes: int) -> Any:
    import torchvision.models  # lazy: seconds to import; the Snakefile imports this module to check the config

    return torchvision.models.get_model(name, weights=None, num_classes=num_classes, **kwargs)


def _build_timm(name: str, kwargs: dict[str, Any], num_classes: int) -> Any:
    import timm  # lazy: seconds to import; the Snakefile imports this module to check the config

    return timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)


def _build_mlp(name: str, kwargs: dict[str, Any], num_classes: int) -> Any:
    """Fully connected net of Grzelka's energy report (Measuring Energy Consumption of Deep Learning Workloads; MNIST-sized): Linear+ReLU per hidden layer, then logits."""
    from torch import nn  # lazy: seconds to import; the Snakefile imports this module to check the config

    in_features = int(kwargs.pop("in_features", 784))
    hidden = [int(h) for h in kwargs.pop("hidden", [512, 512])]
    if kwargs:
        raise TypeError(f"unexpected mlp arguments {sorted(kwargs)}")
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _build_transformer(name: str, kwargs: dict[str, Any], num_classes: int) -> Any:
    return TokenClassifier(num_classes=num_classes, **kwargs)


def _build_language_model(name: str, kwargs: dict[str, Any], num_classes: int) -> Any:
    """A language model from a preset and overrides; its output width is the vocabulary, not ``num_classes``."""
    return build_language_model(lm_config(name, kwargs, f"language_model {name}"))


def _build_python(ref: str, kwargs: dict[str, Any], num_classes: int) -> Any:
    path, _, func = ref.rpartition(":")
    spec = importlib.util.spec_from_file_location(f"perfzoo_user_{Path(path).stem}", path)
    if spec is None or spec.loader is None:
        raise InputError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, func)(**kwargs)


def _token_classifier_class() -> type:
    from torch import nn  # lazy: seconds to import; the Snakefile imports this module to check the config

    class _TokenClassifier(nn.Module):
        """Embedding + learned positions + ``nn.TransformerEncoder`` + mean-pooled linear head."""

        def __init__(
            self,
            num_classes: int,
            d_model: int = 128,
            heads: int = 4,
            layers: int = 2,
            ff_mult: int = 4,
            max_len: int = 4096,
            vocab: int = VOCAB_SIZE,
            dropout: float = 0.1,
        ) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(max_len, d_model)
            layer = nn.TransformerEncoderLayer(
                d_model, heads, ff_mult * d_model, dropout=dropout, batch_first=True
            )
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, num_classes)

        def forward(self, tokens: Any) -> Any:
            import torch  # lazy: seconds to import; the Snakefile imports this module to check the config

            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.embed(tokens) + self.pos(positions)
            return self.head(self.encoder(x).mean(dim=1))

    return _TokenClassifier


def TokenClassifier(**kwargs: Any) -> Any:  # noqa: N802 - behaves as a class constructor
    """Build the transformer-encoder classifier (the class is created lazily to keep torch optional)."""
    return _token_classifier_class()(**kwargs)


_BUILDERS: dict[str, Callable[[str, dict[str, Any], int], Any]] = {
    "torchvision": _build_torchvision,
    "timm": _build_timm,
    "mlp": _build_mlp,
    "transformer": _build_transformer,
    "language_model": _build_language_model,
    "python": _build_python,
}
