"""Model builders: torchvision, timm, plain MLPs, transformer encoders and user factories.

Every builder returns a classifier ``nn.Module`` mapping a batch of inputs to logits of shape
``(batch, num_classes)``, built with random weights (nothing is ever downloaded).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfzoo.io import InputError, suggest, write_text

BUILDER_NAMES = ("torchvision", "timm", "mlp", "transformer", "python")
MLP_NAMES = ("mlp_small", "mlp_big", "mlp")
TRANSFORMER_NAMES = ("encoder",)
VOCAB_SIZE = 1000


def _name_cache() -> Path:
    """Where the model-name lists are cached: the user's cache folder (``$XDG_CACHE_HOME``), shared by
    every workflow folder; ``.snakemake/`` of the current folder when there is no home."""
    base = os.environ.get("XDG_CACHE_HOME") or (
        str(Path.home() / ".cache") if os.environ.get("HOME") else ""
    )
    return Path(base) / "perfzoo" / "model-names" if base else Path(".snakemake") / "perfzoo-model-names"



@functools.cache
def library_model_names(builder: str) -> tuple[str, ...]:
    """Model names a library offers; cached per library version so config checks stay fast."""
    version = importlib.metadata.version(builder)
    cache = _name_cache() / f"{builder}-{version}.json"
    try:
        return tuple(json.loads(cache.read_text()))
    except (OSError, ValueError):  # not cached yet, or unreadable: list the library's models
        pass
    if builder == "timm":
        import timm  # lazy: seconds to import; the Snakefile imports this module to check the config

        names = sorted(timm.list_models())
    else:
        import torchvision.models  # lazy: seconds to import; the Snakefile imports this module to check the config

        names = sorted(torchvision.models.list_models())
    with contextlib.suppress(OSError):  # a read-only cache folder only costs speed
        write_text(cache, json.dumps(names))  # atomic: parallel jobs may fill the cache at once
    return tuple(names)


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
    else:
        check_factory_reference(name, where)
        return
    if name not in names:
        raise InputError(f"{where}: unknown {builder} model {name!r}{suggest(name, names)}")


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
        kwargs = _with_image_size(builder, name, kwargs, input_shape[-1])
    return _BUILDERS[builder](name, kwargs, num_classes)


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
    "python": _build_python,
}
