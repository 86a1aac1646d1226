"""Benchmark: which hardware features should carry ``device_transfer``'s device effect at k = 0?

``device_transfer`` models a device by its bandwidth (the anchor) and, by default, its peak tensor FLOP/s
(``device_features``). Candidates here, each physically motivated: peak alone; peak and SM count (the
non-GEMM operators run on the SMs' vector units); peak and board power (at timm's batches the cards run at
their power cap); peak and FP32 CUDA-core FLOP/s (the spec table's). Per held-out GPU (leave-one-GPU-out,
k = 0) the candidate is **chosen by an inner leave-one-GPU-out on the training GPUs only** (mean of the
per-GPU MAPE; and, printed beside it, by the median), then scored on the held-out GPU: the choice sees no
row of the GPU it is scored on. Every candidate's outer score is printed too, to show what a choice made on
the held-out GPUs would have been worth (not a method: it reads the test labels).

Usage: ``PYTHONPATH=src python bench/device_features.py [DIR ...]`` (default ``../shared/data/timm-benchmark``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
import device_transfer as dt  # noqa: E402 - the benchmark's loader and GPU table

from perfzoo.hardware.specs import lookup_gpu  # noqa: E402
from perfzoo.stats import mape  # noqa: E402

CANDIDATES = {"peak": ("hw_peak_gflops",), "peak+sm": ("hw_peak_gflops", "hw_sm_count"),
              "peak+tdp": ("hw_peak_gflops", "hw_tdp_w"), "peak+fp32": ("hw_peak_gflops", "hw_fp32_gflops")}


def score(train: pd.DataFrame, test: pd.DataFrame, features: tuple[str, ...]) -> float:
    """MAPE of ``device_transfer`` (as ``bench/device_transfer.py`` fits it) at k = 0."""
    reg = dt.fit_method(train, "device_transfer", dt.Setup(device_features=features))
    return mape(test["latency_ms"].to_numpy(), reg.predict(test))


def main(argv: list[str]) -> int:
    start = time.perf_counter()
    data = dt.load(*[Path(a) for a in argv] or [Path("../shared/data/timm-benchmark")])
    data["hw_fp32_gflops"] = data["gpu"].map({g: float(lookup_gpu(g)["peak_fp32_tflops"]) * 1e3
                                              for g in data["gpu"].unique()})
    rows = []
    for gpu in sorted(data["gpu"].unique()):
        train, test = data[data["gpu"] != gpu], data[data["gpu"] == gpu]
        inner = {name: [score(train[train["gpu"] != g], train[train["gpu"] == g], feats)
                        for g in sorted(train["gpu"].unique())] for name, feats in CANDIDATES.items()}
        by_mean = min(inner, key=lambda n: np.mean(inner[n]))
        by_median = min(inner, key=lambda n: np.median(inner[n]))
        outer = {name: score(train, test, feats) for name, feats in CANDIDATES.items()}
        rows.append({"gpu": gpu, **{f"inner {n}": np.mean(v) for n, v in inner.items()},
                     "chosen (mean)": by_mean, "chosen (median)": by_median,
                     **{f"outer {n}": v for n, v in outer.items()},
                     "nested (mean)": outer[by_mean], "nested (median)": outer[by_median]})
        print(rows[-1], flush=True)
    print(pd.DataFrame(rows).round(2).to_markdown(index=False))
    print(f"{time.perf_counter() - start:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
