"""Import timm's benchmark files (GPU inference at AMP and GPU training) and time the featurisation.

Usage: python bench/timm_import.py [--data DIR] [--out FILE.parquet] [--workers N] [--limit N]

Every file is imported with ``perfzoo.external`` (format ``timm``; device, precision and software stack
from the file name) in one process, so a model listed in several files is featurised once. Prints the
featurisation rate (configs = distinct (model, resolution, precision, mode, batch) rows featurised,
per second of featurisation wall time) and every model that could not be featurised, with why.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from perfzoo.external import ImportOptions, import_external, unfeaturisable_models  # noqa: E402
from perfzoo.provenance import provenance, write_table  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "timm-benchmark"
GPU_FILES = (
    "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv",
    "benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv",
    "benchmark-infer-amp-nchw-pt291-cu128-4090.csv",
    "benchmark-infer-amp-nchw-pt291-cu130-5090.csv",
    "benchmark-infer-amp-nchw-pt291-cu130-pro6000maxq.csv",
    "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--limit", type=int, default=0, help="first N models of each file only (0: all)")
    args = parser.parse_args()
    frames, paths = [], []
    total_start = time.perf_counter()
    for name in GPU_FILES:
        path = args.data / name
        if args.limit:
            lines = path.read_text().splitlines()[: args.limit + 1]
            path = Path("/tmp") / f"limit{args.limit}-{name}"
            path.write_text("\n".join(lines) + "\n")
        start = time.perf_counter()
        data, _ = import_external(path, options=ImportOptions(fmt="timm", workers=args.workers, progress=True))
        elapsed = time.perf_counter() - start
        configs = len(data[["model_id", "mode", "batch"]].drop_duplicates())
        print(f"{name}: {len(data)} rows, {data['name'].nunique()} models, {configs} configs, "
              f"{elapsed:.1f} s ({configs / elapsed:.1f} configs/s incl. cache hits)", flush=True)
        frames.append(data)
        paths.append(path)
    data = pd.concat(frames, ignore_index=True).sort_values("row_id").reset_index(drop=True)
    elapsed = time.perf_counter() - total_start
    configs = data[["model_id", "mode", "batch"]].drop_duplicates()
    print(f"all files: {len(data)} rows, {data['name'].nunique()} models, {len(configs)} distinct configs "
          f"in {elapsed:.1f} s: {len(configs) / elapsed:.2f} configs/s; "
          f"methods: {data['featurised_by'].value_counts().to_dict()}")
    missing = unfeaturisable_models(data)
    print(f"not featurised: {missing['name'].nunique()} models")
    for r in missing.drop_duplicates("name").itertuples(index=False):
        print(f"  {r.name}: {r.reason}")
    if args.out:
        write_table(args.out, data, provenance(paths, {"bench": "timm_import"}))


if __name__ == "__main__":
    main()
