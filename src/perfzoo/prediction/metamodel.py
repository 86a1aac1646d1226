"""Featurising a model on PyTorch's meta device (no weights allocated), and the JSON request and answer
by which another process (a forked or spawned child, or the warm featuriser server) does it.

This module imports torch: the process that predicts imports it only where it featurises itself
(:mod:`perfzoo.prediction.featurise` chooses where).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import traceback
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from perfzoo.models.builders import build_model
from perfzoo.features.meta import featurise, featurise_on_cpu
from perfzoo.features.ops import DataDependentError
from perfzoo.hardware import total_memory_gb
from perfzoo.io import InputError, one_line
from perfzoo.prediction.record import clean
from perfzoo.prediction.spec import ModelSpec

PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])  # the perfzoo package: library code, not the user's


def _is_library_frame(filename: str) -> bool:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, PACKAGE_ROOT}
    path = os.path.realpath(filename)
    return (
        filename.startswith("<")
        or any(path.startswith(os.path.realpath(r)) for r in roots)
        or "site-packages" in path
    )


def user_location(exc: BaseException, user_file: str | None) -> tuple[str, int] | None:
    """(file, line) in the user's code where ``exc`` was raised: the deepest frame in ``user_file``, or
    for instances the deepest frame outside the standard library, site-packages and perfzoo."""
    in_user_file = user_file is None or os.path.realpath(
        str(getattr(exc, "filename", ""))
    ) == os.path.realpath(user_file)
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno and in_user_file:
        return (user_file or exc.filename), int(exc.lineno)
    frames = traceback.extract_tb(exc.__traceback__)
    if user_file is not None:
        target = os.path.realpath(user_file)
        hits = [f for f in frames if os.path.realpath(f.filename) == target]
        return (user_file, int(hits[-1].lineno or 0)) if hits else None
    hits = [f for f in frames if not _is_library_frame(f.filename)]
    return (hits[-1].filename, int(hits[-1].lineno or 0)) if hits else None


def _failure(exc: BaseException, spec: ModelSpec, stage: str) -> InputError:
    loc = user_location(exc, spec.file)
    where = f"{loc[0]}:{loc[1]}" if loc else f"model {spec.text}"
    return InputError(f"{where}: {one_line(exc)} ({stage} {spec.text})")


def _meta_copy(module: Any) -> Any:
    """A deep copy of ``module`` whose parameters and buffers live on the meta device (no weight copy)."""

    memo: dict[int, Any] = {}
    for t in (*module.parameters(), *module.buffers()):
        if id(t) in memo:
            continue
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = (
            nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
        )
    return copy.deepcopy(module, memo)


def _builder(spec: ModelSpec, num_classes: int) -> Any:
    """A function that builds ``spec``'s model on the current default device (an instance: a copy of it)."""
    if spec.builder == "instance":
        return partial(copy.deepcopy, spec.obj)
    if spec.builder == "callable":
        return spec.obj
    name = f"{spec.file}:{spec.name}" if spec.builder == "python" else spec.name
    return partial(build_model, spec.builder, name, spec.kwargs, num_classes, spec.input_shape)


def _build_meta_model(spec: ModelSpec, num_classes: int) -> Any:

    if spec.builder == "instance":
        try:
            model = _meta_copy(spec.obj)
        except Exception as exc:  # noqa: BLE001 - e.g. attributes that cannot be deep-copied
            raise InputError(
                f"model {spec.text}: cannot copy the instance to the meta device ({one_line(exc)}); "
                "pass a function that builds it instead"
            ) from None
    else:
        try:
            with torch.device("meta"):
                model = _builder(spec, num_classes)()
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - any error in user or library code: one line, located
            raise _failure(exc, spec, "while building") from None
    if not isinstance(model, nn.Module):
        raise InputError(f"model {spec.text}: the factory returned {type(model).__name__}, not an nn.Module")
    return model


def _auto_dtype(model: Any, shape: tuple[int, ...]) -> str:

    tokens = len(shape) == 1 and any(isinstance(m, nn.Embedding | nn.EmbeddingBag) for m in model.modules())
    return "int64" if tokens else "float32"


CPU_FALLBACK_MEMORY_SHARE = 0.5
"""The share of this machine's memory a model's weights (and their gradients in training) may take for its step
to be counted on the CPU when the meta device cannot follow it."""


def _check_fits_in_memory(meta_model: nn.Module, mode: str, spec: ModelSpec, located: BaseException) -> None:
    """Refuse the CPU count of a model too large for this machine (its activations come on top)."""
    tensors = {id(t): t for t in (*meta_model.parameters(), *meta_model.buffers())}.values()
    weight_gb = sum(t.numel() * t.element_size() for t in tensors) / 1024**3
    needed_gb = weight_gb * (2 if mode == "training" else 1)
    budget_gb = CPU_FALLBACK_MEMORY_SHARE * total_memory_gb()
    if needed_gb > budget_gb:
        raise InputError(f"{located}; counting the step on the CPU instead would need {needed_gb:.3g} GB of "
                         f"weights{' and gradients' if mode == 'training' else ''}, over the {budget_gb:.3g} GB "
                         f"({CPU_FALLBACK_MEMORY_SHARE:.0%}) of this machine's memory it may take: no prediction")


def featurise_model(spec: ModelSpec, batch: int, mode: str, num_classes: int) -> dict[str, Any]:
    """Model-level features of ``spec`` on the meta device, with the class name and input dtype used."""

    model = _build_meta_model(spec, num_classes)
    dtype = spec.dtype or _auto_dtype(model, spec.input_shape)
    try:
        feats, _ = featurise(lambda: model, spec.input_shape, batch, mode, dtype, model_id=spec.text)
        feats["featurised_on"] = "meta device"
    except InputError as exc:
        cause = exc.__context__
        located = (_failure(cause, spec, f"in the {mode} step on the meta device of")
                   if cause is not None and user_location(cause, spec.file) is not None else exc)
        if not isinstance(exc, DataDependentError):
            raise located from None
        _check_fits_in_memory(model, mode, spec, located)
        feats = featurise_on_cpu(_builder(spec, num_classes), spec.input_shape, batch, mode, dtype,
                                 model_id=spec.text, reason=str(located))
        feats["featurised_on"] = ("CPU, one seeded random input: its control flow depends on tensor values "
                                  f"({located})")
    return {"features": clean(feats), "class_name": type(model).__name__, "dtype": dtype}


def featurise_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """Featurise a request of :func:`perfzoo.prediction.spec.featurisation_request` (in a child process
    or the warm server):
    ``{"ok": result}`` or ``{"error": one line}``, with the CPU seconds this process has used."""
    spec = ModelSpec(**{**request["spec"], "input_shape": tuple(request["spec"]["input_shape"])})
    try:
        out: dict[str, Any] = {
            "ok": featurise_model(spec, request["batch"], request["mode"], request["num_classes"])
        }
    except InputError as exc:
        out = {"error": str(exc)}
    out["cpu_s"] = time.process_time()
    return out


def worker_main() -> None:
    """Child-process entry point: featurise the request in argv[-2], write the result to argv[-1]."""
    request_path, out_path = sys.argv[-2:]
    out = featurise_request(json.loads(Path(request_path).read_text()))
    Path(out_path).write_text(json.dumps(out))
