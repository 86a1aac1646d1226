"""Import timm's benchmark files (GPU inference at AMP, then GPU training) and time the featurisation.

Usage: python bench/timm_import.py [--data DIR] [--out FILE.parquet] [--workers N] [--limit N] [--cache F]
                                  [--only inference|training]

The models of all inference files are featurised together first — one job per (model, resolution, mode)
covering every batch size any file lists — then each file is imported with ``perfzoo.dataset.external`` (format
``timm``; device, precision and software stack from the file name), which finds every model in the
process's cache. The same is done for the training file. ``--out`` gets the inference rows as soon as
they are ready and all rows at the end. Prints the featurisation rate (distinct (model, resolution,
precision, mode, batch) configs per second of featurisation wall time) and every model that could not be
featurised, with why. ``--cache`` keeps probe features in a JSON lines file, so an interrupted run
resumes (the rate then counts only what was computed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from perfzoo.dataset.external import ImportOptions, feature_jobs, import_external, unfeaturisable_models  # noqa: E402
from perfzoo.features.pool import featurise_jobs, load_cache  # noqa: E402
from perfzoo.provenance import provenance, write_table  # noqa: E402
from perfzoo.dataset.timm import describe_file  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "timm-benchmark"
INFERENCE_FILES = (
    "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv",
    "benchmark-infer-amp-nchw-pt240-cu124-rtx4090.csv",
    "benchmark-infer-amp-nchw-pt291-cu128-4090.csv",
    "benchmark-infer-amp-nchw-pt291-cu130-5090.csv",
    "benchmark-infer-amp-nchw-pt291-cu130-pro6000maxq.csv",
)
TRAINING_FILES = ("benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv",)


def configs_of(path: Path) -> pd.DataFrame:
    """(model, precision, resolution, mode, batch) of every row of a timm file."""
    info = describe_file(path)
    raw = pd.read_csv(path)
    prefix = "infer" if info.mode == "inference" else "train"
    return pd.DataFrame({"model": "timm:" + raw["model"], "precision": info.precision,
                         "resolution": raw[f"{prefix}_img_size"], "mode": info.mode,
                         "batch": raw[f"{prefix}_batch_size"]})


def featurise_files(paths: list[Path], workers: int | None, cache: str | None) -> None:
    configs = pd.concat([configs_of(p) for p in paths], ignore_index=True).drop_duplicates()
    jobs, unknown = feature_jobs(configs)
    start = time.perf_counter()
    results = featurise_jobs(jobs, workers, progress=True, cache_path=cache)
    elapsed = time.perf_counter() - start
    methods = pd.Series([r.method or "failed" for r in results]).value_counts().to_dict()
    print(f"featurised {len(configs)} distinct configs ({len(jobs)} models x resolution x mode, "
          f"{len(unknown)} unknown names) of {len(paths)} files in {elapsed:.1f} s: "
          f"{len(configs) / elapsed:.2f} configs/s; methods {methods}", flush=True)


def import_files(paths: list[Path], workers: int | None) -> pd.DataFrame:
    frames = []
    for path in paths:
        data, prov = import_external(path, options=ImportOptions(fmt="timm", workers=workers))
        print(f"{path.name}: {len(data)} rows, {data['name'].nunique()} models, "
              f"{len(prov['featurised_as'])} featurised under the name timm gives them now", flush=True)
        frames.append(data)
    return pd.concat(frames, ignore_index=True).sort_values("row_id").reset_index(drop=True)


def limited(paths: list[Path], limit: int) -> list[Path]:
    if not limit:
        return paths
    out = []
    for path in paths:
        copy = Path("/tmp") / f"limit{limit}" / path.name
        copy.parent.mkdir(exist_ok=True)
        copy.write_text("\n".join(path.read_text().splitlines()[: limit + 1]) + "\n")
        out.append(copy)
    return out


def report_missing(data: pd.DataFrame) -> None:
    missing = unfeaturisable_models(data)
    print(f"not featurised: {missing['name'].nunique()} models ({len(data[data['feature_missing_reason'] != ''])} rows)")
    for r in missing.drop_duplicates("name").itertuples(index=False):
        print(f"  {r.name}: {r.reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--limit", type=int, default=0, help="first N models of each file only (0: all)")
    parser.add_argument("--cache", default=None, help="JSON lines feature cache (resumes an interrupted run)")
    parser.add_argument("--only", choices=("inference", "training"), default=None,
                        help="import only the inference files or only the training file (default: both)")
    args = parser.parse_args()
    if args.cache:
        print(f"feature cache: {load_cache(args.cache)} entries loaded", flush=True)
    frames, used = [], []
    groups = {"inference": INFERENCE_FILES, "training": TRAINING_FILES}
    for names in (groups[args.only],) if args.only else groups.values():
        paths = limited([args.data / n for n in names], args.limit)
        featurise_files(paths, args.workers, args.cache)
        frames.append(import_files(paths, args.workers))
        used += paths
        data = pd.concat(frames, ignore_index=True).sort_values("row_id").reset_index(drop=True)
        report_missing(data)
        if args.out:
            write_table(args.out, data, provenance(used, {"bench": "timm_import"}))
            print(f"wrote {len(data)} rows -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
