"""Rule-of-thumb baselines scored beside every regressor on the same held-out rows.

For each fold of a split, from that fold's training rows only:

``baseline:flops_nearest``
    The nearest training row (Euclidean distance of standardised logs of the workload features
    ``flops, weight_bytes, activation_bytes, batch`` and the device's ``hw_peak_gflops,
    hw_mem_bw_gbs``), its target scaled by the FLOPs ratio (``FLOPS_EXPONENT``).
``baseline:device_peak`` / ``baseline:device_bandwidth``
    The same workload (``model_id``, ``mode``; nearest batch) on the nearest training device that ran
    it (distance of log peak FLOP/s and log bandwidth), scaled by the FLOPs ratio (batch) and by the
    ratio of peak FLOP/s, respectively of memory bandwidth (``DEVICE_EXPONENT``).
``baseline:device_factor``
    The same workload on the nearest other device times one constant factor per device, the
    geometric mean ratio over the held-out device's own training rows (few-shot or random splits;
    missing where the device has no training rows).

Time-like targets are scaled (time ∝ FLOPs / peak); power and memory take the source value unscaled.
A test row without a source (workload never run on another device, column missing) gets no baseline
prediction; the metrics count the rows each baseline covers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfzoo.stats import mean_and_scale

BASELINES = ("baseline:flops_nearest", "baseline:device_peak", "baseline:device_bandwidth",
             "baseline:device_factor")
#: exponent of the (test / source) FLOPs ratio and of the batch ratio applied to a source value
FLOPS_EXPONENT = {"latency_ms": (1.0, 0.0), "throughput": (-1.0, 1.0), "energy_per_sample_j": (1.0, -1.0),
                  "edp": (2.0, -1.0), "mean_power_w": (0.0, 0.0), "peak_mem_mb": (0.0, 0.0)}
#: exponent of the (source / test) peak or bandwidth ratio
DEVICE_EXPONENT = {"latency_ms": 1.0, "throughput": -1.0, "energy_per_sample_j": 0.0, "edp": 1.0,
                   "mean_power_w": 0.0, "peak_mem_mb": 0.0}
NEAREST_FEATURES = ("flops", "weight_bytes", "activation_bytes", "batch", "hw_peak_gflops", "hw_mem_bw_gbs")
HARDWARE = ("hw_peak_gflops", "hw_mem_bw_gbs")


def _positive_log(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    values = frame[columns].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(values > 0, np.log(values), np.nan)


def _workload_scale(target: str, test: pd.DataFrame, source: pd.DataFrame) -> np.ndarray:
    """(flops_t / flops_s)^a · (batch_t / batch_s)^b for the target's exponents (NaN if unknown)."""
    a, b = FLOPS_EXPONENT.get(target, (np.nan, np.nan))
    def ratio(col: str) -> np.ndarray:
        return pd.to_numeric(test[col]).to_numpy(float) / pd.to_numeric(source[col]).to_numpy(float)

    if not a:
        flops = np.ones(len(test))
    else:  # no FLOPs column: no prediction, never the source value unscaled
        flops = ratio("flops") if "flops" in test else np.full(len(test), np.nan)
    batch = ratio("batch") if b else np.ones(len(test))
    return flops ** a * batch ** b


def flops_nearest(train: pd.DataFrame, test: pd.DataFrame, target: str) -> np.ndarray:
    """Nearest training config in standardised log features, scaled by the FLOPs ratio."""
    cols = [c for c in NEAREST_FEATURES if c in train.columns and c in test.columns]
    A, B = _positive_log(train, cols), _positive_log(test, cols)
    keep = np.isfinite(A).all(axis=1)
    out = np.full(len(test), np.nan)
    if not keep.any() or not cols:
        return out
    A = A[keep]
    mu, sd = mean_and_scale(A)
    A, B = (A - mu) / sd, (B - mu) / sd
    ok = np.isfinite(B).all(axis=1)
    nearest = np.array([np.argmin(((A - b) ** 2).sum(axis=1)) for b in B[ok]], dtype=int)
    source = train[keep].iloc[nearest]
    out[ok] = source[target].to_numpy(float) * _workload_scale(target, test[ok], source)
    return out


def _devices_by_distance(train: pd.DataFrame, device_row: pd.Series) -> list[str]:
    """Training devices other than this one, nearest first in (log peak FLOP/s, log bandwidth)."""
    specs = train.groupby("device")[list(HARDWARE)].first()
    specs = specs[specs.index != device_row["device"]]
    dist = np.hypot(*(np.log(specs[c].astype(float) / float(device_row[c])) for c in HARDWARE))
    return list(dist.dropna().sort_values(kind="stable").index)


def same_workload_nearest_device(train: pd.DataFrame, test: pd.DataFrame, target: str) -> pd.DataFrame:
    """Per test row: the source value (scaled for batch) and the source device's peak and bandwidth."""
    out = pd.DataFrame(np.nan, index=test.index, columns=["value", *HARDWARE])
    if not all(c in train.columns for c in HARDWARE):
        return out
    for _, rows in test.groupby("device"):
        todo = rows
        for ref in _devices_by_distance(train, rows.iloc[0]):
            src = train[train["device"] == ref]
            merged = todo.assign(index=todo.index).reset_index(drop=True).merge(
                src, on=["model_id", "mode"], suffixes=("", "_src"))
            if merged.empty:
                continue
            merged["gap"] = np.abs(np.log(merged["batch"].astype(float) / merged["batch_src"].astype(float)))
            merged = merged.sort_values(["index", "gap"], kind="stable").drop_duplicates("index")
            source = merged[[c + "_src" for c in ("flops", "batch") if c + "_src" in merged]].rename(
                columns=lambda c: c[:-4])
            value = merged[f"{target}_src"].to_numpy(float) * _workload_scale(target, merged, source)
            out.loc[merged["index"], "value"] = value
            out.loc[merged["index"], list(HARDWARE)] = merged[[c + "_src" for c in HARDWARE]].to_numpy(float)
            todo = todo.drop(index=merged["index"])
            if todo.empty:
                break
    return out


def device_baselines(train: pd.DataFrame, test: pd.DataFrame, target: str) -> dict[str, np.ndarray]:
    """Same workload on the nearest device, scaled by peak FLOP/s, by bandwidth, by a fitted factor."""
    source = same_workload_nearest_device(train, test, target)
    e = DEVICE_EXPONENT.get(target, np.nan)
    peak = source["value"] * (source["hw_peak_gflops"] / test["hw_peak_gflops"].astype(float)) ** e
    bandwidth = source["value"] * (source["hw_mem_bw_gbs"] / test["hw_mem_bw_gbs"].astype(float)) ** e
    factor = np.full(len(test), np.nan)
    own = train[train["device"].isin(test["device"].unique())]
    if len(own):
        own_source = same_workload_nearest_device(train[~train.index.isin(own.index)], own, target)["value"]
        ratio = np.log(own[target].astype(float) / own_source)
        per_device = ratio[np.isfinite(ratio)].groupby(own["device"]).mean()
        factor = (source["value"] * np.exp(test["device"].map(per_device).astype(float))).to_numpy()
    return {"baseline:device_peak": peak.to_numpy(float),
            "baseline:device_bandwidth": bandwidth.to_numpy(float), "baseline:device_factor": factor}


def baseline_predictions(data: pd.DataFrame, split: pd.DataFrame, target: str) -> pd.DataFrame:
    """Baseline predictions on the test rows of every fold, in the prediction-table layout."""
    data = data.set_index("row_id", drop=False)
    frames = []
    for fold, rows in split.groupby("fold", sort=True):
        rows = rows[rows["row_id"].isin(data.index)]
        train = data.loc[rows.loc[rows["set"] == "train", "row_id"]]
        train = train[np.isfinite(pd.to_numeric(train[target], errors="coerce"))]
        test = data.loc[rows.loc[rows["set"] == "test", "row_id"]]
        if train.empty or test.empty:
            continue
        predicted = {"baseline:flops_nearest": flops_nearest(train, test, target),
                     **device_baselines(train, test, target)}
        for name in BASELINES:
            frames.append(pd.DataFrame({
                "split": split["split"].iloc[0], "fold": str(fold), "set": "test",
                "row_id": test["row_id"].to_numpy(),
                "target": target, "regressor": name, "y_true": test[target].to_numpy(float),
                "y_pred": predicted[name]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
