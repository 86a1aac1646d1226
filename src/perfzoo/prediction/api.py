"""Predict time, memory, energy, cost and carbon of a model on every configured device.

:func:`predict` featurises a model on PyTorch's meta device (no weights allocated), loads for every
target the fitted predictor with the best validation score (:mod:`perfzoo.prediction.predictors`), and
returns one row per device with every predicted number and its interval
(:mod:`perfzoo.prediction.quantities`, bounded by :mod:`perfzoo.prediction.bounds`), the recommended
device for an objective, the recommended MIG profile and power cap where they apply
(:mod:`perfzoo.prediction.advice`), warnings about extrapolation, and the provenance of every file the
numbers come from, down to the raw traces (:mod:`perfzoo.prediction.provenance`).

Speed. When torch is not imported yet, the featurisation runs elsewhere while this process loads the
predictors: in the warm featuriser server of this environment when the CLI finds one (torch, torchvision
and timm imported once, each request featurised in a fork; :mod:`perfzoo.prediction.server`), else in a
child process that imports them (:mod:`perfzoo.prediction.featurise`); on two cores the two halves of
``perfzoo predict`` overlap.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from perfzoo.hardware.precision import predictable_precision
from perfzoo.io import InputError, read_json, read_parquet, suggest
from perfzoo.prediction.server import start_server
from perfzoo.prediction.advice import OBJECTIVES, PredictionContext, mig_advice, power_cap, recommend
from perfzoo.prediction.bounds import (
    bound_predictions,
    family_profiled,
    mark_out_of_range,
    qualify_recommendation,
    range_check,
    range_warnings,
)
from perfzoo.prediction.devices import device_kind, device_row, device_settings, load_config, select_devices
from perfzoo.prediction.featurise import Featuriser, child_strategy
from perfzoo.prediction.predictors import (
    IN_FAMILY_SPLITS,
    RUN_WORKFLOW,
    UNSEEN_FAMILY_SPLIT,
    Predictor,
    TargetPrediction,
    load_predictors,
    require_outputs,
)
from perfzoo.prediction.provenance import Sources, prediction_provenance, record_key
from perfzoo.prediction.quantities import (
    QUANTITIES,
    UNITS,
    label_gaps,
    missing,
    row_quantities,
    target_predictions,
    with_roofline,
)
from perfzoo.prediction.record import Prediction, clean, prediction_table
from perfzoo.prediction.spec import DEFAULT_NUM_CLASSES, MODES, SPEC_KEYS, ModelSpec, resolve_model
from perfzoo.prediction.timing import timing
from perfzoo.provenance import code_version, package_versions


@dataclass
class WorkflowInputs:
    """What a prediction reads from the workflow's results and config."""

    results: Path
    workdir: Path
    configured: Mapping[str, Any]  # the config's devices
    config_path: str | None
    hw_files: dict[str, Path]
    names: list[str]  # the devices to predict, in order
    data: pd.DataFrame  # the dataset
    predictors: dict[str, Predictor]
    missing_targets: dict[str, str]
    hardware: dict[str, Any]  # device -> its hardware JSON
    packages: dict[str, Any]
    code_version: Any


def check_options(batch: Any, mode: str, objective: str, latency_target_ms: Any) -> tuple[int, float | None]:
    """(batch, latency target) checked; InputError naming the option otherwise."""
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


def _num_classes(num_classes: int | None, cfg: Mapping[str, Any]) -> int:
    if num_classes is None:
        return int((cfg.get("zoo") or {}).get("num_classes") or DEFAULT_NUM_CLASSES)
    if int(num_classes) < 1:
        raise InputError(f"--num-classes: expected a classifier head of at least 1 class, got {num_classes}")
    return num_classes


def _read_workflow(
    results: Path, cfg: Mapping[str, Any], config_path: str | None, devices: Any
) -> WorkflowInputs:
    """Devices, dataset, predictors and hardware files (while the model is featurised elsewhere)."""
    workdir = Path(os.path.abspath(results)).parent
    configured = cfg.get("devices") or {}
    hw_files = {p.stem: p for p in sorted((results / "hardware").glob("*.json"))}
    names = select_devices(devices, configured, hw_files)
    data = read_parquet(results / "dataset" / "dataset.parquet")
    timing("config, devices, dataset")
    predictors, missing_targets = load_predictors(results, data)
    timing("predictors loaded")
    if not predictors:
        raise InputError(f"{results / 'fit'}: no fitted predictor for any target; {RUN_WORKFLOW}")
    hardware = {d: read_json(hw_files[d]) for d in names if d in hw_files}
    packages, version = package_versions(), code_version()
    timing("package versions")
    return WorkflowInputs(
        results, workdir, configured, config_path, hw_files, names, data, predictors, missing_targets,
        hardware, packages, version,
    )  # fmt: skip


def _featurise_overlapped(
    spec: ModelSpec,
    batch: int,
    mode: str,
    num_classes: int,
    use_server: bool,
    read: Callable[[], WorkflowInputs],
) -> tuple[dict[str, Any], WorkflowInputs, str]:
    """(featurisation, workflow inputs, how it was featurised): ``read()`` runs while the model is
    featurised in a child process or the warm server (torch, timm/torchvision, the meta-device step)."""
    featuriser = Featuriser(spec, batch, mode, num_classes, child_strategy(spec), use_server)
    try:
        inputs = read()
        featurised = featuriser.result()
    finally:
        featuriser.close()
    if featuriser.start_server_after:
        start_server(featuriser.server_path, featuriser.environ)
    return featurised, inputs, featuriser.method


IN_FAMILY_CHOICE = (f"best held-out MAPE over the {', '.join(IN_FAMILY_SPLITS)} splits (where evaluated; their "
                    "held-out rows pooled)")


def _choose_predictors(spec: ModelSpec, class_name: str, w: WorkflowInputs) -> str:
    """For a family never profiled, swap in the predictors scored with whole families held out (the
    scores that matter then); how the predictors were chosen."""
    if family_profiled([spec.name.split(":")[-1], class_name], w.data):
        return IN_FAMILY_CHOICE
    unseen, _ = load_predictors(w.results, w.data, UNSEEN_FAMILY_SPLIT)
    swapped = {t: p for t, p in unseen.items() if p.split == UNSEEN_FAMILY_SPLIT and t in w.predictors}
    if not swapped:
        return IN_FAMILY_CHOICE
    w.predictors.update(swapped)
    scored = " + ".join(dict.fromkeys(s for p in swapped.values() for s in (p.scored_on or (p.split,))))
    return (
        f"best held-out MAPE over the {scored} split{'s' if ' + ' in scored else ''} (where evaluated; their "
        f"held-out rows pooled), with the {UNSEEN_FAMILY_SPLIT} split's models, as the model's family was never "
        f"profiled ({', '.join(sorted(swapped))})"
    )


def _device_rows(
    w: WorkflowInputs, feats: Mapping[str, Any], batch: int, mode: str, model_id: str, precision: str
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The predictors' input row of every device, and why the others have none."""
    rows, device_missing = {}, {}
    for d in w.names:
        row = device_row(d, w.hardware.get(d), dict(feats), batch, mode, model_id, precision)
        if isinstance(row, str):
            device_missing[d] = row
        else:
            rows[d] = row
    if not rows:  # nothing to predict on: an error, not an empty answer
        raise InputError(
            f"no device to predict on: {'; '.join(f'{d}: {w}' for d, w in device_missing.items())}"
        )
    return rows, device_missing


def device_entries(
    w: WorkflowInputs,
    rows: Mapping[str, dict[str, Any]],
    device_missing: Mapping[str, str],
    tp: Mapping[str, TargetPrediction | str],
    ctx: PredictionContext,
) -> dict[str, Any]:
    """Quantities, MIG profile and power cap of every device (in the order of ``w.names``); ``tp``: the
    predictors' answers over the rows of ``rows``, in their order."""
    entries: dict[str, Any] = {}
    for i, d in enumerate(rows):
        settings = device_settings(w.configured.get(d) or {}, w.hardware.get(d))
        q = row_quantities(
            i, d, tp, ctx.predictors, ctx.missing, ctx.gaps, ctx.batch, settings, w.config_path
        )
        mark_out_of_range(q, ctx.out_of_range)
        entries[d] = {
            "kind": settings.kind,
            "quantities": q,
            "mig": mig_advice(settings, w.hardware.get(d), q, ctx.latency_target_ms),
            "power_cap": power_cap(d, rows[d], settings, q, ctx),
        }
    for d, why in device_missing.items():
        entries[d] = {
            "kind": device_kind(w.configured.get(d) or {}, w.hardware.get(d)),
            "missing": why,
            "quantities": {k: missing(why) for k in QUANTITIES},
            "mig": None,
            "power_cap": None,
        }
    return {d: entries[d] for d in w.names}


def _recommendation(
    w: WorkflowInputs, entries: Mapping[str, Any], objective: str, latency_target_ms: float | None
) -> dict[str, Any]:
    quantities = {d: e["quantities"] for d, e in entries.items() if "missing" not in e}
    memory_mb = {
        d: float(h["memory_gb"]) * 1024
        for d, h in w.hardware.items()
        if isinstance(h.get("memory_gb"), int | float)
    }
    rec = recommend(w.names, quantities, objective, latency_target_ms, memory_mb)
    qualify_recommendation(rec, quantities)
    return rec


def _provenance_record(w: WorkflowInputs, sources: Sources, num_classes: int) -> dict[str, Any]:
    return {
        "inputs": sources.hashes,
        "chain": sources.chain,
        "traces": {k: v for k, v in sources.chain.items() if "/traces/" in f"/{k}"},
        "config": {
            "devices": {d: w.configured.get(d, {}) for d in w.names},
            "zoo": {"num_classes": num_classes},
            "config_file": w.config_path,
        },
        "code_version": w.code_version,
        "packages": w.packages,
        "workdir": str(w.workdir),
    }


@dataclass(frozen=True)
class Options:
    """The checked options of one prediction."""

    batch: int
    mode: str
    objective: str
    latency_target_ms: float | None
    num_classes: int
    precision: str = "fp32"


def _record(
    o: Options,
    spec: ModelSpec,
    featurised: Mapping[str, Any],
    method: str,
    w: WorkflowInputs,
    sources: Sources,
    entries: dict[str, Any],
    feature_rows: dict[str, Any],
    choice: str,
) -> dict[str, Any]:
    """The prediction's JSON record (in this key order)."""
    feats, class_name = featurised["features"], featurised["class_name"]
    dataset_key = record_key(w.results / "dataset" / "dataset.parquet", w.workdir)
    model = {**spec.to_dict(), "batch": o.batch, "mode": o.mode, "precision": o.precision,
             "num_classes": o.num_classes}
    warnings = range_warnings(spec, class_name, feats, o.batch, o.mode, w.data, w.names, feature_rows, o.precision)
    return {
        "model": {**model, "class_name": class_name},
        "objective": o.objective,
        "latency_target_ms": o.latency_target_ms,
        "features": feats,
        "featurised_by": method,
        "devices": entries,
        "recommendation": _recommendation(w, entries, o.objective, o.latency_target_ms),
        "warnings": [*warnings, *sources.warnings],
        "predictors": sources.predictors,
        "predictor_choice": choice,
        "missing_targets": w.missing_targets,
        "dataset": {"path": dataset_key, "sha256": sources.hashes[dataset_key]},
        "feature_rows": feature_rows,
        "units": UNITS,
        "provenance": _provenance_record(w, sources, o.num_classes),
    }


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
    precision: str = "fp32",
) -> Prediction:
    """Predict latency/step time, throughput, peak memory, power, energy, EDP, cost and carbon of a model
    on every device, with intervals, a recommended device for ``objective`` (time, energy, edp, cost),
    MIG profiles and power caps, extrapolation warnings and provenance. See the module docstring.

    ``model_or_name``: ``timm:NAME``, ``torchvision:NAME``, ``mlp:NAME``, ``transformer:NAME``,
    ``language_model:PRESET``, ``path/to/model.py:function``, an ``nn.Module`` instance or a function building one.
    ``input_shape``: per sample, e.g. ``(3, 224, 224)``, ``"3,224,224"`` or a sequence length.
    ``results``/``config``: the workflow's results folder and config (path or dict).
    ``use_server``: featurise through the warm featuriser server of this environment, and start one
    when none runs (the CLI's choice; see :mod:`perfzoo.prediction.server`).
    ``precision``: one of :data:`~perfzoo.hardware.precision.PREDICTABLE` (fp32, tf32, amp); it sets the
    hardware features as the dataset's rows of that precision have them.
    """
    batch, latency_target_ms = check_options(batch, mode, objective, latency_target_ms)
    precision = predictable_precision(precision, "--precision")
    results = Path(results)
    require_outputs(results)
    spec = resolve_model(model_or_name, input_shape)
    cfg, config_path = load_config(config, results)
    num_classes = _num_classes(num_classes, cfg)
    featurised, w, method = _featurise_overlapped(
        spec, batch, mode, num_classes, use_server, lambda: _read_workflow(results, cfg, config_path, devices)
    )
    feats, class_name, spec.dtype = featurised["features"], featurised["class_name"], featurised["dtype"]
    choice = _choose_predictors(spec, class_name, w)
    rows, device_missing = _device_rows(w, feats, batch, mode, spec.text, precision)
    X = with_roofline(pd.DataFrame(list(rows.values())))
    in_range = range_check(feats, batch, mode, w.data)
    ctx = PredictionContext(
        w.predictors, w.missing_targets, label_gaps(w.data), batch, objective, latency_target_ms, in_range
    )  # fmt: skip
    tp = bound_predictions(target_predictions(X, ctx.predictors), X, in_range)
    entries = device_entries(w, rows, device_missing, tp, ctx)
    fallbacks = {t: a.fallbacks for t, a in tp.items() if isinstance(a, TargetPrediction) and a.fallbacks}
    sources = prediction_provenance(results, w.workdir, w.predictors, fallbacks, w.hw_files, w.names, spec)
    opts = Options(batch, mode, objective, latency_target_ms, num_classes, precision)
    feature_rows = {d: dict(X.iloc[i].items()) for i, d in enumerate(rows)}
    record = _record(opts, spec, featurised, method, w, sources, entries, feature_rows, choice)
    timing("predictions")
    return Prediction(clean(record), prediction_table(entries))


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
    "inference"}``, optionally ``precision``, ``devices``, ``objective``, ``latency_target_ms``, ``num_classes``.
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
        precision=spec.get("precision", "fp32"),
    )
    return prediction.save(out_path)
