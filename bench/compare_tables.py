"""Compare the outputs of two workflow folders run on the same traces (a behaviour-preserving change).

    python bench/compare_tables.py BEFORE AFTER

CSV files byte for byte, Parquet files as frames (values, dtypes, column order), JSON documents without
their provenance (code version and input hashes change with the code); the measured inputs
(``results/traces``, ``results/hardware``, ``results/layers``) are skipped: they are the shared input.
"""
import json, sys, hashlib
from pathlib import Path
import pandas as pd
a, b = Path(sys.argv[1]), Path(sys.argv[2])
skip_dirs = ("traces", "hardware", "layers")  # measured inputs, copied unchanged
same = diff = 0
report = []
for f in sorted((a / "results").rglob("*")):
    if not f.is_file() or any(f"/results/{d}/" in str(f) for d in skip_dirs):
        continue
    rel = f.relative_to(a); g = b / rel
    if not g.exists():
        report.append(f"MISSING in after: {rel}"); diff += 1; continue
    if f.suffix == ".csv":
        ok = f.read_bytes() == g.read_bytes()
    elif f.suffix == ".parquet":
        x, y = pd.read_parquet(f), pd.read_parquet(g)
        ok = x.equals(y) and list(x.columns) == list(y.columns)
    elif f.suffix == ".json" and "provenance" not in f.name:
        def strip(o):
            if isinstance(o, dict): return {k: strip(v) for k, v in o.items() if k not in ("provenance", "meta", "code_version", "created", "timestamp", "elapsed_s", "featurise_s", "timings")}
            if isinstance(o, list): return [strip(v) for v in o]
            return o
        ok = strip(json.loads(f.read_text())) == strip(json.loads(g.read_text()))
    else:
        continue
    if ok: same += 1
    else: diff += 1; report.append(f"DIFFERS: {rel}")
for f in sorted((b / "results").rglob("*")):
    if f.is_file() and f.suffix in (".csv", ".parquet") and not (a / f.relative_to(b)).exists():
        report.append(f"NEW in after: {f.relative_to(b)}")
print("\n".join(report)); print(f"identical: {same}, different: {diff}")
