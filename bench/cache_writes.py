"""Offline experiment: operator bytes with writes to a cache-resident storage credited as cached, on a finished run.

    PYTHONPATH=src python bench/cache_writes.py RUN_DIR orig|writes     # features of RUN_DIR's manifest
    PYTHONPATH=src python bench/cache_writes.py RUN_DIR orig|writes --eval

The trace credits the bytes an operator *reads* from the simulated 16 MiB cache (``bytes_cached``); ``writes``
also credits the bytes it writes to a storage the cache holds (``perfzoo.features.ops.cached_bytes`` replaced
in this process by ``cached_bytes_writes``, a copy of it whose only change is that output hits count too; kept
here, not as an option of the product's function, because the variant was not adopted). The first form re-featurises the run's manifest (``orig`` reproduces its op features exactly)
into ``/tmp/cache_writes_<variant>.parquet``; ``--eval`` refits ``composed`` and ``composed_blend`` on the run's
dataset and splits with those op features and prints the test MAPE (``bench/RESULTS.md``, "A cap on composed's
per-call cost": not adopted).
"""
import os
import sys
import numpy as np, pandas as pd
from collections import OrderedDict
import perfzoo.features.ops as ops
from perfzoo.features.meta import featurise_manifest
from perfzoo.io import read_parquet

RUN, MODE = os.path.abspath(sys.argv[1]), sys.argv[2]
OUT = f"/tmp/cache_writes_{MODE}.parquet"

def cached_bytes_writes(rows, capacity=ops.CACHE_BYTES):
    cache = OrderedDict(); held = 0
    counted = np.zeros(len(rows), dtype=np.int64)
    for counting in (False, True):
        for i, row in enumerate(rows):
            for is_output, group in enumerate(row.get(ops._ACCESSES, ())):
                for key, nbytes, storage_bytes in group:
                    if cache.get(key) == storage_bytes:
                        cache.move_to_end(key)
                        if counting:
                            counted[i] += nbytes
                        continue
                    held -= cache.pop(key, 0)
                    if storage_bytes > capacity:
                        continue
                    cache[key] = storage_bytes; held += storage_bytes
                    while held > capacity:
                        held -= cache.popitem(last=False)[1]
    return counted

def featurise() -> None:
    if MODE == "writes":
        ops.cached_bytes = cached_bytes_writes
    manifest = read_parquet(os.path.join(RUN, "results", "zoo", "manifest.parquet"))
    models, _ = featurise_manifest(manifest, 100, progress=False)  # the default config's num_classes and sgd
    models.to_parquet(OUT)
    print(f"{len(models)} configs -> {OUT}")


def evaluate() -> None:
    import perfzoo.regressors.composed as composed
    from perfzoo.fitting import fit_split

    results = os.path.join(RUN, "results")
    data = read_parquet(os.path.join(results, "dataset", "dataset.parquet"))
    key, cols = ["model_id", "mode", "batch"], list(composed.OP_FEATURES)
    feats = pd.read_parquet(OUT)[key + cols]
    merged = data.drop(columns=cols).merge(feats, on=key, how="left", validate="many_to_one")[data.columns]
    out = {}
    for split in ("leave_one_family_out", "batch_extrapolation", "random", "family_monte_carlo", "stratified_kfold"):
        s = read_parquet(os.path.join(results, "splits", f"{split}.parquet"))
        for reg in ("composed", "composed_blend"):
            pred, _, _ = fit_split(merged, s, "latency_ms", reg)
            test = pred[pred["set"] == "test"]
            out[(split, reg)] = round(float((test["y_pred"] / test["y_true"] - 1).abs().mean() * 100), 2)
    print(MODE, pd.Series(out).unstack().to_string())


if __name__ == "__main__":
    evaluate() if "--eval" in sys.argv else featurise()
