"""Predict time, memory, energy, cost and carbon of a model on every configured device.

``predict`` featurises a model on PyTorch's meta device (no weights allocated), loads for every target
the fitted predictor with the best validation score, and returns one row per device with every
predicted number and its interval, the recommended device for an objective, the recommended MIG
profile and power cap where they apply, warnings about extrapolation, and the provenance of every
file the numbers come from (down to the raw traces).

Choice of predictor. For each target, the row of ``results/evaluate/metrics.parquet`` with the lowest
MAPE on the ``random`` split (else on any split) whose ``results/fit/{target}/{regressor}/{split}
.models.json`` exists; for a model whose family was never profiled, the lowest MAPE on the
``leave_one_family_out`` split instead (the score of predicting families held out of training), with
that split's fitted models and residuals. The prediction is the mean of that file's fold models.

Intervals (nominal 90 %). Tree ensembles: 5th-95th percentile of the member (tree) predictions of all
folds. Regressors with their own calibrated intervals (``device_transfer``): those (mean over folds).
Other regressors: the 5th-95th percentile ratios r = y_pred / y_true on the held-out test rows of
the predictor's split, applied as [p / r95, p / r05]. Intervals always contain the point prediction.

Derived quantities. Throughput = batch / latency when no throughput predictor exists; energy per step =
power x latency when no energy predictor exists; energy per sample = energy / batch; EDP = energy x
latency (J·s, per step); cost per 1000 samples = price_per_hour x time for 1000 samples; carbon per 1000
samples = energy x carbon_intensity_g_per_kwh. A quantity whose inputs are missing is missing, with the
reason; it is never reported as 0.

Speed. When torch is not imported yet, the featurisation runs elsewhere while this process loads the
predictors: in the warm featuriser server of this environment when the CLI finds one (torch, torchvision
and timm imported once, each request featurised in a fork; :mod:`perfzoo.featuriser_server`), else in a
child process that imports them; on two cores the two halves of ``perfzoo predict`` overlap.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.bounds import bound_predictions, mark_out_of_range, qualify_recommendation, range_check
from perfzoo.io import InputError, one_line, suggest

try:  # interpreter start, for PERFZOO_TIMING
    import psutil as _psutil

    _START = _psutil.Process().create_time()
except Exception:  # noqa: BLE001 - psutil missing or restricted: time from this import on
    _START = time.time()

TARGETS = (
    "latency_ms",
    "throughput",
    "peak_mem_mb",
    "mean_power_w",
    "energy_j",
    "energy_per_sample_j",
    "edp",
)
QUANTITIES = (*TARGETS, "cost_per_1k_samples", "carbon_g_per_1k_samples")
UNITS = {
    "latency_ms": "ms", "throughput": "samples/s", "peak_mem_mb": "MB", "mean_power_w": "W", "energy_j": "J",
    "energy_per_sample_j": "J", "edp": "J·s", "cost_per_1k_samples": "price units",
    "carbon_g_per_1k_samples": "g CO2e",
}  # fmt: skip
OBJECTIVES = {
    "time": "latency_ms",
    "energy": "energy_per_sample_j",
    "edp": "edp",
    "cost": "cost_per_1k_samples",
}
MODES = ("inference", "training")
LIBRARY_BUILDERS = ("timm", "torchvision", "mlp", "transformer")
DEFAULT_INPUT: dict[str, tuple[int, ...]] = {
    "timm": (3, 224, 224),
    "torchvision": (3, 224, 224),
    "mlp": (784,),
    "transformer": (128,),
}
DEFAULT_NUM_CLASSES = 1000
DEFAULT_CARBON_INTENSITY = 400.0  # g CO2e / kWh, the config schema's default
PREFERRED_SPLIT = "random"
#: the split whose scores choose the predictors of a model from a family that was never profiled
UNSEEN_FAMILY_SPLIT = "leave_one_family_out"
QUANTILES = (0.05, 0.95)
RUN_WORKFLOW = (
    "run `snakemake --cores all` (or `snakemake --cores all results/evaluate/metrics.parquet`) "
    "in the workflow directory first"
)
SPEC_KEYS = ("name", "batch", "input", "mode", "devices", "objective", "latency_target_ms", "num_classes")


# =========================================================================== model specification


@dataclass
class ModelSpec:
    """What to featurise: a library model, a factory in a Python file, or a module instance."""

    text: str  # as given: "timm:resnet50", "models.py:build", "<ResNet instance>"
    builder: str  # timm | torchvision | mlp | transformer | python | instance | callable
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
    """Parse ``timm:NAME``, ``torchvision:NAME``, ``mlp:NAME``, ``transformer:NAME``,
    ``path/to/model.py:function``, a bare library name, an ``nn.Module`` or a build callable.
    Unknown names raise InputError with close names."""
    from perfzoo.builders import check_factory_reference, check_model_name, library_model_names

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
        if not builder:
            names = sorted({*library_model_names("torchvision"), *library_model_names("timm")})
            raise InputError(
                f"model {text!r}: unknown model; expected timm:NAME, torchvision:NAME or "
                f"path/to/model.py:function{suggest(text, names)}"
            )
        name = text
        text = f"{builder}:{name}"
    dtype = "int64" if builder == "transformer" else "float32"
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


# =========================================================================== featurisation


def _is_library_frame(filename: str) -> bool:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).resolve().parent)}
    path = os.path.realpath(filename)
    return (
        filename.startswith("<")
        or any(path.startswith(os.path.realpath(r)) for r in roots)
        or "site-packages" in path
    )


def _user_location(exc: BaseException, user_file: str | None) -> tuple[str, int] | None:
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


def _timing(label: str) -> None:
    """With ``PERFZOO_TIMING=1``: wall and CPU seconds since interpreter start, on stderr."""
    if os.environ.get("PERFZOO_TIMING"):
        import resource

        wall = time.time() - _START
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"perfzoo timing: {wall:6.2f} s wall {cpu.ru_utime + cpu.ru_stime:6.2f} s CPU  {label}",
            file=sys.stderr,
        )



def _failure(exc: BaseException, spec: ModelSpec, stage: str) -> InputError:
    loc = _user_location(exc, spec.file)
    where = f"{loc[0]}:{loc[1]}" if loc else f"model {spec.text}"
    return InputError(f"{where}: {one_line(exc)} ({stage} {spec.text})")


def _meta_copy(module: Any) -> Any:
    """A deep copy of ``module`` whose parameters and buffers live on the meta device (no weight copy)."""
    import torch
    from torch import nn

    memo: dict[int, Any] = {}
    for t in (*module.parameters(), *module.buffers()):
        if id(t) in memo:
            continue
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = (
            nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
        )
    return copy.deepcopy(module, memo)


def _build_meta_model(spec: ModelSpec, num_classes: int) -> Any:
    import torch
    from torch import nn

    from perfzoo.builders import build_model

    if spec.builder == "instance":
        try:
            model = _meta_copy(spec.obj)
        except Exception as exc:  # noqa: BLE001 - e.g. attributes that cannot be deep-copied
            raise InputError(
                f"model {spec.text}: cannot copy the instance to the meta device ({one_line(exc)}); "
                "pass a function that builds it instead"
            ) from None
    else:
        name = f"{spec.file}:{spec.name}" if spec.builder == "python" else spec.name
        build = (
            spec.obj
            if spec.builder == "callable"
            else partial(build_model, spec.builder, name, spec.kwargs, num_classes, spec.input_shape)
        )
        try:
            with torch.device("meta"):
                model = build()
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - any error in user or library code: one line, located
            raise _failure(exc, spec, "while building") from None
    if not isinstance(model, nn.Module):
        raise InputError(f"model {spec.text}: the factory returned {type(model).__name__}, not an nn.Module")
    return model


def _auto_dtype(model: Any, shape: tuple[int, ...]) -> str:
    from torch import nn

    tokens = len(shape) == 1 and any(isinstance(m, nn.Embedding | nn.EmbeddingBag) for m in model.modules())
    return "int64" if tokens else "float32"


def featurise_model(spec: ModelSpec, batch: int, mode: str, num_classes: int) -> dict[str, Any]:
    """Model-level features of ``spec`` on the meta device, with the class name and input dtype used."""
    from perfzoo.features import featurise

    model = _build_meta_model(spec, num_classes)
    dtype = spec.dtype or _auto_dtype(model, spec.input_shape)
    try:
        feats, _ = featurise(lambda: model, spec.input_shape, batch, mode, dtype, model_id=spec.text)
    except InputError as exc:
        cause = exc.__context__
        if cause is not None and _user_location(cause, spec.file) is not None:
            raise _failure(cause, spec, f"in the {mode} step on the meta device of") from None
        raise
    return {"features": _clean(feats), "class_name": type(model).__name__, "dtype": dtype}


def featurisation_request(spec: ModelSpec, batch: int, mode: str, num_classes: int) -> dict[str, Any]:
    """The JSON request another process featurises (:func:`featurise_request`)."""
    return {"spec": spec.to_dict(), "batch": batch, "mode": mode, "num_classes": num_classes}


def featurise_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """Featurise a request of :func:`featurisation_request` (in a child process or the warm server):
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


def _worker_main() -> None:
    """Child-process entry point: featurise the request in argv[-2], write the result to argv[-1]."""
    request_path, out_path = sys.argv[-2:]
    out = featurise_request(json.loads(Path(request_path).read_text()))
    Path(out_path).write_text(json.dumps(out))


class _ForkedChild:
    """A forked child featurising ``args`` (Popen-like: wait, poll, kill, returncode).

    The child inherits numpy, pandas and perfzoo instead of starting an interpreter and importing them
    again; it imports torch and timm/torchvision, featurises, writes ``out`` and leaves with ``os._exit``
    (no cleanup of the parent's state). The parent has not imported torch: it imports it later, through
    scikit-learn when loading the predictors, in parallel with the child.
    """

    def __init__(self, args: tuple[Any, ...], out: Path, log: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            code = 1
            try:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                # also where Python writes, should the caller have redirected sys.stdout/sys.stderr
                sys.stdout = sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                result = featurise_request(featurisation_request(*args))
                tmp = out.with_suffix(".tmp")
                tmp.write_text(json.dumps(result))
                tmp.replace(out)
                code = 0
            except BaseException:  # noqa: BLE001 - reported through the log and the exit status
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        import signal

        os.kill(self.pid, signal.SIGKILL)


def _child_strategy(spec: ModelSpec) -> str:
    """How to featurise: ``fork`` (a forked child featurises while this process loads the predictors),
    ``spawn`` (a fresh interpreter does it), or ``inline`` (here, later).

    Instances and build callables, and processes that imported torch before (API users, who may have
    run torch threads), featurise inline; ``PERFZOO_PREDICT_CHILD=spawn|inline`` overrides.
    """
    import threading

    forced = os.environ.get("PERFZOO_PREDICT_CHILD", "")
    if spec.builder in ("instance", "callable") or "torch" in sys.modules or forced == "inline":
        return "inline"
    if forced != "spawn" and hasattr(os, "fork") and threading.active_count() == 1:
        return "fork"
    return "spawn"


#: model sources a warm featuriser server may build (instances and callables live in the caller only)
SERVER_BUILDERS = (*LIBRARY_BUILDERS, "python")


class _Featuriser:
    """Featurise through the warm server (see :mod:`perfzoo.featuriser_server`), in a child process
    started now (parallel to loading predictors), or in-process later.

    ``use_server``: send the request to this environment's server when one runs; when none does,
    featurise in a child and set ``start_server_after`` so the caller can start one for next time.
    """

    def __init__(
        self, spec: ModelSpec, batch: int, mode: str, num_classes: int, strategy: str, use_server: bool = False
    ) -> None:
        self.args = (spec, batch, mode, num_classes)
        self.proc: subprocess.Popen[bytes] | _ForkedChild | None = None
        self.server: Any = None
        self.server_path: Path | None = None  # where this environment's server listens (or should)
        self.start_server_after = False  # no server answered: the caller may start one for next time
        self.method = strategy
        if use_server and spec.builder in SERVER_BUILDERS:  # even when this process imported torch
            from perfzoo import featuriser_server

            self.server_path = featuriser_server.socket_path()
            self.server = featuriser_server.submit(featurisation_request(*self.args), self.server_path)
            _timing(f"featurisation: {'sent to the warm server' if self.server else 'no warm server'}")
            if self.server is not None:
                self.method = "server"
                return
            self.start_server_after = True
        self._start_child(strategy)

    def _start_child(self, strategy: str) -> None:
        self.method = strategy
        if strategy == "inline":
            return
        self.tmp = tempfile.TemporaryDirectory(prefix="perfzoo-predict-")
        self.out = Path(self.tmp.name) / "out.json"
        self.log = open(Path(self.tmp.name) / "log.txt", "wb")  # noqa: SIM115 - closed in close()
        try:
            self.proc = self._fork() if strategy == "fork" else self._spawn()
        except OSError:  # no child process: featurise in this one
            self.log.close()
            self.tmp.cleanup()

    def _fork(self) -> _ForkedChild:
        _timing("featurisation: forking")
        return _ForkedChild(self.args, self.out, self.log)

    def _spawn(self) -> subprocess.Popen[bytes]:
        request = Path(self.tmp.name) / "request.json"
        request.write_text(json.dumps(featurisation_request(*self.args)))
        src = str(Path(__file__).resolve().parents[1])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
        }
        code = "from perfzoo.predict import _worker_main; _worker_main()"
        return subprocess.Popen(
            [sys.executable, "-c", code, str(request), str(self.out)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    def result(self) -> dict[str, Any]:
        if self.server is not None:
            _timing("featurisation: waiting for the warm server")
            out = self.server.result()
            self.server = None
            if "ok" in out or "error" in out:
                _timing(f"featurisation: server done ({out.get('cpu_s', math.nan):.2f} s CPU in its fork)")
                if "error" in out:
                    raise InputError(out["error"])
                return out["ok"]
            self._start_child(_child_strategy(self.args[0]))  # the server broke off: featurise here
        if self.proc is None:
            self.method = "inline"
            return featurise_model(*self.args)
        try:
            _timing("featurisation: waiting for the child process")
            self.proc.wait()
            out = json.loads(self.out.read_text()) if self.out.exists() else {}
            _timing(f"featurisation: child done ({out.get('cpu_s', math.nan):.2f} s CPU in the child)")
            log = Path(self.tmp.name) / "log.txt"
            self.log.flush()
            lines = (
                [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
                if "ok" not in out
                else []
            )
        finally:
            self.close()
        if "error" in out:
            raise InputError(out["error"])
        if "ok" not in out:  # the child died without a result (a crash, or killed for memory)
            raise InputError(
                f"model {self.args[0].text}: featurisation failed (exit {self.proc.returncode}): "
                f"{lines[-1] if lines else 'no output'}"
            )
        return out["ok"]

    def close(self) -> None:
        """Stop the child if it still runs (an error elsewhere) and remove its files; idempotent."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.proc is not None and not self.log.closed:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
            self.tmp.cleanup()


# =========================================================================== predictors


@dataclass
class Predictor:
    """The fitted models of one (target, regressor, split) file, with the data for its intervals."""

    target: str
    regressor: str
    split: str
    path: Path
    folds: dict[str, Any]
    meta: dict[str, Any]
    mape: float | None
    n_scored: int | None
    ratios: np.ndarray | None
    ratio_set: str

    @property
    def feature_names(self) -> list[str]:
        return sorted({c for m in self.folds.values() for c in getattr(m, "feature_names_", [])})

    @property
    def is_ensemble(self) -> bool:
        return all(hasattr(m, "predict_members") for m in self.folds.values())

    def predict(self, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        """(point, lo, hi, interval method): mean of the fold predictions and its nominal 90 % interval."""
        point = np.mean([np.asarray(m.predict(X), float) for m in self.folds.values()], axis=0)
        if self.is_ensemble:
            members = np.concatenate([np.asarray(m.predict_members(X), float) for m in self.folds.values()])
            lo, hi = np.quantile(members, QUANTILES, axis=0)
            method = f"5th-95th percentile of {members.shape[0]} tree predictions"
        elif all(hasattr(m, "predict_interval") for m in self.folds.values()):
            bounds = [m.predict_interval(X) for m in self.folds.values()]
            lo, hi = (np.mean([np.asarray(b[i], float) for b in bounds], axis=0) for i in (0, 1))
            method = "conformal 90 % interval (leave-one-device-out calibration residuals), mean over folds"
        elif self.ratios is not None and len(self.ratios):
            r05, r95 = np.quantile(self.ratios, QUANTILES)
            lo, hi = point / r95, point / r05
            method = (
                f"5th-95th percentile of y_pred/y_true on {len(self.ratios)} held-out {self.ratio_set} "
                f"rows of split {self.split}"
            )
        else:
            lo = hi = np.full_like(point, np.nan)
            method = "no held-out rows to estimate an interval"
        return point, np.fmin(lo, point), np.fmax(hi, point), method


def _require_outputs(results: Path) -> None:
    for needed in ("evaluate/metrics.parquet", "dataset/dataset.parquet"):
        if not (results / needed).is_file():
            raise InputError(
                f"{results / needed}: not found, so there are no fitted predictors yet; {RUN_WORKFLOW}"
            )


# Predictors that need per-layer timings of the very model they predict, which a new model lacks.
NEEDS_PROFILED_LAYERS = ("gianniti_layer",)


def _choose_file(
    metrics: pd.DataFrame, results: Path, target: str, preferred_split: str = PREFERRED_SPLIT
) -> tuple[str, str, float | None, int | None]:
    """(regressor, split, mape, n) of the best-scored existing predictor file of ``target``, by its score
    on ``preferred_split`` where that split was evaluated."""
    rows = metrics[
        (metrics["target"] == target)
        & np.isfinite(pd.to_numeric(metrics["mape"], errors="coerce"))
        & ~metrics["regressor"].isin(NEEDS_PROFILED_LAYERS)
    ]
    rows = rows[
        [
            (results / "fit" / target / r / f"{s}.models.json").is_file()
            for r, s in zip(rows["regressor"], rows["split"], strict=True)
        ]
    ]
    if len(rows):
        preferred = rows[rows["split"] == preferred_split]
        best = (preferred if len(preferred) else rows).sort_values(["mape", "regressor", "split"]).iloc[0]
        n = pd.to_numeric(best.get("n"), errors="coerce")
        return str(best["regressor"]), str(best["split"]), float(best["mape"]), None if pd.isna(n) else int(n)
    files = sorted(
        (p for p in (results / "fit" / target).glob("*/*.models.json") if p.parent.name not in NEEDS_PROFILED_LAYERS),
        key=lambda p: (p.name != f"{preferred_split}.models.json", str(p)),
    )
    if files:  # fitted, but no held-out score (e.g. a split without test rows)
        return files[0].parent.name, files[0].name.removesuffix(".models.json"), None, None
    return "", "", None, None


def load_predictors(
    results: Path, data: pd.DataFrame, preferred_split: str = PREFERRED_SPLIT
) -> tuple[dict[str, Predictor], dict[str, str]]:
    """The chosen predictor of every target (best score on ``preferred_split`` where evaluated), and the
    reason for every target without one."""
    from perfzoo.fitting import load_models
    from perfzoo.io import read_parquet

    metrics = read_parquet(results / "evaluate" / "metrics.parquet")
    found: dict[str, Predictor] = {}
    missing: dict[str, str] = {}
    for target in TARGETS:
        regressor, split, score, n = (
            _choose_file(metrics, results, target, preferred_split) if len(metrics) else ("", "", None, None)
        )
        if not regressor:
            missing[target] = _no_predictor_reason(results, data, target)
            continue
        path = results / "fit" / target / regressor / f"{split}.models.json"
        try:
            folds, meta = load_models(path)
        except InputError as exc:  # one unreadable predictor file: that target is missing, the rest stand
            missing[target] = str(exc)
            continue
        if not folds:
            missing[target] = f"{path} holds no fitted fold ({meta.get('config', {}).get('notes', '')})"
            continue
        ratios, ratio_set = _held_out_ratios(path.with_name(f"{split}.predictions.parquet"))
        found[target] = Predictor(target, regressor, split, path, folds, meta, score, n, ratios, ratio_set)
    return found, missing


def _no_predictor_reason(results: Path, data: pd.DataFrame, target: str) -> str:
    if target in data.columns and not (pd.to_numeric(data[target], errors="coerce") > 0).any():
        reasons = data.get("energy_missing_reason")
        why = (
            [r for r in reasons.dropna().unique() if str(r).strip()]
            if reasons is not None and target not in ("latency_ms", "throughput", "peak_mem_mb")
            else []
        )
        detail = f": {'; '.join(map(str, why))}" if len(why) else ""
        return f"no {target} measurement in the dataset{detail}"
    if not (results / "fit" / target).is_dir():
        return f"no fitted predictor: {target} is not among the config's fit.targets"
    return f"no fitted predictor under {results / 'fit' / target}/; {RUN_WORKFLOW}"


def _held_out_ratios(path: Path) -> tuple[np.ndarray | None, str]:
    """y_pred / y_true of the test rows (else validation rows) of a fit's held-out predictions."""
    if not path.is_file():
        return None, ""
    held = pd.read_parquet(path, columns=["set", "y_true", "y_pred"])
    for which in ("test", "val"):
        rows = held[held["set"] == which]
        y, p = rows["y_true"].to_numpy(float), rows["y_pred"].to_numpy(float)
        ok = np.isfinite(y) & np.isfinite(p) & (y > 0) & (p > 0)
        if ok.any():
            return p[ok] / y[ok], which
    return None, ""


# =========================================================================== devices and config


def _load_config(config: Any, results: Path) -> tuple[dict[str, Any], str | None]:
    """(config dict, its path); the default 'config.yaml' may be absent (devices then come from results)."""
    if isinstance(config, Mapping):
        return dict(config), None
    import yaml

    path = Path(config)
    if not path.is_file() and str(config) == "config.yaml":
        path = results.resolve().parent / "config.yaml"
        if not path.is_file():
            return {}, None
    try:
        loaded = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{config}: config file not found") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{config}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("devices", {}), dict):
        raise InputError(f"{config}: expected a mapping with a 'devices' mapping")
    return loaded, str(path)


def _select_devices(requested: Any, configured: Mapping[str, Any], hardware: Mapping[str, Path]) -> list[str]:

    known = sorted(configured) if configured else sorted(hardware)
    if requested is None or requested == "" or requested == []:
        if not known:
            raise InputError(
                f"no devices: no config 'devices:' and no results/hardware/*.json; {RUN_WORKFLOW}"
            )
        return known
    names = [
        d.strip() for d in (requested.split(",") if isinstance(requested, str) else requested) if d.strip()
    ]
    if not names:
        raise InputError(f"--devices: no device named in {requested!r}; known devices: {', '.join(known) or 'none'}")
    for name in names:
        if name not in configured and name not in hardware:
            raise InputError(
                f"--devices: unknown device {name!r}{suggest(name, [*configured, *hardware])}; "
                f"known devices: {', '.join(known) or 'none'}"
            )
    return list(dict.fromkeys(names))


def _device_row(
    device: str, hw: dict[str, Any] | None, feats: dict[str, Any], batch: int, mode: str, model_id: str
) -> dict[str, Any] | str:
    """The predictors' input row of ``device``, or the reason it cannot be built."""
    from perfzoo.dataset import MODEL_FEATURES
    from perfzoo.hardware import hardware_features

    if hw is None:
        return (
            f"no results/hardware/{device}.json (run `snakemake --cores all results/hardware/{device}.json`)"
        )
    try:
        hw_cols = hardware_features(hw)
    except (KeyError, TypeError, ValueError) as exc:
        return f"results/hardware/{device}.json lacks hardware feature {exc}"
    row = {k: feats[k] for k in MODEL_FEATURES if k in feats}
    row.update(batch=batch, is_training=float(mode == "training"), **hw_cols)
    # the power limit in force: a hardware feature of datasets with a power-limit sweep
    limit = hw.get("power_limit_w")
    row["hw_power_limit_w"] = float(limit) if isinstance(limit, int | float) else math.nan
    row.update(device=device, model_id=model_id, mode=mode)
    return row


# =========================================================================== quantities


def _q(value: float, lo: float, hi: float, source: str, interval: str) -> dict[str, Any]:
    return {"value": float(value), "lo": float(lo), "hi": float(hi), "source": source, "interval": interval}


def _miss(reason: str) -> dict[str, Any]:
    return {"value": math.nan, "lo": math.nan, "hi": math.nan, "missing": reason}


def _present(q: dict[str, Any] | None) -> bool:
    return q is not None and "missing" not in q and math.isfinite(q["value"])


def _target_predictions(X: pd.DataFrame, predictors: Mapping[str, Predictor]) -> dict[str, Any]:
    """target -> (point, lo, hi, method) arrays over the rows of X, or the reason it failed."""
    import warnings

    out: dict[str, Any] = {}
    for target, pred in predictors.items():
        try:  # overflow far outside the training range gives inf, reported per quantity
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                out[target] = pred.predict(X)
        except Exception as exc:  # noqa: BLE001 - a predictor that cannot handle these rows is reported
            out[target] = f"{pred.path}: prediction failed ({one_line(exc)})"
    return out


def _label_gaps(data: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(device, target) pairs the dataset has rows for but no label of: why the label is missing there."""
    gaps = {}
    for device, rows in data.groupby("device"):
        for target in TARGETS:
            if target not in rows.columns or (pd.to_numeric(rows[target], errors="coerce") > 0).any():
                continue
            reason = "no measurement on this device"
            if "energy_missing_reason" in rows.columns and target not in (
                "latency_ms",
                "throughput",
                "peak_mem_mb",
            ):
                why = [r for r in rows["energy_missing_reason"].dropna().unique() if str(r).strip()]
                reason = f"not measured on {device}: {why[0]}" if len(why) else reason
            gaps[(str(device), target)] = reason
    return gaps


def _row_quantities(
    i: int,
    device: str,
    tp: Mapping[str, Any],
    predictors: Mapping[str, Predictor],
    missing_targets: Mapping[str, str],
    gaps: Mapping[tuple[str, str], str],
    batch: int,
    device_cfg: Mapping[str, Any],
    config_path: str | None,
) -> dict[str, dict[str, Any]]:
    """Every quantity of one input row (predicted, derived, or missing with the reason)."""
    q: dict[str, dict[str, Any]] = {}
    for target in TARGETS:
        if (device, target) in gaps:
            q[target] = _miss(gaps[(device, target)])
        elif target in missing_targets:
            q[target] = _miss(missing_targets[target])
        elif target not in tp:
            q[target] = _miss("no fitted predictor")
        elif isinstance(tp[target], str):
            q[target] = _miss(tp[target])
        else:
            point, lo, hi, method = tp[target]
            p = predictors[target]
            if not (math.isfinite(point[i]) and point[i] > 0):
                why = "a number > 0" if math.isfinite(point[i]) else "a finite number (it overflows this far"
                why += "" if math.isfinite(point[i]) else " outside the profiled range)"
                q[target] = _miss(f"{p.path} predicted {point[i]:.4g} instead of {why}")
            else:
                q[target] = _q(point[i], lo[i], hi[i], f"{p.regressor}/{p.split}", method)

    def derive(name: str, how: str, f: Callable[..., float], *inputs: dict[str, Any]) -> None:
        """``q[name] = f(inputs)``; f is monotone in each input, so its interval spans the values at the
        inputs' lower and upper ends."""
        at_lo, at_hi = f(*(x["lo"] for x in inputs)), f(*(x["hi"] for x in inputs))
        q[name] = _q(
            f(*(x["value"] for x in inputs)), min(at_lo, at_hi), max(at_lo, at_hi), f"derived: {how}",
            "propagated from the intervals of its inputs",
        )

    lat = q["latency_ms"]
    if not _present(q["throughput"]) and _present(lat) and (device, "throughput") not in gaps:
        derive("throughput", "batch / latency_ms", lambda t: batch * 1000 / t, lat)
    if not _present(q["energy_j"]) and (device, "energy_j") not in gaps:
        if _present(q["mean_power_w"]) and _present(lat):
            derive("energy_j", "mean_power_w x latency_ms", lambda w, t: w * t / 1e3, q["mean_power_w"], lat)
        elif _present(q["energy_per_sample_j"]):
            derive("energy_j", "energy_per_sample_j x batch", lambda e: e * batch, q["energy_per_sample_j"])
        else:
            q["energy_j"] = _miss(
                f"needs an energy_j or mean_power_w prediction: {q['mean_power_w'].get('missing')}"
            )
    if not _present(q["energy_per_sample_j"]) and _present(q["energy_j"]):
        derive("energy_per_sample_j", "energy_j / batch", lambda e: e / batch, q["energy_j"])
    if not _present(q["edp"]) and _present(q["energy_j"]) and _present(lat):
        derive(
            "edp", "energy_j x latency_ms / 1000 (J·s per step)", lambda e, t: e * t / 1e3, q["energy_j"], lat
        )
    elif not _present(q["edp"]):
        q["edp"] = _miss(f"needs energy and latency: {q['energy_j'].get('missing') or lat.get('missing')}")

    price = device_cfg.get("price_per_hour")
    if price is None:
        where = config_path or "the config"
        q["cost_per_1k_samples"] = _miss(
            f"no devices.{device}.price_per_hour in {where} or its hardware JSON"
        )
    elif _present(lat):
        k = float(price) * 1000 / batch / 3.6e6  # price per ms, for 1000 samples
        derive("cost_per_1k_samples", f"price_per_hour {price} x time of 1000 samples", lambda t: t * k, lat)
    else:
        q["cost_per_1k_samples"] = _miss(f"needs latency: {lat.get('missing')}")
    ci = float(device_cfg.get("carbon_intensity_g_per_kwh", DEFAULT_CARBON_INTENSITY))
    if _present(q["energy_per_sample_j"]):
        g_per_j = 1000 * ci / 3.6e6  # for 1000 samples
        derive(
            "carbon_g_per_1k_samples", f"energy x carbon intensity {ci:g} g/kWh", lambda e: e * g_per_j,
            q["energy_per_sample_j"],
        )
    else:
        q["carbon_g_per_1k_samples"] = _miss(f"needs energy: {q['energy_per_sample_j'].get('missing')}")
    return q


# =========================================================================== MIG, power cap, recommendation


def _device_settings(device_cfg: Mapping[str, Any], hw: Mapping[str, Any] | None) -> dict[str, Any]:
    """The device's config entry, with price and carbon intensity falling back to its hardware JSON
    (which records them from the config of the run that measured it) and the schema default."""
    settings = {k: v for k, v in device_cfg.items() if v is not None}
    for key in ("price_per_hour", "carbon_intensity_g_per_kwh"):
        if settings.get(key) is None and (hw or {}).get(key) is not None:
            settings[key] = hw[key]  # type: ignore[index]
    settings.setdefault("carbon_intensity_g_per_kwh", DEFAULT_CARBON_INTENSITY)
    return settings


def _kind(device_cfg: Mapping[str, Any], hw: Mapping[str, Any] | None) -> str:
    return str(device_cfg.get("kind") or (hw or {}).get("kind") or "unknown")


def _mig(
    device_cfg: Mapping[str, Any],
    hw: Mapping[str, Any] | None,
    q: Mapping[str, dict[str, Any]],
    latency_target_ms: float | None,
) -> dict[str, Any] | None:
    """recommend_mig for a cuda device whose GPU has MIG profile tables; None for other devices."""
    from perfzoo.hardware.mig import recommend_mig, resolve_mig_gpu

    if _kind(device_cfg, hw) != "cuda":
        return None
    spec_row = (hw or {}).get("spec")
    names = [
        (hw or {}).get("name"),
        spec_row.get("name") if isinstance(spec_row, Mapping) else None,
        device_cfg.get("spec"),
        device_cfg.get("gpu_name"),
    ]
    if device_cfg.get("spec"):
        try:
            from perfzoo.hardware.specs import lookup_gpu

            names.insert(2, lookup_gpu(device_cfg["spec"])["name"])
        except InputError:
            pass
    gpu = None
    for name in filter(None, names):
        try:
            gpu = resolve_mig_gpu(str(name))
            break
        except InputError:
            continue
    if gpu is None:
        return {"profile": None, "reason": f"no MIG profile table for GPU {next(filter(None, names), '?')!r}"}
    mem, lat = q["peak_mem_mb"], q["latency_ms"]
    if not _present(mem):
        return {"gpu": gpu, "profile": None, "reason": f"no peak memory prediction: {mem.get('missing')}"}
    target = latency_target_ms if _present(lat) else None
    return recommend_mig(gpu, mem["value"], lat["value"] if _present(lat) else None, target)


def _power_cap(
    device: str,
    row: dict[str, Any],
    device_cfg: Mapping[str, Any],
    q: Mapping[str, dict[str, Any]],
    ctx: dict[str, Any],
) -> dict[str, Any] | None:
    """Power limit of ``devices.<d>.power_limits_w`` with the lowest predicted energy (EDP for objective
    edp) that meets the latency target; needs energy predictors with a power-limit feature."""
    limits = [float(x) for x in device_cfg.get("power_limits_w") or []]
    if not limits:
        return None
    if not _present(q["energy_per_sample_j"]):
        return {
            "power_cap_w": None,
            "reason": f"no energy prediction: {q['energy_per_sample_j'].get('missing')}",
        }
    predictors: Mapping[str, Predictor] = ctx["predictors"]
    energy = [predictors[t] for t in ("energy_per_sample_j", "energy_j", "mean_power_w") if t in predictors]
    cols = sorted({c for p in energy for c in p.feature_names if "power_limit" in c})
    if not cols:
        return {
            "power_cap_w": None,
            "reason": "the energy predictors have no power-limit feature (the dataset holds "
            "no power-limit sweep), so energy cannot be predicted per cap",
        }
    X = pd.DataFrame([{**row, **{c: limit for c in cols}} for limit in limits])
    tp = _target_predictions(_with_roofline(X), predictors)
    metric = "edp" if ctx["objective"] == "edp" else "energy_per_sample_j"
    options = []
    for i, limit in enumerate(limits):
        qi = _row_quantities(
            i, device, tp, predictors, ctx["missing"], ctx["gaps"], ctx["batch"], device_cfg, None
        )
        ok_latency = ctx["latency_target_ms"] is None or (
            _present(qi["latency_ms"]) and qi["latency_ms"]["value"] <= ctx["latency_target_ms"]
        )
        options.append(
            {
                "power_limit_w": limit,
                metric: qi[metric]["value"],
                "latency_ms": qi["latency_ms"]["value"],
                "meets_latency_target": ok_latency,
            }
        )
    usable = [o for o in options if o["meets_latency_target"] and math.isfinite(o[metric])]
    if not usable:
        return {"power_cap_w": None, "reason": "no power limit meets the latency target", "options": options}
    best = min(usable, key=lambda o: o[metric])
    return {
        "power_cap_w": best["power_limit_w"],
        "metric": metric,
        "reason": f"lowest predicted {metric}",
        "options": options,
    }


def _recommend(
    devices: Sequence[str],
    quantities: Mapping[str, dict[str, dict[str, Any]]],
    objective: str,
    latency_target_ms: float | None,
    memory_mb: Mapping[str, float],
) -> dict[str, Any]:
    metric = OBJECTIVES[objective]
    excluded: dict[str, str] = {}
    ranked = []
    for d in devices:
        q = quantities.get(d)
        if q is None:
            excluded[d] = "no prediction for this device"
            continue
        m = q[metric]
        if not _present(m):
            excluded[d] = f"{metric} missing: {m.get('missing')}"
            continue
        mem, cap = q["peak_mem_mb"], memory_mb.get(d)
        if _present(mem) and cap is not None and mem["value"] > cap:
            excluded[d] = f"predicted peak memory {mem['value']:.0f} MB exceeds the device's {cap:.0f} MB"
            continue
        if (
            latency_target_ms is not None
            and _present(q["latency_ms"])
            and q["latency_ms"]["value"] > latency_target_ms
        ):
            excluded[d] = (
                f"predicted latency {q['latency_ms']['value']:.4g} ms exceeds the target "
                f"{latency_target_ms:g} ms"
            )
            continue
        ranked.append((m["value"], d))
    ranked.sort()
    result: dict[str, Any] = {
        "objective": objective,
        "metric": metric,
        "device": None,
        "ranking": [d for _, d in ranked],
        "excluded": excluded,
        "latency_target_ms": latency_target_ms,
    }
    if not ranked:
        result["reason"] = "no device qualifies (see 'excluded' for why each device was left out)"
        return result
    best = ranked[0][1]
    b = quantities[best][metric]
    result.update(
        device=best,
        value=b["value"],
        lo=b["lo"],
        hi=b["hi"],
        unit=UNITS[metric],
        reason=f"lowest predicted {metric} among {len(ranked)} device(s)",
    )
    if len(ranked) > 1:
        second = quantities[ranked[1][1]][metric]
        overlap = math.isfinite(b["hi"]) and math.isfinite(second["lo"]) and b["hi"] >= second["lo"]
        result["runner_up"] = ranked[1][1]
        result["intervals_overlap"] = bool(overlap)
        if overlap:
            result["reason"] += f"; its interval overlaps {ranked[1][1]}'s, so the ranking is uncertain"
    return result


# =========================================================================== warnings


def _prefix(name: str) -> str:
    m = re.match(r"[a-z]+", name.lower())
    return m.group(0) if m else ""


def _family_profiled(candidates: Sequence[str], data: pd.DataFrame) -> bool:
    families = {str(f).lower() for f in data.get("family", pd.Series(dtype=str)).dropna().unique()}
    names = {str(n).lower() for n in data.get("name", pd.Series(dtype=str)).dropna().unique()}
    names |= {
        str(label).split("@")[0].split("-")[0].lower()
        for label in data.get("label", pd.Series(dtype=str)).dropna()
    }
    stems = families | {_prefix(n) for n in names}
    for cand in filter(None, (c.lower() for c in candidates)):
        if cand in families or cand in names:
            return True
        p = _prefix(cand)
        if any(s and len(s) >= 3 and len(p) >= 3 and (p.startswith(s) or s.startswith(p)) for s in stems):
            return True
    return False


def _range_warnings(
    spec: ModelSpec,
    class_name: str,
    feats: Mapping[str, Any],
    batch: int,
    mode: str,
    data: pd.DataFrame,
    devices: Sequence[str],
) -> list[str]:
    warnings = []
    same_mode = data[data["mode"] == mode]
    if same_mode.empty:
        warnings.append(f"mode {mode!r} was never profiled: every number extrapolates")
        same_mode = data
    for col, ref in (("flops", same_mode), ("params", data)):
        values = (
            pd.to_numeric(ref[col], errors="coerce").dropna()
            if col in ref.columns
            else pd.Series(dtype=float)
        )
        v = feats.get(col)
        if len(values) and v is not None and math.isfinite(float(v)):
            lo, hi = float(values.min()), float(values.max())
            if float(v) > hi or float(v) < lo:
                warnings.append(
                    f"{col} {float(v):.3g} is outside the profiled range [{lo:.3g}, {hi:.3g}]"
                    f"{' of ' + mode + ' rows' if col == 'flops' else ''}: the prediction extrapolates"
                )
    batches = pd.to_numeric(data["batch"], errors="coerce").dropna()
    if len(batches) and batch > batches.max():
        warnings.append(
            f"batch {batch} is beyond the largest profiled batch ({int(batches.max())}): "
            "the prediction extrapolates"
        )
    elif len(batches) and batch < batches.min():
        warnings.append(f"batch {batch} is below the smallest profiled batch ({int(batches.min())})")
    candidates = [spec.name.split(":")[-1], class_name]
    if not _family_profiled(candidates, data):
        fams = ", ".join(sorted(map(str, data["family"].dropna().unique()))) if "family" in data else ""
        warnings.append(
            f"the family of {spec.text} ({class_name}) was never profiled (profiled families: {fams}): "
            "errors on unseen model families are much larger (23-99 % MAPE in the DIPPM study of unseen applications)"
        )
    profiled = set(data["device"].astype(str))
    for d in devices:
        if d not in profiled:
            warnings.append(
                f"device {d} has no profiled rows: its numbers extrapolate from hardware features alone"
            )
    return warnings


# =========================================================================== result


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf → None, numpy scalars → Python, tuples → lists, paths → str."""
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | np.ndarray):
        return [_clean(v) for v in obj]
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _float(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@dataclass
class Prediction:
    """A prediction: ``table`` (one row per device), ``recommendation``, ``warnings`` and the full
    JSON-ready ``record`` (with provenance)."""

    record: dict[str, Any]
    table: pd.DataFrame

    @property
    def recommendation(self) -> dict[str, Any]:
        return self.record["recommendation"]

    @property
    def warnings(self) -> list[str]:
        return self.record["warnings"]

    def to_dict(self) -> dict[str, Any]:
        return _clean(self.record)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, allow_nan=False)

    def save(self, path: str | Path) -> Path:
        """Write the record as JSON, atomically."""
        from perfzoo.io import write_text

        write_text(path, self.to_json() + "\n")
        return Path(path)

    def to_text(self) -> str:
        r = self.record
        m = r["model"]
        head = (
            f"perfzoo predict {m['text']}: batch {m['batch']}, input {'x'.join(map(str, m['input_shape']))} "
            f"({m['dtype']}), {m['mode']}, objective {r['objective']}"
        )
        f = r["features"]
        summary = (
            f"  features (meta device): {_fmt(_float(f.get('flops')))} FLOPs per step, "
            f"{_fmt(_float(f.get('params')))} parameters, {f.get('n_layers')} layers"
        )
        lines = [head, summary]
        labels = {
            "latency_ms": "step time (ms)" if m["mode"] == "training" else "latency (ms)",
            "throughput": "throughput (samples/s)",
            "peak_mem_mb": "peak memory (MB)",
            "mean_power_w": "power (W)",
            "energy_per_sample_j": "energy per sample (J)",
            "edp": "EDP (J·s per step)",
            "cost_per_1k_samples": "cost per 1k samples",
            "carbon_g_per_1k_samples": "carbon per 1k samples (g)",
        }
        for device, entry in r["devices"].items():
            lines.append("")
            lines.append(f"device {device} ({entry['kind']})")
            if entry.get("missing"):
                lines.append(f"  missing: {entry['missing']}")
                continue
            lines.append(f"  {'quantity':<27} {'prediction':>11}  {'90% interval':<23} source")
            for key, label in labels.items():
                q = entry["quantities"][key]
                if "missing" in q:
                    lines.append(f"  {label:<27} {'missing':>11}  {q['missing']}")
                    continue
                interval = "out of range" if q.get("out_of_range") else f"[{_fmt(q['lo'])}, {_fmt(q['hi'])}]"
                lines.append(f"  {label:<27} {_fmt(q['value']):>11}  {interval:<23} {q['source']}")
            mig = entry.get("mig")
            if mig is not None:
                lines.append(
                    f"  {'MIG profile':<27} {mig.get('profile') or 'none'!s:>11}  {mig.get('reason', '')}"
                )
            cap = entry.get("power_cap")
            if cap is not None:
                lines.append(
                    f"  {'power cap (W)':<27} {_fmt(cap.get('power_cap_w')):>11}  {cap.get('reason', '')}"
                )
        rec = r["recommendation"]
        lines.append("")
        if rec["device"]:
            lines.append(
                f"recommended device ({rec['objective']}): {rec['device']}  {rec['metric']} "
                f"{_fmt(rec['value'])} {rec['unit']} [{_fmt(rec['lo'])}, {_fmt(rec['hi'])}]; {rec['reason']}"
            )
        else:
            lines.append(f"recommended device ({rec['objective']}): none; {rec['reason']}")
        for d, why in rec["excluded"].items():
            lines.append(f"  excluded {d}: {why}")
        lines.append(f"predictors ({r.get('predictor_choice', '')}):")
        for target, p in r["predictors"].items():
            score = (
                f"MAPE {p['validation_mape']:.3g} % on {p['split']}"
                if p["validation_mape"] is not None
                else "no held-out score"
            )
            lines.append(f"  {target:<20} {p['path']} ({score}; sha256 {p['sha256'][:12]}…)")
        for target, why in r["missing_targets"].items():
            lines.append(f"  {target:<20} missing: {why}")
        if r["warnings"]:
            lines.append("warnings:")
            lines.extend(f"  - {w}" for w in r["warnings"])
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


# =========================================================================== entry points


def _check_options(batch: Any, mode: str, objective: str, latency_target_ms: Any) -> tuple[int, float | None]:
    try:
        b = int(batch)
        if b < 1 or float(batch) != b:
            raise ValueError
    except (TypeError, ValueError):
        raise InputError(f"--batch: expected a positive integer, got {batch!r}") from None
    if mode not in MODES:
        raise InputError(f"--mode: expected one of {', '.join(MODES)}, got {mode!r}")
    if objective not in OBJECTIVES:
        raise InputError(f"--objective: expected one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if latency_target_ms is not None:
        try:
            t = float(latency_target_ms)
            if not (math.isfinite(t) and t > 0):
                raise ValueError
        except (TypeError, ValueError):
            raise InputError(
                f"--latency-target: expected a positive number of ms, got {latency_target_ms!r}"
            ) from None
        return b, t
    return b, None


def _with_roofline(X: pd.DataFrame) -> pd.DataFrame:
    from perfzoo.dataset import add_roofline_features

    return add_roofline_features(X.copy())


def _key(path: Path, workdir: Path) -> str:
    """A path as the workflow records it: relative to the workflow directory when inside it."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(workdir).as_posix()
    except ValueError:
        return str(absolute)


def _provenance(
    results: Path,
    workdir: Path,
    predictors: Mapping[str, Predictor],
    hw_files: Mapping[str, Path],
    devices: Sequence[str],
    spec: ModelSpec,
) -> tuple[dict[str, str], dict[str, str], dict[str, Any], list[str]]:
    """(sha256 of every file read, recorded chain behind them, predictor records, warnings)."""
    from perfzoo.audit import provenance_chain
    from perfzoo.provenance import sha256_file

    metrics, dataset = results / "evaluate" / "metrics.parquet", results / "dataset" / "dataset.parquet"
    inputs = {_key(metrics, workdir): metrics, _key(dataset, workdir): dataset}
    for p in predictors.values():
        inputs[_key(p.path, workdir)] = p.path
        held = p.path.with_name(f"{p.split}.predictions.parquet")
        if held.is_file():
            inputs[_key(held, workdir)] = held
    inputs.update({_key(hw_files[d], workdir): hw_files[d] for d in devices if d in hw_files})
    if spec.file:
        inputs[_key(Path(spec.file), workdir)] = Path(spec.file)
    hashes = {k: sha256_file(p) for k, p in sorted(inputs.items())}
    chain = provenance_chain(inputs, workdir)
    records, warnings = {}, []
    for target, p in predictors.items():
        key = _key(p.path, workdir)
        fitted_on = dict(p.meta.get("inputs", {}))
        dataset_sha = next((v for k, v in fitted_on.items() if k.endswith("dataset.parquet")), None)
        if dataset_sha is not None and dataset_sha != hashes[_key(dataset, workdir)]:
            warnings.append(
                f"{key} was fitted on a different {_key(dataset, workdir)} than the current one; "
                f"{RUN_WORKFLOW.replace('first', 'to refit')}"
            )
        records[target] = {
            "path": key,
            "sha256": hashes[key],
            "regressor": p.regressor,
            "split": p.split,
            "folds": sorted(p.folds),
            "validation_mape": p.mape,
            "validation_n": p.n_scored,
            "interval": "tree members" if p.is_ensemble else "held-out residual ratios",
            "fitted_on": fitted_on,
            "dataset_sha256": dataset_sha,
            "code_version": p.meta.get("code_version"),
        }
    return hashes, chain, records, warnings


def _device_entries(
    names: Sequence[str],
    rows: Mapping[str, dict[str, Any]],
    device_missing: Mapping[str, str],
    X: pd.DataFrame,
    configured: Mapping[str, Any],
    hardware: Mapping[str, Any],
    config_path: str | None,
    ctx: dict[str, Any],
) -> dict[str, Any]:
    """Quantities, MIG profile and power cap of every device (in ``names`` order)."""
    predictors = ctx["predictors"]
    tp = bound_predictions(_target_predictions(X, predictors), X, ctx["out_of_range"]) if rows else {}
    entries: dict[str, Any] = {}
    for i, d in enumerate(rows):
        settings = _device_settings(configured.get(d) or {}, hardware.get(d))
        q = _row_quantities(
            i, d, tp, predictors, ctx["missing"], ctx["gaps"], ctx["batch"], settings, config_path
        )
        mark_out_of_range(q, ctx["out_of_range"])
        entries[d] = {
            "kind": _kind(settings, hardware.get(d)),
            "quantities": q,
            "mig": _mig(settings, hardware.get(d), q, ctx["latency_target_ms"]),
            "power_cap": _power_cap(d, rows[d], settings, q, ctx),
        }
    for d, why in device_missing.items():
        entries[d] = {
            "kind": _kind(configured.get(d) or {}, hardware.get(d)),
            "missing": why,
            "quantities": {k: _miss(why) for k in QUANTITIES},
            "mig": None,
            "power_cap": None,
        }
    return {d: entries[d] for d in names}


def predict(
    model_or_name: Any,
    batch: int = 1,
    input_shape: Any = None,
    mode: str = "inference",
    devices: Sequence[str] | str | None = None,
    objective: str = "time",
    latency_target_ms: float | None = None,
    results: str | Path = "results",
    config: str | Path | Mapping[str, Any] = "config.yaml",
    num_classes: int | None = None,
    use_server: bool = False,
) -> Prediction:
    """Predict latency/step time, throughput, peak memory, power, energy, EDP, cost and carbon of a model
    on every device, with intervals, a recommended device for ``objective`` (time, energy, edp, cost),
    MIG profiles and power caps, extrapolation warnings and provenance. See the module docstring.

    ``model_or_name``: ``timm:NAME``, ``torchvision:NAME``, ``mlp:NAME``, ``transformer:NAME``,
    ``path/to/model.py:function``, an ``nn.Module`` instance or a function building one.
    ``input_shape``: per sample, e.g. ``(3, 224, 224)``, ``"3,224,224"`` or a sequence length.
    ``results``/``config``: the workflow's results folder and config (path or dict).
    ``use_server``: featurise through the warm featuriser server of this environment, and start one
    when none runs (the CLI's choice; see :mod:`perfzoo.featuriser_server`).
    """
    from perfzoo.io import read_json, read_parquet
    from perfzoo.provenance import code_version, package_versions

    batch, latency_target_ms = _check_options(batch, mode, objective, latency_target_ms)
    results = Path(results)
    _require_outputs(results)
    spec = resolve_model(model_or_name, input_shape)
    cfg, config_path = _load_config(config, results)
    if num_classes is None:
        num_classes = int((cfg.get("zoo") or {}).get("num_classes") or DEFAULT_NUM_CLASSES)
    elif int(num_classes) < 1:
        raise InputError(f"--num-classes: expected a classifier head of at least 1 class, got {num_classes}")
    # the featurisation (torch, timm/torchvision, the meta-device step) overlaps with everything
    # below when it runs in a child process
    featuriser = _Featuriser(spec, batch, mode, num_classes, _child_strategy(spec), use_server)
    try:
        workdir = Path(os.path.abspath(results)).parent
        configured = cfg.get("devices") or {}
        hw_files = {p.stem: p for p in sorted((results / "hardware").glob("*.json"))}
        names = _select_devices(devices, configured, hw_files)
        data = read_parquet(results / "dataset" / "dataset.parquet")
        _timing("config, devices, dataset")
        predictors, missing_targets = load_predictors(results, data)
        _timing("predictors loaded")
        if not predictors:
            raise InputError(f"{results / 'fit'}: no fitted predictor for any target; {RUN_WORKFLOW}")
        hardware = {d: read_json(hw_files[d]) for d in names if d in hw_files}
        hashes, chain, predictor_records, stale = _provenance(
            results, workdir, predictors, hw_files, names, spec
        )
        packages, version = package_versions(), code_version()
        _timing("provenance")
        featurised = featuriser.result()
    finally:
        featuriser.close()
    if featuriser.start_server_after:
        from perfzoo import featuriser_server

        featuriser_server.start_server(featuriser.server_path)
    feats = featurised["features"]
    spec.dtype = featurised["dtype"]
    choice = f"best held-out MAPE on the {PREFERRED_SPLIT} split"
    if not _family_profiled([spec.name.split(":")[-1], featurised["class_name"]], data):
        # a family never profiled: the scores that matter are those with whole families held out
        unseen, _ = load_predictors(results, data, UNSEEN_FAMILY_SPLIT)
        swapped = {t: p for t, p in unseen.items() if p.split == UNSEEN_FAMILY_SPLIT and t in predictors}
        if swapped:
            predictors.update(swapped)
            hashes, chain, predictor_records, stale = _provenance(
                results, workdir, predictors, hw_files, names, spec
            )
            choice = (
                f"best held-out MAPE on the {UNSEEN_FAMILY_SPLIT} split, as the model's family was never "
                f"profiled ({', '.join(sorted(swapped))})"
            )

    rows, device_missing = {}, {}
    for d in names:
        row = _device_row(d, hardware.get(d), feats, batch, mode, spec.text)
        if isinstance(row, str):
            device_missing[d] = row
        else:
            rows[d] = row
    if not rows:  # nothing to predict on: an error, not an empty answer
        raise InputError(f"no device to predict on: {'; '.join(f'{d}: {w}' for d, w in device_missing.items())}")
    X = _with_roofline(pd.DataFrame(list(rows.values()))) if rows else pd.DataFrame()
    ctx = {
        "predictors": predictors,
        "missing": missing_targets,
        "gaps": _label_gaps(data),
        "batch": batch,
        "objective": objective,
        "latency_target_ms": latency_target_ms,
        "out_of_range": range_check(feats, batch, mode, data),
    }
    entries = _device_entries(names, rows, device_missing, X, configured, hardware, config_path, ctx)
    quantities = {d: e["quantities"] for d, e in entries.items() if "missing" not in e}
    memory_mb = {
        d: float(h["memory_gb"]) * 1024
        for d, h in hardware.items()
        if isinstance(h.get("memory_gb"), int | float)
    }
    recommendation = _recommend(names, quantities, objective, latency_target_ms, memory_mb)
    qualify_recommendation(recommendation, quantities)
    warnings = [*_range_warnings(spec, featurised["class_name"], feats, batch, mode, data, names), *stale]
    dataset_key = _key(results / "dataset" / "dataset.parquet", workdir)
    model = {**spec.to_dict(), "batch": batch, "mode": mode, "num_classes": num_classes}
    record: dict[str, Any] = {
        "model": {**model, "class_name": featurised["class_name"]},
        "objective": objective,
        "latency_target_ms": latency_target_ms,
        "features": feats,
        "featurised_by": featuriser.method,
        "devices": entries,
        "recommendation": recommendation,
        "warnings": warnings,
        "predictors": predictor_records,
        "predictor_choice": choice,
        "missing_targets": missing_targets,
        "dataset": {"path": dataset_key, "sha256": hashes[dataset_key]},
        "feature_rows": {d: dict(X.iloc[i].items()) for i, d in enumerate(rows)},
        "units": UNITS,
        "provenance": {
            "inputs": hashes,
            "chain": chain,
            "traces": {k: v for k, v in chain.items() if "/traces/" in f"/{k}"},
            "config": {
                "devices": {d: configured.get(d, {}) for d in names},
                "zoo": {"num_classes": num_classes},
                "config_file": config_path,
            },
            "code_version": version,
            "packages": packages,
            "workdir": str(workdir),
        },
    }
    _timing("predictions")
    return Prediction(_clean(record), _table(entries))


def _table(entries: Mapping[str, Any]) -> pd.DataFrame:
    rows = []
    for device, entry in entries.items():
        row: dict[str, Any] = {"device": device, "kind": entry["kind"]}
        notes = []
        for key in QUANTITIES:
            q = entry["quantities"][key]
            row[key], row[f"{key}_lo"], row[f"{key}_hi"] = q["value"], q["lo"], q["hi"]
            row[f"{key}_source"] = q.get("source", "missing")
            if "missing" in q:
                notes.append(f"{key}: {q['missing']}")
        mig, cap = entry.get("mig"), entry.get("power_cap")
        row["mig_profile"] = (mig or {}).get("profile")
        row["power_cap_w"] = (cap or {}).get("power_cap_w")
        row["missing"] = "; ".join(notes)
        rows.append(row)
    table = pd.DataFrame(rows)
    for key in QUANTITIES:
        for suffix in ("", "_lo", "_hi"):
            table[key + suffix] = pd.to_numeric(table[key + suffix], errors="coerce").astype(float)
    return table


def workflow_inputs(config: Mapping[str, Any], results: str | Path = "results") -> list[str]:
    """The workflow files :func:`predict_to_file` reads, for the ``input:`` of the predict rule
    (``config`` is the validated workflow config: ``devices``, ``fit.targets``, ``fit.regressors``,
    ``splits.schemes``)."""
    r = Path(results)
    files = [r / "evaluate" / "metrics.parquet", r / "dataset" / "dataset.parquet"]
    files += [r / "hardware" / f"{d}.json" for d in sorted(config.get("devices") or {})]
    fit, splits = config.get("fit") or {}, (config.get("splits") or {}).get("schemes") or []
    for target in fit.get("targets") or []:
        for regressor in fit.get("regressors") or []:
            for split in splits:
                stem = r / "fit" / target / regressor / split
                files += [Path(f"{stem}.models.json"), Path(f"{stem}.predictions.parquet")]
    return [str(f) for f in files]


def predict_to_file(
    spec: Mapping[str, Any],
    out_path: str | Path,
    results_dir: str | Path = "results",
    config: str | Path | Mapping[str, Any] = "config.yaml",
) -> Path:
    """Workflow entry point: predict the model of a config ``predict:`` entry and write its JSON record.

    ``spec``: ``{name: "timm:resnet50", batch: 8, input: "3,224,224" | [3, 224, 224] | 128, mode:
    "inference"}``, optionally ``devices``, ``objective``, ``latency_target_ms``, ``num_classes``.
    ``config`` is the workflow's config dict (or a path). The file is written atomically.
    """
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise InputError(f"predict entry {spec!r}: expected a mapping with at least 'name'")
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
    
        raise InputError(
            f"predict entry {spec['name']!r}: unknown key(s) {unknown}{suggest(unknown[0], SPEC_KEYS)}"
        )
    prediction = predict(
        spec["name"],
        batch=spec.get("batch", 1),
        input_shape=spec.get("input"),
        mode=spec.get("mode", "inference"),
        devices=spec.get("devices"),
        objective=spec.get("objective", "time"),
        latency_target_ms=spec.get("latency_target_ms"),
        results=results_dir,
        config=config,
        num_classes=spec.get("num_classes"),
    )
    return prediction.save(out_path)


class _CallableModule(types.ModuleType):
    """``perfzoo.predict`` is both this module and, called, :func:`predict` (see perfzoo/__init__.py)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Prediction:
        return predict(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = [
    "ModelSpec",
    "Prediction",
    "featurise_model",
    "load_predictors",
    "parse_input",
    "predict",
    "predict_to_file",
    "resolve_model",
    "workflow_inputs",
]
