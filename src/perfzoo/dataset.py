"""Dataset stage: aggregate raw iteration traces into labels and join model and hardware features."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.hardware import hardware_features
from perfzoo.io import InputError, read_json, read_parquet
from perfzoo.profiling.runner import STATUSES, TRACE_COLUMNS
from perfzoo.stats import coefficient_of_variation, mape, median_ci

KEY = ["model_id", "device", "mode", "batch"]
LABELS = ["latency_ms", "throughput", "peak_mem_mb", "mean_power_w", "energy_j", "energy_per_sample_j", "edp"]
TARGETS = ("latency_ms", "throughput", "peak_mem_mb")
MODEL_FEATURES = (
    "flops", "flops_fw", "macs", "params", "trainable_params", "weight_bytes", "activation_bytes",
    "input_bytes", "n_layers", "n_conv", "n_linear", "n_norm", "n_act", "n_pool", "n_attention",
    "n_dropout", "n_embedding", "graph_nodes", "graph_edges", "complexity_fw", "complexity_bw", "depth",
    "train_mem_estimate_bytes",
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


def aggregate_runs(traces: pd.DataFrame) -> pd.DataFrame:
    """One row per (config, device, repeat): status, median latency with CI, CV, n, memory."""
    rows = []
    for (device, config_id, repeat), g in traces.groupby(["device", "config_id", "repeat"], sort=True):
        first = g.iloc[0]
        row = {"device": device, "config_id": config_id, "repeat": int(repeat), "model_id": first["model_id"],
               "mode": first["mode"], "batch": int(first["batch"]), "status": first["status"],
               "message": first["message"], "trace_file": first["trace_file"]}
        if first["status"] == "ok":
            times = g.sort_values("iter")["time_ms"].to_numpy()
            med, lo, hi = median_ci(times)
            row.update(latency_ms=med, latency_ci_lo=lo, latency_ci_hi=hi, cv=coefficient_of_variation(times),
                       n_iters=len(times), stop_reason=first["stop_reason"], peak_mem_mb=first["peak_mem_mb"],
                       throughput=first["batch"] / med * 1000)
        rows.append(row)
    return pd.DataFrame(rows)


def noise_floor(runs: pd.DataFrame) -> pd.DataFrame:
    """MAPE of the second independent measurement against the first, per device and target."""
    ok = runs[runs["status"] == "ok"]
    pairs = ok[ok["repeat"] == 0].merge(ok[ok["repeat"] == 1], on=["device", "config_id"], suffixes=("", "_2"))
    rows = []
    for device, g in pairs.groupby("device"):
        for target in TARGETS:
            rows.append({"device": device, "target": target, "pairs": len(g),
                         "noise_mape": mape(g[target].to_numpy(), g[f"{target}_2"].to_numpy())})
    return pd.DataFrame(rows, columns=["device", "target", "pairs", "noise_mape"])


def status_counts(runs: pd.DataFrame) -> pd.DataFrame:
    """Configs per device and status of their first measurement."""
    counts = runs[runs["repeat"] == 0].groupby(["device", "status"]).size().rename("configs").reset_index()
    return counts.sort_values(["device", "status"]).reset_index(drop=True)


def energy_labels(labels: pd.DataFrame, hardware: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Energy columns: missing (NaN) with the reason wherever the device has no sensor."""
    labels = labels.copy()
    for col in ("mean_power_w", "energy_j", "energy_per_sample_j", "edp"):
        labels[col] = math.nan
    labels["energy_missing_reason"] = labels["device"].map(
        lambda d: hardware[d].get("energy_missing_reason") or "no sensor samples")
    return labels


def build_dataset(
    manifest: pd.DataFrame, features: pd.DataFrame, trace_paths: list[str], hardware_paths: list[str],
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(dataset, noise floor, status counts) from the raw traces and the feature tables."""
    runs = aggregate_runs(load_traces(trace_paths))
    hardware = {Path(p).stem: read_json(p) for p in hardware_paths}
    unknown = sorted(set(runs["device"]) - set(hardware)) if len(runs) else []
    if unknown:
        raise InputError(f"traces for devices {unknown} have no hardware/<device>.json")
    first = runs[(runs["repeat"] == 0) & (runs["status"] == "ok")].drop(columns=["repeat", "message", "status"])
    labels = energy_labels(first, hardware)
    hw = pd.DataFrame([{"device": d, **hardware_features(h)} for d, h in sorted(hardware.items())])
    info = manifest[["config_id", "family", "name", "variant", "label", "builder"]]
    model_cols = ["model_id", "mode", "batch", *[c for c in MODEL_FEATURES if c in features.columns]]
    data = (labels.merge(info, on="config_id", how="left")
            .merge(features[model_cols], on=["model_id", "mode", "batch"], how="left")
            .merge(hw, on="device", how="left"))
    data["is_training"] = (data["mode"] == "training").astype(float)
    data = add_roofline_features(data)
    data.insert(0, "row_id", data[KEY].astype(str).agg("|".join, axis=1))
    data = data.sort_values("row_id").reset_index(drop=True)
    return data, noise_floor(runs), status_counts(runs)


def add_roofline_features(data: pd.DataFrame) -> pd.DataFrame:
    """Roofline times (seed 003 ch. 3) from model and hardware features: compute- and memory-bound bounds.

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
