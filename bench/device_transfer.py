"""Benchmark: predict AMP inference latency of timm models on a GPU not (or barely) profiled.

Reads timm's published benchmark CSVs (``benchmark-infer-amp-*.csv``) from a directory (argument,
default ``../shared/data/timm-benchmark``) and scores, per held-out GPU:

- ``device_transfer`` (perfzoo.regressors.transfer.DeviceTransferRegressor, class defaults: roofline model
  blended with reference regression for a few-shot device, blend weight chosen by the inner
  leave-one-GPU-out on the training GPUs), leave-one-GPU-out (k = 0) and few-shot (k configs of each
  held-out file in training, several random draws; ``--k``), and three ablations with a fixed weight:
  ``roofline_only`` (``reference_weight=0``), ``blend_half`` (0.5) and ``reference_only`` (1);
- baselines: nearest profiled config scaled by FLOPs; same workload on the nearest device scaled by
  peak FLOP/s, and by memory bandwidth; for few-shot also one constant device factor fitted on the same
  k configs, on the nearest device by specs and on the reference device whose factor fits the k shots
  best (leave-one-out on the shots);
- the coverage of the 90 % conformal intervals, the MAPE left after removing one constant factor per
  held-out file fitted on its test rows (``*_offset_removed``: how much of the error is a device offset),
  and the floor set by software versions (RTX 4090 under torch 2.4 vs 2.9, one constant factor);
- an upper bound per held-out file (``--upper``): reference regression fitted on half of the file's
  configs and scored on the other half (2-fold), beside one constant factor on the best other device
  fitted on all of them.

With ``--op-features FILE`` (made by ``bench/timm_ops.py``: perfzoo's operator trace of every workload on
the meta device), the rows are joined to the per-sample operator features by ``bench/timm_family.py``'s
join (FLOPs, bytes and calls of every operator kind at the row's batch, divided by the batch); rows whose
workload has no trace are left out of every method, counted and named. The features that are zero in
every row (kinds an inference step never runs) are dropped; the others are passed to every
``device_transfer`` variant as ``interaction_features``: sign-safe ``log1p``, standardised, in the hardware ×
workload interactions only (the workload effects, the few-shot correction and the reference regression
keep the CSV features). The baselines do not use them.

The target is latency per sample (``infer_step_time / infer_batch_size``): the batch a GPU ran differs
between files, and per-sample MAPE equals per-step MAPE at the file's batch.

Usage: ``PYTHONPATH=src python bench/device_transfer.py [DIR ...] [--draws 5] [--k 0 5 20] [--degree 1|2] [--upper]
[--op-features FILE.parquet] [--held-out GPU ...] [--few-shot-max-rows N] [--device-features F ...]
[--out FILE.csv]``. Several folders are read together: ``../shared/data/timm-benchmark tests/fixtures/gpu-h200
tests/fixtures/gpu-h100/timm`` adds the H200 and the H100 measured with ``bench/timm_gpu.py``; a row with an
``error`` and no time is named and left out.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfzoo.hardware.specs import lookup_gpu
from perfzoo.regressors.transfer import DeviceTransferRegressor
from perfzoo.stats import mape


@dataclass(frozen=True)
class Gpu:
    """Spec-sheet numbers (NVIDIA whitepapers/datasheets): dense FP16 tensor TFLOP/s with FP32 accumulate."""

    name: str
    fp16_tflops: float
    mem_bw_gbs: float
    sm_count: int
    l2_mb: float
    boost_ghz: float
    tdp_w: float


def _spec_gpu(name: str, l2_mb: float, boost_ghz: float) -> Gpu:
    """A :class:`Gpu` from perfzoo's GPU spec table (``src/perfzoo/data/gpu_specs.csv``), plus what it lacks."""
    spec = lookup_gpu(name)
    return Gpu(spec["name"], float(spec["peak_fp16_tflops"]), float(spec["mem_bw_gbs"]), int(spec["sm_count"]),
               l2_mb, boost_ghz, float(spec["tdp_w"]))


GPUS = {
    # the spec table's rows (Ampere GA102, Ada AD102 and Blackwell GB202 whitepapers), with L2 size and boost clock
    # from the same whitepapers. The PRO 6000 Max-Q datasheet states no FP16 tensor figure, only 3,511 FP4 "AI
    # TOPS" (sparse), so the spec table leaves it empty: 438.9 = 3511 / 8 (dense, FP16 with FP32 accumulate at full
    # rate on workstation parts) is derived here, for this benchmark only.
    "rtx3090": _spec_gpu("RTX 3090", l2_mb=6, boost_ghz=1.695),
    "rtx4090": _spec_gpu("RTX 4090", l2_mb=72, boost_ghz=2.52),
    "4090": _spec_gpu("RTX 4090", l2_mb=72, boost_ghz=2.52),
    "5090": _spec_gpu("RTX 5090", l2_mb=96, boost_ghz=2.407),
    "pro6000maxq": Gpu("RTX PRO 6000 Blackwell Max-Q", 438.9, 1792, 188, 128, 2.28, 300),
    # the H200 measured with bench/timm_gpu.py: its spec-table row (NVIDIA's datasheet); 60 MB of L2 as torch
    # reported it on the lent H200 (tests/fixtures/gpu-h200/), 1.98 GHz boost as the H100 SXM
    "h200": _spec_gpu("H200 SXM", l2_mb=60, boost_ghz=1.98),
    # the H100 measured with bench/timm_gpu.py (tests/fixtures/gpu-h100/timm/): its spec-table row; 50 MB of L2
    # and 1.98 GHz boost from NVIDIA's H100 whitepaper (SXM5)
    "h100": _spec_gpu("H100 SXM", l2_mb=50, boost_ghz=1.98),
}

WORKLOAD = ["flops", "activation_bytes", "weight_bytes"]
HARDWARE = ["hw_peak_gflops", "hw_mem_bw_gbs"]
#: what ``--device-features`` may name: the columns of :func:`load` that describe the device
DEVICE_FEATURES = ["hw_peak_gflops", "hw_sm_count", "hw_l2_mb", "hw_tdp_w"]
#: method name -> DeviceTransferRegressor parameters besides the shared ones
METHODS = {"device_transfer": {}, "roofline_only": {"reference_weight": 0.0},
           "blend_half": {"reference_weight": 0.5}, "reference_only": {"reference_weight": 1.0}}


def load(*directories: Path) -> pd.DataFrame:
    """One row per (file, model, image size): per-sample features, device specs and latency, from the
    ``*benchmark-infer-amp-*.csv`` files of every directory (a row with an ``error`` has no time: left out)."""
    frames = []
    for path in sorted(p for directory in directories for p in directory.glob("*benchmark-infer-amp-*.csv")):
        parts = path.stem.split("-")
        torch_version, key = parts[4], parts[-1]
        gpu = GPUS[key]
        df = pd.read_csv(path)
        if "error" in df:
            failed = df[df["infer_step_time"].isna()]
            for _, bad in failed.iterrows():
                print(f"{path.name}: {bad['model']} not measured: {bad['error']}")
            df = df.drop(failed.index)
        frames.append(pd.DataFrame({
            "model_id": df["model"] + "@" + df["infer_img_size"].astype(str),
            "gpu": gpu.name, "device": f"{gpu.name} ({torch_version})", "torch": torch_version,
            "batch": df["infer_batch_size"].astype(float),
            "flops": 2e9 * df["infer_gmacs"], "activation_bytes": 2e6 * df["infer_macts"],
            "weight_bytes": 2e6 * df["param_count"],
            "hw_peak_gflops": gpu.fp16_tflops * 1e3, "hw_mem_bw_gbs": float(gpu.mem_bw_gbs),
            "hw_sm_count": float(gpu.sm_count), "hw_l2_mb": gpu.l2_mb, "hw_tdp_w": gpu.tdp_w,
            "latency_ms": df["infer_step_time"] / df["infer_batch_size"],
        }))
    data = pd.concat(frames, ignore_index=True)
    data = data[(data[WORKLOAD] > 0).all(axis=1)].drop_duplicates(["device", "model_id"], keep="first")
    return data.reset_index(drop=True)


def with_operator_features(data: pd.DataFrame, path: Path) -> tuple[pd.DataFrame, list[str]]:
    """The rows whose workload has an operator trace in ``path``, with the per-sample operator features,
    and the feature columns that are not zero in every row; the rows left out are counted and named."""
    from timm_family import PER_SAMPLE_OPS, with_op_features  # here: timm_family imports this module's load

    kept = with_op_features(data, path)
    missing = sorted(set(data["model_id"]) - set(kept["model_id"]))
    if missing:
        print(f"left out of every method, no operator trace: {', '.join(missing)}")
    columns = [c for c in PER_SAMPLE_OPS if (kept[c] != 0).any()]
    print(f"{len(columns)} operator features; zero in every row, left out: "
          f"{', '.join(c for c in PER_SAMPLE_OPS if c not in columns) or 'none'}")
    return kept.reset_index(drop=True), columns


def finite_mape(y: np.ndarray, p: np.ndarray) -> float:
    """MAPE in percent over the rows with a finite prediction (NaN when there are none)."""
    ok = np.isfinite(p)
    return mape(y[ok], p[ok])


def offset_removed_mape(test: pd.DataFrame, y: np.ndarray, p: np.ndarray) -> float:
    """MAPE after dividing each held-out file's predictions by their geometric-mean ratio to its measured
    times: the error one known constant factor per file would leave (a diagnostic that reads the test
    labels, not a method)."""
    ratio = pd.Series(np.log(p / y), index=test.index).groupby(test["device"]).transform("mean").to_numpy()
    return finite_mape(y, p / np.exp(ratio))


def nearest_devices(train: pd.DataFrame, target: pd.Series) -> list[str]:
    """Training devices ordered by distance in (log peak FLOP/s, log bandwidth); same torch first on ties."""
    specs = train.groupby("device")[[*HARDWARE, "torch"]].first()
    dist = np.hypot(np.log(specs["hw_peak_gflops"] / target["hw_peak_gflops"]),
                    np.log(specs["hw_mem_bw_gbs"] / target["hw_mem_bw_gbs"]))
    order = pd.DataFrame({"d": dist.round(9), "other_torch": specs["torch"] != target["torch"]})
    return list(order.sort_values(["d", "other_torch"]).index)


def device_baselines(train: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    """Same workload on the nearest training device that ran it, scaled by peak FLOP/s and by bandwidth."""
    out = pd.DataFrame(index=test.index, columns=["peak", "bandwidth", "ref_ms"], dtype=float)
    for device, rows in test.groupby("device"):
        todo = rows.index
        for ref in nearest_devices(train, rows.iloc[0]):
            src = train[train["device"] == ref].set_index("model_id")
            hit = rows.loc[todo][rows.loc[todo, "model_id"].isin(src.index)]
            if hit.empty:
                continue
            s = src.loc[hit["model_id"]]
            out.loc[hit.index, "ref_ms"] = s["latency_ms"].to_numpy()
            out.loc[hit.index, "peak"] = s["latency_ms"].to_numpy() * s["hw_peak_gflops"].to_numpy() / hit["hw_peak_gflops"]
            out.loc[hit.index, "bandwidth"] = s["latency_ms"].to_numpy() * s["hw_mem_bw_gbs"].to_numpy() / hit["hw_mem_bw_gbs"]
            todo = todo.difference(hit.index)
            if todo.empty:
                break
    return out


def flops_baseline(train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """Nearest training config in standardised log (workload + hardware) features, scaled by the FLOPs ratio."""
    cols = [*WORKLOAD, *HARDWARE]
    A, B = np.log(train[cols].to_numpy()), np.log(test[cols].to_numpy())
    mu, sd = A.mean(0), A.std(0) + 1e-12
    A, B = (A - mu) / sd, (B - mu) / sd
    nn = np.array([np.argmin(((A - b) ** 2).sum(1)) for b in B])
    src = train.iloc[nn]
    return src["latency_ms"].to_numpy() * test["flops"].to_numpy() / src["flops"].to_numpy()


def shot_rows(data: pd.DataFrame, held: pd.Series, k: int, rng: np.random.Generator) -> np.ndarray:
    """k random rows of each held-out device file (indices)."""
    picked = [rng.choice(g.index.to_numpy(), size=k, replace=False) for _, g in data[held].groupby("device")]
    return np.concatenate(picked) if picked else np.array([], dtype=int)


def constant_factor(train: pd.DataFrame, shots: pd.DataFrame, test: pd.DataFrame, base: pd.DataFrame) -> np.ndarray:
    """Nearest-device time x one factor per held-out device (geometric mean ratio on its k shots)."""
    pred = np.full(len(test), np.nan)
    shot_base = device_baselines(train, shots)["ref_ms"]
    for device in test["device"].unique():
        s = shots["device"] == device
        ok = s & shot_base.notna()
        factor = np.exp(np.mean(np.log(shots.loc[ok, "latency_ms"] / shot_base[ok])))
        m = (test["device"] == device).to_numpy()
        pred[m] = base["ref_ms"].to_numpy()[m] * factor
    return pred


def log_time_table(train: pd.DataFrame) -> pd.DataFrame:
    """Log latency per (workload, training device)."""
    return np.log(train.pivot_table(index="model_id", columns="device", values="latency_ms", aggfunc="first"))


def best_reference_factor(train: pd.DataFrame, shots: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """Per held-out device: the training device whose one constant factor has the lowest leave-one-out
    error on the k shots, times that factor (fitted on the shots); NaN where it did not run the workload."""
    table = log_time_table(train)
    pred = np.full(len(test), np.nan)
    for device, s in shots.groupby("device"):
        y = np.log(s.set_index("model_id")["latency_ms"])
        best = None
        for ref in table.columns:
            gap = (y - table[ref].reindex(y.index)).dropna()
            if len(gap) < 2:
                continue
            loo = gap - (gap.sum() - gap) / (len(gap) - 1)
            if best is None or loo.abs().mean() < best[0]:
                best = (loo.abs().mean(), ref, gap.mean())
        m = (test["device"] == device).to_numpy()
        if best is not None:
            pred[m] = np.exp(table[best[1]].reindex(test.loc[m, "model_id"]).to_numpy() + best[2])
    return pred


@dataclass(frozen=True)
class Setup:
    """What every ``DeviceTransferRegressor`` of a run shares: the interaction degree (``--degree``) and the
    operator feature columns in its hardware x workload interactions (``--op-features``; none without)."""

    degree: int = 1
    interaction: tuple[str, ...] = ()
    few_shot_max_rows: int | None = None  # the regressor's default when None
    device_features: tuple[str, ...] = ("hw_peak_gflops",)  # over the bandwidth anchor (``--device-features``)


def fit_method(train: pd.DataFrame, method: str, setup: Setup, **extra: object) -> DeviceTransferRegressor:
    if setup.few_shot_max_rows is not None:
        extra.setdefault("few_shot_max_rows", setup.few_shot_max_rows)
    reg = DeviceTransferRegressor(workload_features=WORKLOAD, group_col="gpu", interaction_degree=setup.degree,
                                  interaction_features=list(setup.interaction), device_features=setup.device_features,
                                  **METHODS[method], **extra)
    return reg.fit(train, train["latency_ms"])


def evaluate_fold(data: pd.DataFrame, gpu: str, k: int, seed: int, setup: Setup) -> dict[str, float]:
    held = data["gpu"] == gpu
    shots = shot_rows(data, held, k, np.random.default_rng(seed)) if k else np.array([], dtype=int)
    train = data[~held | data.index.isin(shots)]
    test = data[held & ~data.index.isin(shots)]
    y = test["latency_ms"].to_numpy()
    row: dict[str, float] = {"gpu": gpu, "k": k, "seed": seed, "n_test": len(test)}
    preds = {}
    for method in METHODS if k else ["device_transfer"]:
        reg = fit_method(train, method, setup)
        pred = preds[method] = reg.predict(test)
        row[method] = finite_mape(y, pred)
        row[f"{method}_offset_removed"] = offset_removed_mape(test, y, pred)
        lo, hi = reg.predict_interval(test)
        row[f"{method}_coverage90"] = float(np.mean((y >= lo) & (y <= hi)) * 100)
        row[f"{method}_weight"] = reg.reference_weight_
    base_train = train[~train.index.isin(shots)]
    base = device_baselines(base_train, test)
    row.update({"baseline_flops_nearest_config": finite_mape(y, flops_baseline(base_train, test)),
                "baseline_peak_flops": finite_mape(y, base["peak"].to_numpy()),
                "baseline_bandwidth": finite_mape(y, base["bandwidth"].to_numpy()),
                "baseline_coverage": float(base["peak"].notna().mean() * 100)})
    if k:
        row["constant_factor_nearest_k"] = finite_mape(y, constant_factor(base_train, data.loc[shots], test, base))
        best_factor = best_reference_factor(base_train, data.loc[shots], test)
        row["constant_factor_best_k"] = finite_mape(y, best_factor)
        # the rows it predicts: those whose workload its device ran (all but a few on the timm files; on a device
        # that ran a sample, e.g. the H200 as the H100's reference, only that sample), and device_transfer on them
        covered = np.isfinite(best_factor)
        row["constant_factor_best_k_coverage"] = float(covered.mean() * 100)
        row["device_transfer_on_best_k_rows"] = finite_mape(y[covered], preds["device_transfer"][covered])
    return row


def upper_bound(data: pd.DataFrame, device: str, setup: Setup) -> dict[str, float]:
    """Reference regression with half of ``device``'s configs in training (2-fold, scored on the other
    half) and one constant factor on the best other GPU's file fitted on all of them (in-sample)."""
    gpu = data.loc[data["device"] == device, "gpu"].iloc[0]
    rows = data.index[data["device"] == device].to_numpy()
    halves = np.array_split(np.random.default_rng(0).permutation(rows), 2)
    others = data[data["gpu"] != gpu]
    y_all, pred = data.loc[rows, "latency_ms"], pd.Series(np.nan, index=rows)
    for shots, test in (halves, halves[::-1]):
        train = pd.concat([others, data.loc[shots]])
        reg = fit_method(train, "reference_only", setup, few_shot_max_rows=len(shots))
        pred[test] = reg.predict(data.loc[test])
    table = log_time_table(others)
    y = np.log(data.loc[rows].set_index("model_id")["latency_ms"])
    factor = min(finite_mape(np.exp(y.to_numpy()), np.exp((table[ref].reindex(y.index) + g.mean()).to_numpy()))
                 for ref in table.columns for g in [(y - table[ref].reindex(y.index)).dropna()])
    return {"device": device, "n": len(rows), "reference_regression_half": finite_mape(y_all.to_numpy(), pred.to_numpy()),
            "constant_factor_best_all": factor}


def software_floor(data: pd.DataFrame) -> float:
    """MAPE of one constant factor mapping RTX 4090 torch 2.4 times to torch 2.9 times (fitted on all)."""
    a = data[data["device"] == "RTX 4090 (pt240)"].set_index("model_id")["latency_ms"]
    b = data[data["device"] == "RTX 4090 (pt291)"].set_index("model_id")["latency_ms"]
    common = a.index.intersection(b.index)
    factor = np.exp(np.mean(np.log(b[common] / a[common])))
    return finite_mape(b[common].to_numpy(), a[common].to_numpy() * factor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="*", default=[Path("../shared/data/timm-benchmark")], type=Path,
                        help="folders of timm benchmark CSVs (e.g. also tests/fixtures/gpu-h200 and gpu-h100/timm)")
    parser.add_argument("--held-out", nargs="+", default=None, help="GPU names to hold out (default: every GPU)")
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--k", type=int, nargs="+", default=[0, 5, 20], help="configs of the held-out GPU in training")
    parser.add_argument("--degree", type=int, choices=(1, 2), default=1, help="interaction degree of device_transfer")
    parser.add_argument("--upper", action="store_true", help="also the upper bound with half of each file in training")
    parser.add_argument("--op-features", type=Path, default=None,
                        help="operator features from bench/timm_ops.py")
    parser.add_argument("--few-shot-max-rows", type=int, default=None,
                        help="a device with at most this many rows is a few-shot device (regressor default: 50)")
    parser.add_argument("--device-features", nargs="+", default=["hw_peak_gflops"], choices=DEVICE_FEATURES,
                        help="device_transfer's hardware features over the bandwidth anchor")
    parser.add_argument("--out", type=Path, default=Path("bench/device_transfer.csv"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    data, interaction = load(*args.directory), []
    if args.op_features:
        data, interaction = with_operator_features(data, args.op_features)
    setup = Setup(args.degree, tuple(interaction), args.few_shot_max_rows, tuple(args.device_features))
    print(f"{len(data)} rows, {data['model_id'].nunique()} workloads, devices: {sorted(data['device'].unique())}")
    rows = []
    for gpu in sorted(args.held_out or data["gpu"].unique()):
        for k in args.k:
            rows += [evaluate_fold(data, gpu, k, seed, setup) for seed in range(args.draws if k else 1)]
    table = pd.DataFrame(rows)
    summary = table.drop(columns="seed").groupby(["gpu", "k"], sort=True).mean().reset_index()
    baselines = [c for c in summary.columns if c.startswith("baseline_") and c != "baseline_coverage"]
    summary["best_baseline"] = summary[baselines].min(axis=1)
    summary["best_baseline_x"] = summary["best_baseline"] / summary["device_transfer"]
    if "constant_factor_best_k" in summary:
        factors = summary[["constant_factor_nearest_k", "constant_factor_best_k"]].min(axis=1)
        summary["best_factor_x"] = factors / summary["device_transfer"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    pd.set_option("display.width", 250)
    print(summary.round(2).to_markdown(index=False))
    if args.upper:
        upper = pd.DataFrame([upper_bound(data, device, setup) for device in sorted(data["device"].unique())])
        print("\nupper bound (half of the held-out file in training):")
        print(upper.round(2).to_markdown(index=False))
    print(f"\nsoftware-version floor (RTX 4090 torch 2.4 -> 2.9, one factor): {software_floor(data):.2f} % MAPE")
    print(f"{time.perf_counter() - start:.0f} s wall, {time.process_time():.0f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
