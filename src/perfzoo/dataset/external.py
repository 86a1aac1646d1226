"""Import measurement tables people already have into a perfzoo dataset (traces of kind ``external``).

Input: a CSV file in long format, one measured number per row::

    model,device,batch,mode,precision,n_gpus,metric,value,unit
    resnet50,NVIDIA A100-SXM4-80GB,64,training,fp32,1,latency,212.5,ms

Required columns: ``model, device, batch, mode, metric, value, unit``. Optional columns:
``precision`` (default ``fp32``), ``n_gpus`` (default 1), ``family`` (default: the model name's
leading letters, ``resnet50`` → ``resnet``, ``vit_base_patch16_224`` → ``vit``) and ``resolution``
(square image side used to featurise timm/torchvision models, default 224). Lines starting with
``#`` before the header are comments; blank lines are skipped. Column names are case-insensitive.

Output: one row per ``(model_id, device, mode, batch)`` like ``results/dataset/dataset.parquet``:

* labels in perfzoo units: ``latency_ms`` (per batch step), ``throughput`` (samples/s),
  ``peak_mem_mb`` (MB = 2^20 bytes), ``mean_power_w``, ``energy_j`` (per batch step),
  ``energy_per_sample_j`` and ``edp`` (``energy_j`` * latency in s, J·s). A label the table lacks is
  NaN; ``latency_ms``/``throughput`` and ``energy_j``/``energy_per_sample_j`` are derived from each
  other (``throughput = batch / latency_ms * 1000``, ``energy_per_sample_j = energy_j / batch``)
  when only one of a pair is given, and ``derived_labels`` names the derived ones.
* ``device`` is the GPU's name in the spec table (``perfzoo.hardware.specs``), so the same GPU
  spelled two ways is one device; ``device_reported`` keeps the spelling of the file.
  Hardware features come from the spec sheet: ``hw_peak_gflops`` (FP32 non-tensor peak * 1000),
  ``hw_mem_bw_gbs``, ``hw_cores`` (SM count), ``hw_mem_gb``, ``hw_n_gpus`` and extras
  ``hw_spec_peak_tf32_tflops``, ``hw_spec_peak_fp16_tflops``, ``hw_spec_tdp_w`` (NaN where the GPU
  has no such unit). Leave-one-device-out therefore works on imported rows.
* ``model_id`` is ``stable_id`` of (model, precision, n_gpus, resolution): precision and GPU count
  are not in the dataset key, so they are part of the configuration's identity.
* model features (``perfzoo.dataset.build.MODEL_FEATURES``) are computed on the meta device for names
  timm or torchvision know (``timm:NAME``/``torchvision:NAME`` picks the library; else torchvision
  first), with 1000 classes and the row's precision (fp16/bf16 build the model in that dtype;
  fp32/tf32/amp/mixed in float32). Otherwise they are NaN and ``feature_missing_reason`` says why.
* provenance: ``source_file``, ``source_sha256``, ``source_rows`` (1-based data rows that
  gave the numbers of the row), ``trace_kind == "external"``.

Units: time ``s, ms, us (µs), ns`` → ms; memory ``B, KB, KiB, MB, MiB, GB,
GiB`` → MB where *every* prefix is binary: MB and MiB are both 2^20 bytes and GB/GiB 2^30 (perfzoo's
``peak_mem_mb`` is measured in MiB, as torch and nvidia-smi report it, and tables that write "MB"
almost always mean MiB); power ``mW, W, kW, MW``; energy ``mJ, J, kJ, MJ, Wh, kWh, MWh`` (``MW``,
``MJ``, ``MWh`` are read case-sensitively as mega; every other unit is case-insensitive); throughput
``samples/s, images/s, img/s, sequences/s`` (per sample) and ``it/s, iter/s, batches/s`` (batch
steps per second, multiplied by the batch size).

Bad rows raise ``InputError`` with one line naming the file, the 1-based data row (and its line in
the file) and the offending value: an unknown metric, unit, mode or device (a GPU absent from the
spec table), a non-numeric or non-positive value, or the same number given twice.
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.dataset.build import KEY, MODEL_FEATURES, add_roofline_features
from perfzoo.features.pool import FeatureJob, featurise_jobs
from perfzoo.hardware.specs import close_names, lookup_gpu
from perfzoo.io import InputError, read_yaml
from perfzoo.hardware.precision import check_supported, normalise_precision, peak_for
from perfzoo.provenance import provenance, sha256_file, write_table
from perfzoo.dataset.timm import NotMeasured, describe_file, read_timm_rows
from perfzoo.models.builders import library_model_names, timm_renamed_models
from perfzoo.models.zoo import stable_id

TRACE_KIND = "external"
REQUIRED_COLUMNS = ("model", "device", "batch", "mode", "metric", "value", "unit")
OPTIONAL_COLUMNS = {"precision": "fp32", "n_gpus": "1", "family": "", "resolution": "224", "software": ""}
NUM_CLASSES = 1000
LABELS = ("latency_ms", "throughput", "peak_mem_mb", "mean_power_w", "energy_j", "energy_per_sample_j", "edp")

METRICS: dict[str, str] = {
    **dict.fromkeys(("latency", "latency_ms", "time", "step_time", "batch_time", "iteration_time",
                     "time_per_batch", "time_per_iteration"), "latency_ms"),
    **dict.fromkeys(("throughput", "throughput_samples_s"), "throughput"),
    **dict.fromkeys(("peak_mem", "peak_memory", "memory", "peak_mem_mb", "max_memory"), "peak_mem_mb"),
    **dict.fromkeys(("power", "mean_power", "avg_power", "average_power", "mean_power_w"), "mean_power_w"),
    **dict.fromkeys(("energy", "energy_j", "energy_per_batch", "energy_per_step", "energy_per_iteration"),
                    "energy_j"),
    **dict.fromkeys(("energy_per_sample", "energy_per_sample_j"), "energy_per_sample_j"),
}
_MB = 1.0  # MB and MiB: 2^20 bytes
UNITS: dict[str, dict[str, float]] = {
    "latency_ms": {"s": 1e3, "sec": 1e3, "ms": 1.0, "us": 1e-3, "µs": 1e-3, "μs": 1e-3, "ns": 1e-6},
    "peak_mem_mb": {"b": _MB / 2**20, "kb": _MB / 1024, "kib": _MB / 1024, "mb": _MB, "mib": _MB,
                    "gb": _MB * 1024, "gib": _MB * 1024},
    "mean_power_w": {"mw": 1e-3, "w": 1.0, "kw": 1e3},
    "energy_j": {"mj": 1e-3, "j": 1.0, "kj": 1e3, "wh": 3600.0, "kwh": 3.6e6},
    "energy_per_sample_j": {"mj": 1e-3, "j": 1.0, "kj": 1e3, "wh": 3600.0, "kwh": 3.6e6},
    "throughput": {"samples/s": 1.0, "sample/s": 1.0, "images/s": 1.0, "image/s": 1.0, "img/s": 1.0,
                   "sequences/s": 1.0, "seq/s": 1.0},
}
PER_BATCH_THROUGHPUT_UNITS = ("it/s", "iter/s", "iters/s", "iterations/s", "batches/s", "steps/s")
MODES = {"inference": "inference", "infer": "inference", "eval": "inference",
         "training": "training", "train": "training"}
HW_EXTRAS = ("peak_fp32_tflops", "peak_tf32_tflops", "peak_fp16_tflops", "peak_bf16_tflops", "tdp_w")
DEVICE_MAP_HINT = ("map each to a row of the spec table with a device map (perfzoo-import --device-map FILE, "
                   "or device_map: in the config's external entry)")


# --------------------------------------------------------------------------- reading and checking rows


# Mega-prefixed units whose lower-case spelling would read as milli: matched case-sensitively first.
MEGA_UNITS: dict[str, dict[str, float]] = {
    "mean_power_w": {"MW": 1e6},
    "energy_j": {"MJ": 1e6, "MWh": 3.6e9},
    "energy_per_sample_j": {"MJ": 1e6, "MWh": 3.6e9},
}


def _unit_key(unit: str) -> str:
    key = re.sub(r"\s+", "", unit.strip().lower())
    return key[:-4] + "/s" if key.endswith("/sec") else key


def convert(label: str, value: float, unit: str, batch: int) -> float:
    """``value`` in ``unit`` expressed in perfzoo's unit of ``label``; KeyError for an unknown unit."""
    mega = MEGA_UNITS.get(label, {}).get(unit.strip())
    if mega is not None:
        return value * mega
    key = _unit_key(unit)
    if label == "throughput" and key in PER_BATCH_THROUGHPUT_UNITS:
        return value * batch
    return value * UNITS[label][key]


def _units_of(label: str) -> list[str]:
    units = [*UNITS[label], *MEGA_UNITS.get(label, {})]
    return [*units, *PER_BATCH_THROUGHPUT_UNITS] if label == "throughput" else units


def _read_rows(path: Path) -> list[tuple[int, int, dict[str, str]]]:
    """(1-based data row, file line, row dict with lower-case keys) of every non-blank data line."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from None
    lines = text.splitlines()
    start = 0
    while start < len(lines) and (not lines[start].strip() or lines[start].lstrip().startswith("#")):
        start += 1
    if start == len(lines):
        raise InputError(f"{path}: no header line")
    reader = csv.reader(lines[start:])
    header = [h.strip().lower() for h in next(reader)]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing and "timestamp" in header and any(h.startswith("power.draw") for h in header):
        raise InputError(f"{path}: an nvidia-smi sensor log, not a measurement table; read it with "
                         "`perfzoo sensors LOG --utc-offset HOURS -o OUT.parquet`")
    if missing:
        looks_timm = "infer_step_time" in header or "train_step_time" in header
        timm = " — looks like a timm benchmark file: use --format timm (format: timm in the config)" if looks_timm else ""
        raise InputError(f"{path}: missing columns {missing} (required: {', '.join(REQUIRED_COLUMNS)}){timm}")
    unknown = [c for c in header if c not in REQUIRED_COLUMNS and c not in OPTIONAL_COLUMNS]
    if unknown:
        raise InputError(f"{path}: unknown column{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                         f"(required: {', '.join(REQUIRED_COLUMNS)}; optional: {', '.join(OPTIONAL_COLUMNS)})")
    rows, n = [], 0
    for values in reader:
        line = start + reader.line_num
        if not any(v.strip() for v in values):
            continue
        n += 1
        if len(values) != len(header):
            raise InputError(f"{path}: row {n} (line {line}): {len(values)} fields, "
                             f"the header has {len(header)}")
        row = {k: v.strip() for k, v in zip(header, values, strict=True)}
        given = {k: v for k, v in row.items() if v or k in REQUIRED_COLUMNS}  # empty optional → default
        rows.append((n, line, {**OPTIONAL_COLUMNS, **given}))
    if not rows:
        raise InputError(f"{path}: no data rows")
    return rows


def _positive_int(value: str, what: str, where: str) -> int:
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"{where}: {what} {value!r} is not a number") from None
    if not number.is_integer() or number < 1:
        raise InputError(f"{where}: {what} {value!r} is not a positive integer")
    return int(number)


@lru_cache(maxsize=256)
def _gpu(device: str) -> dict[str, Any]:
    return lookup_gpu(device)


def load_device_map(path: str | Path | None) -> dict[str, str]:
    """``{name in a table: spec-table name}`` from a YAML mapping file (None → empty)."""
    if path is None:
        return {}
    mapping = read_yaml(path, "device map")
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise InputError(f"{path}: a device map is a mapping 'name in the table: spec-table name'")
    return {str(k): v for k, v in mapping.items()}


def resolve_devices(rows: list[tuple[int, int, dict[str, str]]], device_map: dict[str, str],
                    path: Path) -> dict[str, dict[str, Any]]:
    """Spec row of every device name in ``rows`` (through ``device_map``); every unmapped name at once."""
    for given, target in device_map.items():
        try:
            _gpu(target)
        except InputError as exc:
            raise InputError(f"device map entry {given!r}: {exc}") from None
    specs, bad = {}, {}
    for n, line, row in rows:
        name = row["device"]
        if name in specs or name in bad:
            continue
        try:
            specs[name] = _gpu(device_map.get(name, name))
        except InputError:
            close = close_names(name)
            bad[name] = (f"row {n} (line {line}): device {name!r}"
                         + (f" (close names: {', '.join(close)})" if close else " (no close names)"))
    if bad:
        raise InputError(f"{path}: {len(bad)} GPU name{'s' if len(bad) > 1 else ''} not in the spec table: "
                         f"{'; '.join(bad.values())}; {DEVICE_MAP_HINT}")
    return specs


def _check_row(row: dict[str, str], where: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One long-format measurement in perfzoo units, or InputError naming ``where`` and the value."""
    if not row["model"]:
        raise InputError(f"{where}: empty model name")
    precision = normalise_precision(row["precision"], where)
    check_supported(spec, precision, where)
    mode = MODES.get(row["mode"].lower())
    if mode is None:
        raise InputError(f"{where}: unknown mode {row['mode']!r} (expected inference or training)")
    batch = _positive_int(row["batch"], "batch", where)
    n_gpus = _positive_int(row["n_gpus"], "n_gpus", where)
    resolution = _positive_int(row["resolution"], "resolution", where)
    label = METRICS.get(row["metric"].strip().lower())
    if label is None:
        raise InputError(f"{where}: unknown metric {row['metric']!r} (known: {', '.join(sorted(METRICS))})")
    try:
        value = float(row["value"])
    except ValueError:
        raise InputError(f"{where}: value {row['value']!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{where}: value {row['value']!r} is not a positive finite number")
    try:
        converted = convert(label, value, row["unit"], batch)
    except KeyError:
        raise InputError(f"{where}: unknown unit {row['unit']!r} for metric {row['metric']!r} "
                         f"(expected one of: {', '.join(_units_of(label))})") from None
    software = row["software"]
    return {"model": row["model"], "device": f"{spec['name']} {software}" if software else spec["name"],
            "gpu": spec["name"], "software": software, "device_reported": row["device"], "mode": mode,
            "batch": batch, "precision": precision, "n_gpus": n_gpus, "resolution": resolution,
            "family_given": row["family"], "label_name": label, "value": converted}


# --------------------------------------------------------------------------- building the table


def family_from_name(model: str) -> str:
    """The name's leading letters, lower case: ``timm:resnet50`` → ``resnet``, ``ViT-B/16`` → ``vit``."""
    name = model.split(":", 1)[1] if model.startswith(("timm:", "torchvision:")) else model
    match = re.match(r"[A-Za-z]+", name)
    return match.group(0).lower() if match else name.lower()


def _families(long: pd.DataFrame, path: Path) -> dict[str, str]:
    """Each model's family: the one its rows give (one only), else :func:`family_from_name`."""
    given = long.loc[long["family_given"] != "", ["model", "family_given", "data_row"]]
    distinct = given.drop_duplicates(["model", "family_given"])  # each family's first row, in the table's order
    clash = distinct[distinct.duplicated("model", keep=False)]
    if len(clash):
        first = clash[clash["model"] == min(clash["model"])]
        rows = ", ".join(map(str, first["data_row"]))
        raise InputError(f"{path}: model {first['model'].iloc[0]!r} is given different families "
                         f"{list(first['family_given'])} (rows {rows})")
    families = {model: family_from_name(str(model)) for model in long["model"].unique()}
    return {**families, **dict(zip(distinct["model"], distinct["family_given"], strict=True))}


CONFIG = ["model", "precision", "n_gpus", "resolution"]
DEVICE_COLUMNS = ["gpu", "software", "device_reported"]


def _wide(long: pd.DataFrame, path: Path) -> pd.DataFrame:
    keys = [*CONFIG, "device", "mode", "batch"]
    dup = long[long.duplicated([*keys, "label_name"], keep=False)]
    if len(dup):
        first = dup.groupby([*keys, "label_name"], sort=False)["data_row"].apply(list).iloc[0]
        raise InputError(f"{path}: rows {', '.join(map(str, first))} give the same "
                         f"{dup['label_name'].iloc[0]} of one configuration twice")
    wide = long.pivot_table(index=keys, columns="label_name", values="value", aggfunc="first")
    wide = wide.reindex(columns=[c for c in LABELS if c != "edp"]).reset_index()
    wide.columns.name = None
    rows = long.groupby(keys)["data_row"].apply(lambda r: ",".join(map(str, sorted(r)))).rename("source_rows")
    reported = long.groupby(keys)[DEVICE_COLUMNS].first()
    wide = wide.merge(rows.reset_index(), on=keys).merge(reported.reset_index(), on=keys)
    return _derive(wide)


def _derive(wide: pd.DataFrame) -> pd.DataFrame:
    derived = [[] for _ in range(len(wide))]

    def fill(target: str, values: pd.Series) -> None:
        gap = wide[target].isna() & values.notna()
        for i in np.flatnonzero(gap.to_numpy()):
            derived[i].append(target)
        wide.loc[gap, target] = values[gap]

    fill("throughput", wide["batch"] / wide["latency_ms"] * 1000)
    fill("latency_ms", wide["batch"] / wide["throughput"] * 1000)
    fill("energy_per_sample_j", wide["energy_j"] / wide["batch"])
    fill("energy_j", wide["energy_per_sample_j"] * wide["batch"])
    wide["edp"] = wide["energy_j"] * wide["latency_ms"] / 1000
    for i, row in enumerate(wide[["energy_j", "latency_ms"]].itertuples(index=False)):
        if pd.notna(row.energy_j) and pd.notna(row.latency_ms):
            derived[i].append("edp")
    wide["derived_labels"] = [",".join(d) for d in derived]
    return wide


def hardware_columns(device: str, n_gpus: int = 1, precision: str = "fp32") -> dict[str, float]:
    """Spec-sheet hardware features of one GPU of ``device`` (a spec-table or NVML name).

    ``hw_peak_gflops`` is the peak of the unit that runs ``precision`` (``perfzoo.hardware.precision``) and
    ``hw_tensor_cores`` says whether that unit is a tensor core (1.0) or not (0.0).
    """
    spec = _gpu(device)
    peak = peak_for(spec, precision)

    def num(key: str) -> float:
        return math.nan if spec.get(key) is None else float(spec[key])

    return {"hw_peak_gflops": peak.tflops * 1000, "hw_tensor_cores": float(peak.tensor_cores),
            "hw_mem_bw_gbs": num("mem_bw_gbs"), "hw_cores": num("sm_count"), "hw_mem_gb": num("mem_gb"),
            "hw_n_gpus": float(n_gpus), **{f"hw_spec_{k}": num(k) for k in HW_EXTRAS}}


@functools.cache
def _library_names(library: str) -> frozenset[str]:
    """The library's model names as a set, made once per process (every row's name is looked up in it)."""
    return frozenset(library_model_names(library))


def resolve_builder(model: str) -> tuple[str, str] | None:
    """(builder, name) for a timm/torchvision model name, else None; a name timm has renamed resolves to the
    name timm builds for it now (:func:`~perfzoo.models.builders.timm_renamed_models`)."""
    if ":" in model:
        library, _, name = model.partition(":")
        libraries = (library,) if library in ("timm", "torchvision") else ()
    else:
        libraries, name = ("torchvision", "timm"), model
    for library in libraries:
        if name.split(".", 1)[0] in _library_names(library):
            return library, name
    if "timm" in libraries and name in timm_renamed_models():
        return "timm", timm_renamed_models()[name]
    return None


def renamed_models(data: pd.DataFrame) -> dict[str, str]:
    """The table's model names that are featurised under another name (timm's renamed models), to that name."""
    renamed = {}
    for model in sorted(set(data["model"].astype(str))):
        resolved = resolve_builder(model)
        if resolved is not None and resolved[1] != (model.partition(":")[2] or model):
            renamed[model] = f"{resolved[0]}:{resolved[1]}"
    return renamed


@dataclass
class ImportOptions:
    """How to read and featurise a table: its format and what a timm file does not say about itself."""

    fmt: str = "long"  # "long" (perfzoo's measurement table) or "timm" (timm's benchmark CSV)
    device: str = ""  # timm: the GPU of the file (default: from the file name)
    precision: str = ""  # timm: the precision of the file (default: from the file name)
    software: str = ""  # timm: torch/CUDA stack, becomes part of the device name (default: file name)
    device_map: dict[str, str] = field(default_factory=dict)
    strict: bool = False  # fail when a model cannot be featurised
    featurise_models: bool = True
    workers: int | None = None
    progress: bool = False
    feature_cache: str | None = None  # JSON lines file of probe and batch features kept between runs


def feature_jobs(data: pd.DataFrame) -> tuple[list[FeatureJob], dict[tuple, str]]:
    """One featurisation job per (model, precision, resolution, mode); reasons for unknown names."""
    groups = data.groupby(["model", "precision", "resolution", "mode"], sort=True)["batch"]
    jobs, unknown = [], {}
    for (model, precision, resolution, mode), batches in groups:
        resolved = resolve_builder(str(model))
        if resolved is None:
            unknown[(model, precision, resolution, mode)] = f"{model!r} is not a timm or torchvision model name"
            continue
        jobs.append(FeatureJob(resolved[0], resolved[1], precision, int(resolution), mode,
                               tuple(sorted({int(b) for b in batches})), NUM_CLASSES))
    return jobs, unknown


def _add_model_features(data: pd.DataFrame, options: ImportOptions) -> pd.DataFrame:
    jobs, unknown = feature_jobs(data)
    results = featurise_jobs(jobs, options.workers, options.progress, options.feature_cache)
    by_group = {}
    for result, job in zip(results, jobs, strict=True):
        by_group[(job.builder, job.name, job.precision, job.resolution, job.mode)] = result
    rows = []
    for r in data[["model", "precision", "resolution", "mode", "batch"]].drop_duplicates().itertuples(index=False):
        group = (r.model, r.precision, r.resolution, r.mode)
        resolved = resolve_builder(str(r.model))
        result = by_group.get((*resolved, *group[1:])) if resolved else None
        feats = result.features.get(int(r.batch), {}) if result else {}
        reason = unknown.get(group) or (result.reason if result else "")
        rows.append({"model": r.model, "precision": r.precision, "resolution": r.resolution, "mode": r.mode,
                     "batch": r.batch, **{k: feats[k] for k in MODEL_FEATURES if k in feats},
                     "feature_missing_reason": reason, "featurised_by": result.method if result else ""})
    keys = ["model", "precision", "resolution", "mode", "batch"]
    table = pd.DataFrame(rows).reindex(columns=[*keys, *MODEL_FEATURES, "feature_missing_reason", "featurised_by"])
    for col in MODEL_FEATURES:
        table[col] = pd.to_numeric(table[col], errors="coerce").astype("float64")
    return data.merge(table, on=keys, how="left")


def table_configs(csv_path: str | Path, options: ImportOptions) -> pd.DataFrame:
    """(model, precision, resolution, mode, batch) of every measured row of a table, read as :func:`import_external`
    reads it, without featurising."""
    rows, _ = import_external(csv_path, options=replace(options, featurise_models=False))
    return rows[["name", "precision", "resolution", "mode", "batch"]].rename(columns={"name": "model"})


def entry_options(entry: dict[str, Any], device_map_file: str | None, workers: int | None = None,
                  feature_cache: str | None = None) -> ImportOptions:
    """A workflow config's ``external:`` entry (without its ``path``) as import options: ``format``, ``device``,
    ``precision``, ``software``, ``strict``, and ``device_map`` inline or from ``device_map_file``."""
    entry = dict(entry)
    device_map = entry.pop("device_map", None)
    mapping = device_map if isinstance(device_map, dict) else load_device_map(device_map_file if device_map else None)
    return ImportOptions(fmt=entry.pop("format", "long"), device_map=mapping, workers=workers,
                         feature_cache=feature_cache, **entry)


def featurise_tables(tables: Sequence[tuple[str | Path, dict[str, Any], str | None]], options: ImportOptions
                     ) -> list[str]:
    """Featurise the models of several tables (``(path, entry, device-map file)``, as :func:`entry_options` reads
    them) together, into this process's cache and ``options.feature_cache``: one job per model (resolution,
    precision, mode) with every batch any table lists, so importing each table afterwards, here or in a later
    process reading the same cache file, builds no model again (timm's files list the same models at other batch
    sizes: 1,024 on most GPUs, 2,048 on another). A table that cannot be read is left to its own import to report;
    returns why each such table was skipped."""
    configs, skipped = [], []
    for path, entry, device_map_file in tables:
        try:
            configs.append(table_configs(path, entry_options(entry, device_map_file)))
        except (InputError, OSError) as exc:
            skipped.append(f"{path}: {exc}")
    if configs:
        jobs, _ = feature_jobs(pd.concat(configs, ignore_index=True).drop_duplicates())
        featurise_jobs(jobs, options.workers, options.progress, options.feature_cache)
    return skipped


def unfeaturisable_models(data: pd.DataFrame) -> pd.DataFrame:
    """One row per model (name, precision, resolution, mode) without features, with the reason and rows."""
    missing = data[data["feature_missing_reason"].fillna("") != ""]
    if missing.empty:
        return pd.DataFrame(columns=["name", "precision", "resolution", "mode", "rows", "reason"])
    return (missing.groupby(["name", "precision", "resolution", "mode"], sort=True)
            .agg(rows=("row_id", "size"), reason=("feature_missing_reason", "first")).reset_index())


def _long_rows(path: Path, options: ImportOptions
               ) -> tuple[list[tuple[int, int, dict[str, str]]], list[NotMeasured]]:
    """Rows in perfzoo's long format, whatever the table's format, and the models the table records as
    not measured (a timm file's ``error`` rows)."""
    if options.fmt == "long":
        return _read_rows(path), []
    if options.fmt != "timm":
        raise InputError(f"{path}: unknown table format {options.fmt!r} (accepted: long, timm)")
    described = describe_file(path)
    device = options.device or (described.device if described else "")
    precision = options.precision or (described.precision if described else "")
    software = options.software or (described.software if described else "")
    if not device or not precision:
        raise InputError(f"{path}: the file name does not say the device and precision of this timm file; "
                         "give them (--device, --precision or device:/precision: in the config)")
    rows, not_measured = read_timm_rows(path, device, precision, software)
    if not rows:
        raise InputError(f"{path}: no measured model ({len(not_measured)} row(s) with an error only)")
    return [(n, line, {**OPTIONAL_COLUMNS, **row}) for n, line, row in rows], not_measured


def import_external(csv_path: str | Path, featurise_models: bool = True, progress: bool = False,
                    options: ImportOptions | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """(dataset-like table, provenance record) of an external measurement CSV; see the module docstring.

    ``featurise_models=False`` skips the meta-device featurisation (features NaN with a reason).
    With ``options.strict`` a model that cannot be featurised fails the import (InputError naming it).
    """
    options = options or ImportOptions(featurise_models=featurise_models, progress=progress)
    path = Path(csv_path)
    rows, not_measured = _long_rows(path, options)
    specs = resolve_devices(rows, options.device_map, path)
    records = [{**_check_row(row, f"{path}: row {n} (line {line})", specs[row["device"]]), "data_row": n}
               for n, line, row in rows]
    long = pd.DataFrame(records)
    families = _families(long, path)
    data = _wide(long, path)
    data["model_id"] = [stable_id({"source": TRACE_KIND, "model": r.model, "precision": r.precision,
                                   "n_gpus": int(r.n_gpus), "resolution": int(r.resolution)})
                        for r in data.itertuples(index=False)]
    data["family"] = data["model"].map(families)
    data["name"] = data["model"]
    data["label"] = [f"{r.model}@{r.precision}" + (f"x{r.n_gpus}" if r.n_gpus > 1 else "")
                     for r in data.itertuples(index=False)]
    data["builder"] = TRACE_KIND
    data["trace_kind"] = TRACE_KIND
    sha = sha256_file(path)
    data["source_file"] = str(path)
    data["source_sha256"] = sha
    data["energy_missing_reason"] = np.where(data["energy_j"].isna(), "no energy in the imported table", "")
    hw = pd.DataFrame([{"gpu": g, "n_gpus": n, "precision": p, **hardware_columns(g, n, p)}
                       for g, n, p in sorted(set(zip(data["gpu"], data["n_gpus"], data["precision"], strict=True)))])
    data = data.merge(hw, on=["gpu", "n_gpus", "precision"], how="left")
    if options.featurise_models:
        data = _add_model_features(data, options)
    else:
        data = data.assign(**{c: math.nan for c in MODEL_FEATURES}, featurised_by="",
                           feature_missing_reason="model features not computed (featurise_models=False)")
    renamed = renamed_models(data) if options.featurise_models else {}
    data["is_training"] = (data["mode"] == "training").astype(float)
    data = add_roofline_features(data)
    data.insert(0, "row_id", data[KEY].astype(str).agg("|".join, axis=1))
    data = data.drop(columns=["model"])
    front = ["row_id", *KEY, "family", "name", "label", "builder", "precision", "n_gpus", "resolution",
             *DEVICE_COLUMNS, *LABELS, "derived_labels", "energy_missing_reason"]
    data = data[front + [c for c in data.columns if c not in front]]
    data = data.sort_values("row_id").reset_index(drop=True)
    missing = unfeaturisable_models(data) if options.featurise_models else None
    if options.strict and missing is not None and len(missing):
        first = missing.iloc[0]
        raise InputError(f"{path}: {len(missing)} model(s) cannot be featurised, e.g. {first['name']} "
                         f"({first['reason']}); all: {', '.join(sorted(set(missing['name'])))}")
    prov = provenance([path], {"import": TRACE_KIND, "featurise_models": options.featurise_models,
                               "num_classes": NUM_CLASSES, "format": options.fmt,
                               "device_map": options.device_map})
    prov["source"] = {"path": str(path), "sha256": sha, "kind": TRACE_KIND, "data_rows": len(long),
                      "dataset_rows": len(data), "models": int(data["name"].nunique()),
                      "model_configs": int(data["model_id"].nunique())}
    if missing is not None:
        prov["unfeaturisable"] = missing.to_dict("records")
    prov["featurised_as"] = renamed
    # only a timm file has such rows, and it holds one device: the resolved name of its rows
    prov["not_measured"] = [{"name": f"timm:{m.model}", "device": str(data["device"].iloc[0]),
                             "resolution": m.resolution, "batch": m.batch, "reason": m.reason} for m in not_measured]
    return data, prov


# --------------------------------------------------------------------------- command line


def build_parser(prog: str = "perfzoo-import") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Import an external measurement CSV (model, device, batch, mode, precision, "
                               "n_gpus, metric, value, unit), or a timm benchmark CSV, into a perfzoo dataset table.")
    parser.add_argument("csv", help="measurement table (long format, one number per row; or --format timm)")
    parser.add_argument("-o", "--output", required=True, help="output Parquet file (dataset-like table)")
    parser.add_argument("--format", default="long", choices=("long", "timm"), help="table format (long)")
    parser.add_argument("--device", default="", help="timm format: the file's GPU (default: from the file name)")
    parser.add_argument("--precision", default="", help="timm format: fp32, tf32, fp16, bf16 or amp "
                                                        "(default: from the file name)")
    parser.add_argument("--software", default="", help="timm format: torch/CUDA stack, e.g. pt291-cu128 "
                                                       "(default: from the file name)")
    parser.add_argument("--device-map", default=None,
                        help="YAML file mapping the table's GPU names to rows of the GPU spec table")
    parser.add_argument("--strict", action="store_true", help="fail when a model cannot be featurised")
    parser.add_argument("--workers", type=int, default=None, help="featurising processes (default: CPU cores)")
    parser.add_argument("--feature-cache", default=None,
                        help="JSON lines file of probe and batch features reused between imports "
                             "(same library versions)")
    parser.add_argument("--no-features", action="store_true",
                        help="skip featurising timm/torchvision models on the meta device")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def import_summary(data: pd.DataFrame, output: str, prov: dict[str, Any] | None = None) -> list[str]:
    """Summary lines: rows and models counted separately, every model featurised under another name (timm's
    renamed models, ``prov["featurised_as"]``), every unfeaturisable model with why, then every model the table
    records as not measured, with the table's reason (``prov["not_measured"]``); ``prov`` is the import's
    provenance record."""
    prov = prov or {}
    featurised_as, not_measured = prov.get("featurised_as", {}), prov.get("not_measured", [])
    ok = data["feature_missing_reason"].fillna("") == ""
    missing = unfeaturisable_models(data)
    lines = [f"{len(data)} rows ({int(ok.sum())} featurised, {int((~ok).sum())} without features, left out of "
             f"fitting) of {data['name'].nunique()} models ({data.loc[ok, 'name'].nunique()} featurised, "
             f"{missing['name'].nunique()} not) in {data['model_id'].nunique()} model configs on "
             f"{data['device'].nunique()} devices -> {output}"]
    if featurised_as:
        lines.append(f"{len(featurised_as)} model(s) featurised under the name timm gives them now "
                     "(timm's table of renamed models):")
        lines += [f"  featurised as: {old} -> {new}" for old, new in featurised_as.items()]
    lines += [f"  not featurised: {r.name} ({r.precision}, {r.resolution}px, {r.mode}; {r.rows} rows): {r.reason}"
              for r in missing.itertuples(index=False)]
    if not_measured:
        lines.append(f"{len(not_measured)} model(s) not measured in the table (no time; left out):")
        lines += [f"  not measured: {m['name']} ({m['resolution']}px, batch {m['batch']}): {m['reason']}"
                  for m in not_measured]
    return lines


def external_main(argv: Sequence[str] | None = None, prog: str = "perfzoo-import") -> int:
    """``perfzoo-import CSV -o OUT.parquet`` (also ``perfzoo import``): 0 on success; bad input prints one
    line and returns 2."""
    args = build_parser(prog).parse_args(argv)
    try:
        options = ImportOptions(fmt=args.format, device=args.device, precision=args.precision,
                                software=args.software, device_map=load_device_map(args.device_map),
                                strict=args.strict, featurise_models=not args.no_features, workers=args.workers,
                                progress=not args.quiet, feature_cache=args.feature_cache)
        data, prov = import_external(args.csv, options=options)
    except InputError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    write_table(args.output, data, prov)
    for line in import_summary(data, args.output, prov):
        print(f"{prog}: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(external_main())
