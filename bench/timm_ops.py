"""Benchmark helper: perfzoo's operator-trace features of every timm workload in timm's AMP inference files.

For each (model, image size) of the ``*benchmark-infer-amp-*.csv`` files (read by
``bench/device_transfer.py``'s ``load``), the inference step is traced on the meta device at batches 2, 4 and 8
in float16 (attention by the fused kernel where the CPU would pick it, ``perfzoo.features.attention``)
(``perfzoo.features.ops.traced_op_features``: per operator kind, FLOPs, bytes read and written, calls). A traced
quantity is linear in the batch size for most of these models' inference steps (weights are read once per
step, activations scale), so two probes give it at any batch: ``q(B) = q(2) + (q(4) - q(2)) (B - 2) / 2``;
``bench/timm_family.py --op-features`` uses that, and the third probe checks it: a workload whose totals at
batch 8 are off that line (3 of the 1,631: ``csatv2*``) is left out there, named, rather than given extrapolated
totals. Batch 1 is no probe: PyTorch takes other paths there (a dimension of one makes some reshapes views
instead of copies), so 301 of the 1,631 workloads trace fewer copies or elementwise calls at batch 1 than on the
line through larger batches (and the CondConv models trace their convolutions differently). A file traced with
other probes is completed by running the script again (rows of other batches are kept and not read).
The bytes are traced without a cache (``cache_bytes=0``: every byte read counts as moved), as the bytes
read from cache are not linear in the batch (what fits at batch 2 does not at 256).

A model that cannot be built or traced keeps its row with the one-line reason in ``op_trace_error`` and
NaN features (never zeros). Results are appended to ``--out`` (parquet) every ``--save-every`` workloads,
so an interrupted run resumes where it stopped.

Usage: ``PYTHONPATH=src python bench/timm_ops.py [DIR] --out bench/timm_ops.parquet [--limit N] [--part K/N]``
(with ``--part``, one process per part, each with its own ``--out``; concatenate the parts' files)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from torch.utils.flop_counter import FlopCounterMode

from perfzoo.features.attention import ATTENTION_FLOP_FORMULAS
from perfzoo.features.op_kinds import OP_ERROR_COLUMN, OP_FEATURES
from perfzoo.features.ops import traced_op_features
from perfzoo.io import one_line, write_parquet
from perfzoo.models.builders import build_model

sys.path.insert(0, str(Path(__file__).parent))
from device_transfer import load  # noqa: E402  (the bench scripts share the CSV reader)

PROBE_BATCHES = (2, 4, 8)


def workloads(directory: Path) -> list[tuple[str, int]]:
    """Unique (timm model name, image size) pairs of the inference files, in a stable order."""
    ids = sorted(load(directory)["model_id"].unique())
    return [(name, int(size)) for name, size in (i.rsplit("@", 1) for i in ids)]


def trace(name: str, size: int, batch: int, registry: dict) -> dict:
    """Operator-trace aggregates of one inference step, or NaN features with the reason.

    The model is built anew for every probe, not once per workload: a forward can leave state that the next
    trace would see. convit caches its relative position indices at the first forward (recomputed only for a
    new sequence length), so on one model its probes at batches 4 and 8 trace 40 elementwise and 100 copy calls
    fewer than at batch 2 (checked: the whole trace made both ways differs in exactly its 6 rows). The
    attention-bias caches of levit, efficientformer(_v2), efficientvit_msra and tiny_vit are no reason: every
    trace calls ``eval()``, and their ``train()`` empties them."""
    def build():
        with torch.device("meta"):
            return build_model("timm", name, {}, 1000, (3, size, size)).half()

    try:
        x = torch.empty(batch, 3, size, size, device="meta", dtype=torch.half)
        features, _ = traced_op_features(build, x, "inference", registry, f"{name}@{size}", cache_bytes=0)
    except Exception as exc:  # the builder's (or an unexpected tracing) error, named with the model
        features = {**dict.fromkeys(OP_FEATURES, float("nan")), OP_ERROR_COLUMN: f"failed: {one_line(exc)}"}
    return {"model_id": f"{name}@{size}", "batch": batch, **features}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", default="../shared/data/timm-benchmark", type=Path)
    parser.add_argument("--out", type=Path, default=Path("bench/timm_ops.parquet"))
    parser.add_argument("--limit", type=int, default=None, help="only the first N workloads")
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--part", default="0/1", help="K/N: only every N-th workload from the K-th (a process each)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    part, parts = (int(v) for v in args.part.split("/"))
    todo = workloads(args.directory)[: args.limit][part::parts]
    done = pd.read_parquet(args.out) if args.out.exists() else pd.DataFrame(columns=["model_id", "batch"])
    seen = set(zip(done["model_id"], done["batch"].astype(int), strict=True))
    rows: list[dict] = []
    registry = FlopCounterMode(custom_mapping=ATTENTION_FLOP_FORMULAS).flop_registry  # fused attention counted
    start, cpu0 = time.perf_counter(), time.process_time()
    pending = [(n, s) for n, s in todo if any((f"{n}@{s}", b) not in seen for b in PROBE_BATCHES)]
    print(f"{len(todo)} workloads, {len(todo) - len(pending)} already traced at batches {PROBE_BATCHES}, "
          f"{len(pending)} to trace", flush=True)
    for i, (name, size) in enumerate(pending, 1):
        rows += [trace(name, size, b, registry) for b in PROBE_BATCHES if (f"{name}@{size}", b) not in seen]
        if i % args.save_every == 0 or i == len(pending):
            done = pd.concat([done, pd.DataFrame(rows)], ignore_index=True)
            rows = []
            write_parquet(args.out, done)
            print(f"{i}/{len(pending)} traced, {time.perf_counter() - start:.0f} s wall, "
                  f"{time.process_time() - cpu0:.0f} s CPU", flush=True)
    failed = done[done[OP_ERROR_COLUMN].fillna("") != ""].drop_duplicates("model_id")
    print(f"{done['model_id'].nunique()} workloads, {len(failed)} not traced:")
    for _, row in failed.iterrows():
        print(f"  {row['model_id']}: {row[OP_ERROR_COLUMN]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
