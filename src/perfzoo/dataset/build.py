"""Dataset stage: aggregate raw iteration traces into labels and join model and hardware features."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.features.memory import SIM_COLUMNS
from perfzoo.features.op_kinds import OP_ERROR_COLUMN, OP_FEATURES
from perfzoo.hardware import hardware_calibration, hardware_features
from perfzoo.io import InputError, read_json, read_parquet
from perfzoo.profiling.interference import drop_flagged_runs, flagged_mask
from perfzoo.profiling.runner import PEAK_RSS_TOTAL, STATUSES, TRACE_COLUMNS, WINDOW
from perfzoo.stats import coefficient_of_variation, mape, mape_interval, median_ci

KEY = ["model_id", "device", "mode", "batch"]
LABELS = ["latency_ms", "throughput", "peak_mem_mb", "mean_power_w", "energy_j", "energy_per_sample_j", "edp"]
TARGETS = ("latency_ms", "throughput", "peak_mem_mb")
MODEL_FEATURES = (
    "flops", "flops_fw", "macs", "params", "trainable_params", "weight_bytes", "activation_bytes",
    "input_bytes", "n_layers", "n_conv", "n_linear", "n_norm", "n_act", "n_pool", "n_attention",
    "n_dropout", "n_embedding", "n_module_calls", "graph_nodes", "graph_edges", "complexity_fw",
    "complexity_bw", "depth", "train_mem_estimate_bytes", *SIM_COLUMNS,
)


def read_traces(path: str | Path) -> pd.DataFrame:
    """Read one trace file, checking its columns and statuses; errors name the file."""
    df = read_parquet(path)
    missing = [c for c in TRACE_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"{path}: not a perfzoo trace file, missing columns {missing}")
    bad = sorted(set(df["status"]) - set(STATUSES))
    if bad:
        raise InputError(f"{path}: unknown status values {bad}")
    ok = df[df["status"] == "ok"]
    if (ok["time_ms"].isna() | (ok["time_ms"] <= 0)).any():
        raise InputError(f"{path}: rows with status ok but no positive time_ms")
    return df


def device_of(trace_path: str | Path) -> str:
    """``results/traces/{device}/{shard}.parquet`` → device."""
    return Path(trace_path).parent.name


def load_traces(paths: list[str]) -> pd.DataFrame:
    frames = [read_traces(p).assign(device=device_of(p), trace_file=str(p)) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*TRACE_COLUMNS, "device"])


RUN_ENERGY_COLUMNS = (
    "mem_allocated_mb", "mem_reserved_mb", "nvml_mem_used_mb", "window_s", "window_iters",
    "window_energy_counter_j", "window_energy_samples_j", "energy_disagreement", "power_source",
    "sensor_errors", "energy_message",
)
"""Per-config columns of the energy window carried from the traces onto each run (when present)."""


def aggregate_runs(traces: pd.DataFrame) -> pd.DataFrame:
    """One row per (config, device, repeat, power limit): status, median latency with CI, CV, n, memory,
    and the run's energy-window columns (NaN where the trace has none, e.g. on cpu).

    A measurement timed in several windows (the traces' ``window`` column, ``profiling.windows``) has the
    median of its windows' medians as its latency (two windows: their mean) and the median of their CI bounds
    as its CI (which brackets it); its CV and ``n_iters`` are those of all its iterations together, and
    ``n_windows`` counts the windows (1 without the column)."""
    traces = traces.copy()
    if "power_limit_w" not in traces.columns:
        traces["power_limit_w"] = math.nan
    if "power_limit_swept" not in traces.columns:
        traces["power_limit_swept"] = False
    rows = []
    keys = ["device", "config_id", "repeat", "power_limit_w"]
    for (device, config_id, repeat, limit), g in traces.groupby(keys, sort=True, dropna=False):
        first = g.iloc[0]
        row = {"device": device, "config_id": config_id, "repeat": int(repeat), "model_id": first["model_id"],
               "mode": first["mode"], "batch": int(first["batch"]), "status": first["status"],
               "message": first["message"], "trace_file": first["trace_file"],
               "power_limit_w": float(limit), "power_limit_swept": bool(first["power_limit_swept"])}
        if first["status"] == "ok":
            g = g.sort_values([c for c in (WINDOW, "iter") if c in g.columns])
            first = g.iloc[0]
            times = g["time_ms"].to_numpy()
            windows = window_medians(g)
            med, lo, hi = (float(np.median(bound)) for bound in zip(*windows, strict=True))
            row.update(latency_ms=med, n_windows=len(windows), latency_ci_lo=lo, latency_ci_hi=hi,
                       cv=coefficient_of_variation(times), n_iters=len(times), stop_reason=first["stop_reason"],
                       peak_mem_mb=first["peak_mem_mb"],
                       throughput=first["batch"] / med * 1000)
            row.update({c: first[c] for c in RUN_ENERGY_COLUMNS if c in g.columns})
            if MEMORY_REFERENCE in g.columns:
                row[MEMORY_REFERENCE] = float(first[MEMORY_REFERENCE])
        rows.append(row)
    return pd.DataFrame(rows)


def window_medians(iterations: pd.DataFrame) -> list[tuple[float, float, float]]:
    """(median, CI low, CI high) of each window of one measurement's iterations (:func:`median_ci`; one window
    of them all without a ``window`` column or where it is missing)."""
    if WINDOW not in iterations.columns or iterations[WINDOW].isna().any():
        return [median_ci(iterations["time_ms"].to_numpy())]
    return [median_ci(w.to_numpy()) for _, w in iterations.groupby(WINDOW)["time_ms"]]


MEMORY_REFERENCE = "memory_reference_mb"
"""The reference step's peak memory when the row's config was measured (:mod:`perfzoo.profiling.reference`):
not a feature; the report compares it across a device's rows and with the hardware record
(``memory_reference_hardware_mb``)."""


NOISE_COLUMNS = ["device", "target", "pairs", "noise_mape", "noise_lo90", "noise_hi90"]


def noise_floor(runs: pd.DataFrame) -> pd.DataFrame:
    """MAPE of the second independent measurement against the first, per device and target, with its 90 %
    bootstrap interval over the pairs (``noise_lo90``, ``noise_hi90``; :func:`perfzoo.stats.mape_interval`).

    Runs with energy labels (:func:`energy_labels`) add a row per energy label, over the pairs whose two
    measurements both have it; a device without an energy sensor gets none (never a noise floor of nothing)."""
    ok = runs[runs["status"] == "ok"]
    on = ["device", "config_id", *(["power_limit_w"] if "power_limit_w" in ok.columns else [])]
    pairs = ok[ok["repeat"] == 0].merge(ok[ok["repeat"] == 1], on=on, suffixes=("", "_2"))
    rows = []
    for device, g in pairs.groupby("device"):
        for target in TARGETS:
            rows.append({"device": device, "target": target, **_pair_noise(g, target)})
        for target in (t for t in ENERGY_LABELS if t in g.columns):
            both = g[["config_id", target, f"{target}_2"]].dropna()
            if len(both):
                rows.append({"device": device, "target": target, **_pair_noise(both, target)})
    return pd.DataFrame(rows, columns=NOISE_COLUMNS)


def _pair_noise(pairs: pd.DataFrame, target: str) -> dict[str, float]:
    """The noise floor of ``target`` over ``pairs`` (first and second measurement of each config): their count,
    MAPE and its 90 % interval, each config's pair resampled whole."""
    first, second = pairs[target].to_numpy(), pairs[f"{target}_2"].to_numpy()
    low, high = mape_interval(first, second, pairs["config_id"].to_numpy())
    return {"pairs": len(pairs), "noise_mape": mape(first, second), "noise_lo90": low, "noise_hi90": high}


def status_counts(runs: pd.DataFrame, traces: pd.DataFrame | None = None) -> pd.DataFrame:
    """Configs per device and status of their first measurement, and how many of them were flagged as
    disturbed by interference (``flagged``; the column is absent when the traces record no flags)."""
    first = runs[runs["repeat"] == 0]
    counts = first.groupby(["device", "status"]).size().rename("configs").reset_index()
    if traces is not None and "interference" in traces.columns:
        marked = first.assign(flagged=flagged_mask(first, traces).astype("int64"))
        counts["flagged"] = marked.groupby(["device", "status"])["flagged"].sum().to_numpy()
    return counts.sort_values(["device", "status"]).reset_index(drop=True)


J_PER_KWH = 3.6e6
ENERGY_LABELS = ("mean_power_w", "energy_j", "energy_per_sample_j", "edp", "carbon_g", "carbon_per_sample_g")


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _energy_of_run(row: pd.Series, no_sensor: str | None, carbon_intensity: float) -> dict[str, Any]:
    """Energy labels of one run: per batch, per sample, mean power, EDP, carbon; or NaN with the reason."""
    nan = math.nan
    out: dict[str, Any] = dict.fromkeys(ENERGY_LABELS, nan)
    out.update(energy_source=None, energy_missing_reason="")
    if no_sensor:
        out["energy_missing_reason"] = no_sensor
        return out
    counter, samples = row.get("window_energy_counter_j", nan), row.get("window_energy_samples_j", nan)
    window_s, iters = row.get("window_s", nan), row.get("window_iters", nan)
    if _finite(counter):
        window_j, out["energy_source"] = float(counter), "counter"
    elif _finite(samples):
        window_j, out["energy_source"] = float(samples), "samples"
    else:
        message = row.get("energy_message")
        out["energy_missing_reason"] = (message if isinstance(message, str) and message
                                        else "no energy window in the trace")
        return out
    if not (_finite(iters) and float(iters) > 0 and _finite(window_s) and float(window_s) > 0):
        out.update(energy_source=None, energy_missing_reason="energy window without steps or duration")
        return out
    energy = window_j / float(iters)
    out["mean_power_w"] = window_j / float(window_s)
    out["energy_j"] = energy
    out["energy_per_sample_j"] = energy / float(row["batch"])
    out["edp"] = energy * float(row["latency_ms"]) / 1000.0
    out["carbon_g"] = energy / J_PER_KWH * carbon_intensity
    out["carbon_per_sample_g"] = out["carbon_g"] / float(row["batch"])
    return out


def energy_labels(labels: pd.DataFrame, hardware: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Energy labels per row, from the run's energy window, wherever the device has the sensor.

    ``energy_j`` is the energy of one batch (one step): the window's energy (the NVML counter, else the
    integrated samples, ``energy_source`` says which) divided by its steps; ``energy_per_sample_j`` =
    energy_j / batch; ``mean_power_w`` = window energy / window duration; ``edp`` = energy_j · Δt with Δt
    the median step time (J·s); ``carbon_g`` = energy_j × carbon intensity (g/kWh, the device config's
    ``carbon_intensity_g_per_kwh`` as recorded in ``hardware/{device}.json``) in grams per batch. Where
    the device has no sensor, or the reading failed, the labels are NaN and ``energy_missing_reason``
    says why (never 0).
    """
    labels = labels.copy()
    rows = []
    for _, row in labels.iterrows():
        hw = hardware.get(row["device"], {})
        no_sensor = hw.get("energy_missing_reason") or (
            None if hw.get("energy_sensor") else "no sensor samples")
        intensity = float(hw.get("carbon_intensity_g_per_kwh") or 400.0)
        rows.append(_energy_of_run(row, no_sensor, intensity))
    columns = [*ENERGY_LABELS, "energy_source", "energy_missing_reason"]
    energy = pd.DataFrame(rows, index=labels.index, columns=columns)
    for col in columns:
        labels[col] = energy[col]
    for col in ENERGY_LABELS:
        labels[col] = labels[col].astype("float64")
    labels["energy_source"] = labels["energy_source"].astype(object)
    labels["energy_missing_reason"] = labels["energy_missing_reason"].astype(object)
    return labels


def dataset_key(runs: pd.DataFrame) -> list[str]:
    """Row key of the dataset: KEY, plus ``power_limit_w`` when a power-limit sweep ran on any device."""
    swept = "power_limit_swept" in runs.columns and bool(runs["power_limit_swept"].fillna(False).any())
    return [*KEY, "power_limit_w"] if swept else list(KEY)


def _row_id(data: pd.DataFrame, key: list[str]) -> pd.Series:
    parts = data[KEY].astype(str)
    if "power_limit_w" in key:
        limit = data["power_limit_w"].map(lambda w: f"{w:g}W" if _finite(w) else "-")
        parts = parts.assign(power_limit_w=limit)
    return parts.agg("|".join, axis=1)


def check_one_memory_label(traces: pd.DataFrame, hardware: dict[str, dict[str, Any]]) -> None:
    """Stop when a cpu device's measurements mix the two definitions of its peak-memory label (shards measured
    before and after the label left out file-backed pages, or a journal resumed across that change). The
    trace column ``PEAK_RSS_TOTAL`` is on every measurement of the label without them, missing on the former's."""
    ok = traces[traces["status"] == "ok"]
    for device, rows in ok.groupby("device"):
        if hardware.get(device, {}).get("kind") != "cpu":
            continue
        new = (rows[PEAK_RSS_TOTAL].notna() if PEAK_RSS_TOTAL in rows.columns
               else pd.Series(False, index=rows.index))
        if new.any() and not new.all():
            former = sorted(set(rows.loc[~new, "trace_file"]))
            raise InputError(
                f"device '{device}': {len(former)} trace file(s) ({', '.join(former[:3])}) hold measurements of the "
                "former peak-memory label (the whole resident set), the others leave out file-backed pages; "
                "measure those shards again (snakemake --forcerun <trace file>) so that the device has one label")


def build_dataset(
    manifest: pd.DataFrame, features: pd.DataFrame, trace_paths: list[str], hardware_paths: list[str],
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(dataset, noise floor, status counts) from the raw traces and the feature tables.

    With a power-limit sweep the rows are unique per (model_id, device, mode, batch, power_limit_w), and
    the limit is also a hardware feature (``hw_power_limit_w``; the limit in force, NaN on cpu).
    """
    traces = load_traces(trace_paths)
    runs = aggregate_runs(traces)
    clean = drop_flagged_runs(runs, traces)  # measurements flagged as disturbed are not fitted
    hardware = {Path(p).stem: read_json(p) for p in hardware_paths}
    unknown = sorted(set(runs["device"]) - set(hardware)) if len(runs) else []
    if unknown:
        raise InputError(f"traces for devices {unknown} have no hardware/<device>.json")
    check_one_memory_label(traces, hardware)
    key = dataset_key(runs) if len(runs) else list(KEY)
    measured = energy_labels(clean[clean["status"] == "ok"], hardware)  # every measurement: the noise floor's too
    labels = measured[measured["repeat"] == 0].drop(columns=["repeat", "message", "status"])
    hw = pd.DataFrame([{"device": d, **hardware_features(h), **hardware_calibration(h)}
                       for d, h in sorted(hardware.items())])
    info = manifest[["config_id", "family", "name", "variant", "label", "builder",
                     *(["precision"] if "precision" in manifest.columns else [])]]
    carried = (*MODEL_FEATURES, *OP_FEATURES, OP_ERROR_COLUMN)  # op_*: for the regressors that use them
    model_cols = ["model_id", "mode", "batch", *[c for c in carried if c in features.columns]]
    data = (labels.merge(info, on="config_id", how="left")
            .merge(features[model_cols], on=["model_id", "mode", "batch"], how="left")
            .merge(hw, on="device", how="left"))
    if "power_limit_w" in key:
        data["hw_power_limit_w"] = data["power_limit_w"].astype("float64")
    if MEMORY_REFERENCE in data.columns:
        recorded = {d: (h.get("memory_reference") or {}).get("peak_mem_mb", math.nan) for d, h in hardware.items()}
        data["memory_reference_hardware_mb"] = data["device"].map(recorded).astype("float64")
    if len(data) and data.duplicated(key).any():
        dup = data.loc[data.duplicated(key, keep=False), key].head(3).to_dict("records")
        raise InputError(f"dataset rows are not unique per {key}, e.g. {dup} (traces measured twice?)")
    data["is_training"] = (data["mode"] == "training").astype(float)
    data = precision_peaks(data, hardware)
    data = add_roofline_features(data)
    data.insert(0, "row_id", _row_id(data, key) if len(data) else pd.Series(dtype=object))
    data = data.sort_values("row_id").reset_index(drop=True)
    return data, noise_floor(measured), status_counts(runs, traces)


def imported_only(external: list[pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(dataset, noise floor, status counts) of a config without local devices: the imported rows, and
    empty measurement tables (imported tables carry no repeated measurements or run statuses)."""
    if not external:
        raise InputError("no traces and no imported tables: nothing to build a dataset from")
    data = pd.concat(external, ignore_index=True).sort_values("row_id").reset_index(drop=True)
    noise = pd.DataFrame(columns=NOISE_COLUMNS)
    statuses = pd.DataFrame(columns=["device", "status", "configs"])
    return data, noise, statuses


NOT_MEASURED_STATUS = "not measured (imported table)"


def with_imported_statuses(statuses: pd.DataFrame, not_measured: list[dict[str, Any]]) -> pd.DataFrame:
    """``statuses`` plus one row per device of the models imported tables record as not measured (their
    ``not_measured`` provenance), so the report counts them beside the profiled configs that failed."""
    if not not_measured:
        return statuses
    counts = (pd.DataFrame(not_measured).groupby("device").size().rename("configs").reset_index()
              .assign(status=NOT_MEASURED_STATUS))
    return pd.concat([statuses, counts[["device", "status", "configs"]]], ignore_index=True)


#: the measured GEMM of ``hardware/{device}.json`` that matches each precision (amp runs matmuls in fp16)
GEMM_OF_PRECISION = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16", "amp": "fp16"}


def precision_hardware(hw: dict[str, Any], precision: str) -> dict[str, float]:
    """The hardware features a precision changes: ``hw_tensor_cores`` (1.0 on a GPU at a precision other than
    fp32) and, at such a precision, ``hw_peak_gflops`` as the device's measured GEMM rate of that precision
    (NaN where it did not measure one). One source for the dataset's rows and ``perfzoo predict``'s."""
    out = {"hw_tensor_cores": float(precision != "fp32" and hw.get("kind") == "cuda")}
    if precision != "fp32":
        rate = (hw.get("measured_gemm_tflops") or {}).get(GEMM_OF_PRECISION[precision])
        out["hw_peak_gflops"] = math.nan if rate is None else float(rate) * 1000
    return out


def precision_peaks(data: pd.DataFrame, hardware: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Rows profiled at a precision other than fp32 get the measured GEMM rate of that precision as
    ``hw_peak_gflops`` (NaN where the GPU did not measure it, e.g. unsupported) and ``hw_tensor_cores``
    (:func:`precision_hardware`).

    A zoo of fp32 configs only is left exactly as before (no new column)."""
    if "precision" not in data.columns or (data["precision"].fillna("fp32") == "fp32").all():
        return data
    data = data.copy()
    precision = data["precision"].fillna("fp32")
    features = [precision_hardware(hardware.get(device, {}), p) for device, p in zip(data["device"], precision)]
    data["hw_tensor_cores"] = [f["hw_tensor_cores"] for f in features]
    data["hw_peak_gflops"] = [f.get("hw_peak_gflops", fp32) for f, fp32 in zip(features, data["hw_peak_gflops"])]
    return data


def add_roofline_features(data: pd.DataFrame) -> pd.DataFrame:
    """Roofline times (Panner Selvam, Performance Prediction Models for Deep Learning, PhD thesis 2025, ch. 3) from model and hardware features: compute- and memory-bound bounds.

    Bytes moved per step are the weights (read once; in training also written with their gradient and
    optimizer state, counted 3x) plus the activations written in the forward pass.
    """
    weight_passes = np.where(data.get("is_training", 0) > 0, 3.0, 1.0)
    moved = data["weight_bytes"] * weight_passes + data["activation_bytes"]
    data["roofline_compute_ms"] = data["flops"] / (data["hw_peak_gflops"] * 1e9) * 1e3
    data["roofline_memory_ms"] = moved / (data["hw_mem_bw_gbs"] * 1e9) * 1e3
    data["roofline_ms"] = np.maximum(data["roofline_compute_ms"], data["roofline_memory_ms"])
    return data


ROOFLINE_FEATURES = ("roofline_compute_ms", "roofline_memory_ms", "roofline_ms")


def feature_columns(data: pd.DataFrame) -> list[str]:
    """Numeric predictors: model features, batch and mode, and the device's hardware features."""
    cols = [c for c in (*MODEL_FEATURES, *ROOFLINE_FEATURES) if c in data.columns]
    cols += [c for c in ("batch", "is_training") if c in data.columns]
    cols += sorted(c for c in data.columns if c.startswith("hw_"))
    return cols


def finite_target_rows(data: pd.DataFrame, target: str) -> pd.Series:
    """Rows whose label is a finite positive number (NaN/inf labels are excluded and counted)."""
    y = pd.to_numeric(data[target], errors="coerce")
    return np.isfinite(y) & (y > 0)
