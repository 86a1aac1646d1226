"""What to predict: the model specification (a library model, a factory in a Python file, or a module
instance), its per-sample input shape, and the options of a prediction."""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perfzoo.models.builders import (
    TOKEN_BUILDERS,
    check_factory_reference,
    check_model_name,
    library_model_names,
    timm_renamed_models,
    timm_tagged_models,
)
from perfzoo.io import InputError, suggest

SPEC_KEYS = ("name", "batch", "input", "mode", "precision", "devices", "objective", "latency_target_ms",
             "num_classes")


MODES = ("inference", "training")


LIBRARY_BUILDERS = ("timm", "torchvision", "mlp", "transformer", "language_model")


DEFAULT_INPUT: dict[str, tuple[int, ...]] = {
    "timm": (3, 224, 224),
    "torchvision": (3, 224, 224),
    "mlp": (784,),
    "transformer": (128,),
    "language_model": (128,),
}


DEFAULT_NUM_CLASSES = 1000


@dataclass
class ModelSpec:
    """What to featurise: a library model, a factory in a Python file, or a module instance."""

    text: str  # as given: "timm:resnet50", "models.py:build", "<ResNet instance>"
    builder: str  # timm | torchvision | mlp | transformer | language_model | python | instance | callable
    name: str  # library model name, "path:function", or class/function name
    input_shape: tuple[int, ...]
    dtype: str | None = None  # None: float32, or int64 for token models (1-d input into an embedding)
    kwargs: dict[str, Any] = field(default_factory=dict)
    file: str | None = None  # the Python file of a factory
    obj: Any = None  # module instance or build callable (never serialised)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "builder": self.builder,
            "name": self.name,
            "input_shape": list(self.input_shape),
            "dtype": self.dtype,
            "kwargs": self.kwargs,
            "file": self.file,
        }


def parse_input(value: Any, where: str = "--input") -> tuple[int, ...] | None:
    """``"3,224,224"``, ``"3x224x224"``, ``128``, ``[3, 224, 224]`` → a per-sample shape (None: None)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        if isinstance(value, str):
            parts = [p for p in re.split(r"[,x×\s]+", value.strip().strip("()[]")) if p]
        else:
            parts = [value] if isinstance(value, int | np.integer) else list(value)
        shape = tuple(int(str(p).strip()) for p in parts)
        if not shape or any(d < 1 for d in shape):
            raise ValueError
    except (TypeError, ValueError):
        raise InputError(
            f"{where}: expected positive integers such as 3,224,224 (image) or a sequence length "
            f"such as 128 (token models), got {value!r}"
        ) from None
    return shape


def _is_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def resolve_model(model: Any, input_shape: Any = None) -> ModelSpec:
    """Parse ``timm:NAME``, ``torchvision:NAME``, ``mlp:NAME``, ``transformer:NAME``, ``language_model:PRESET``,
    ``path/to/model.py:function``, a bare library name, an ``nn.Module`` or a build callable.
    Unknown names raise InputError with close names."""

    shape = parse_input(input_shape)
    if _is_module(model) or (callable(model) and not isinstance(model, str | os.PathLike)):
        kind = "instance" if _is_module(model) else "callable"
        label = (
            type(model).__name__ if kind == "instance" else getattr(model, "__name__", type(model).__name__)
        )
        if shape is None:
            raise InputError(
                f"model {label}: input_shape is required for a model {kind} "
                "(per sample, e.g. (3, 224, 224), or (seq_len,) for token models)"
            )
        return ModelSpec(f"<{label} {kind}>", kind, label, shape, obj=model)
    if not isinstance(model, str | os.PathLike) or not str(model).strip():
        raise InputError(
            f"model: expected 'timm:NAME', 'torchvision:NAME', 'path/to/model.py:function' or an "
            f"nn.Module, got {type(model).__name__}"
        )
    text = str(model).strip()
    prefix, sep, rest = text.partition(":")
    if sep and prefix in LIBRARY_BUILDERS:
        check_model_name(prefix, rest, "model")
        builder, name = prefix, rest
    elif sep:
        path, _, func = text.rpartition(":")
        check_factory_reference(text, "model")
        return ModelSpec(text, "python", func, _require_shape(shape, text), kwargs={}, file=path)
    elif text.endswith(".py"):
        raise InputError(f"model {text!r}: name the factory function too, as in '{text}:build'")
    else:
        builder = next((b for b in ("torchvision", "timm") if text in library_model_names(b)), "")
        if not builder and (text in timm_tagged_models() or text in timm_renamed_models()):
            check_model_name("timm", text, "model")  # a tagged name passes, a renamed one is named with its current
            builder = "timm"
        if not builder:
            names = sorted({*library_model_names("torchvision"), *library_model_names("timm")})
            raise InputError(
                f"model {text!r}: unknown model; expected timm:NAME, torchvision:NAME or "
                f"path/to/model.py:function{suggest(text, names)}"
            )
        name = text
        text = f"{builder}:{name}"
    dtype = "int64" if builder in TOKEN_BUILDERS else "float32"
    shape = shape or DEFAULT_INPUT[builder]
    kwargs = {"in_features": math.prod(shape)} if builder == "mlp" else {}
    return ModelSpec(text, builder, name, shape, dtype, kwargs)


def _require_shape(shape: tuple[int, ...] | None, text: str) -> tuple[int, ...]:
    if shape is None:
        raise InputError(
            f"model {text}: --input is required for a model factory (per sample, e.g. 3,224,224, "
            "or a sequence length for token models)"
        )
    return shape


def featurisation_request(spec: ModelSpec, batch: int, mode: str, num_classes: int) -> dict[str, Any]:
    """The JSON request another process featurises
    (:func:`perfzoo.prediction.metamodel.featurise_request`)."""
    return {"spec": spec.to_dict(), "batch": batch, "mode": mode, "num_classes": num_classes}
