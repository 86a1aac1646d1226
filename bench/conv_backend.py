"""``composed`` with convolutions split by the kernel PyTorch runs them on, on the CPU (offline, finished runs).

    python bench/conv_backend.py RESULTS [RESULTS ...]

At one intra-op thread PyTorch runs many convolutions on its own im2col kernel (``aten::_slow_conv2d_forward``)
instead of oneDNN: every 1 x 1 convolution of fewer than 16 samples and every 3 x 3 one at batch 1 (its choice,
``torch._C._select_conv_backend``). The two kernels cost differently per FLOP, so this asks whether ``composed``
improves when the operator trace's ``conv`` and ``conv_backward`` kinds are split into the oneDNN part and a
``conv_native`` / ``conv_native_backward`` part.

For each finished run's ``results`` folder: the kernel of every convolution of ``features/ops.parquet`` is
PyTorch's own choice (:func:`perfzoo.features.memory._runs_on_onednn`, one thread) on the recorded input and
weight shapes, with stride and padding inferred from the input and output shapes; the per-kind sums of the
split kinds replace the dataset's ``op_conv_*`` and ``op_conv_backward_*`` columns (the unsplit sums are
checked to reproduce them first); then ``composed`` is refitted on every split of ``RESULTS/splits/`` as the fit
rule does, once on the run's dataset and once on the split one, with the kind list of
:mod:`perfzoo.features.op_kinds` extended by the two kinds for the second (the list is patched here, before any
perfzoo module reads it). Test MAPE %, and in brackets the MAPE of the batch-1 test rows.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import perfzoo.features.op_kinds as kinds  # noqa: E402

NATIVE_KINDS = {"conv": "conv_native", "conv_backward": "conv_native_backward"}
PLAIN_KINDS = kinds.OP_KINDS


def patch_kinds() -> None:
    """Add the native-kernel convolution kinds to the kind lists (before other perfzoo modules import them)."""
    at = PLAIN_KINDS.index("conv_grouped_backward") + 1
    kinds.OP_KINDS = (*PLAIN_KINDS[:at], *NATIVE_KINDS.values(), *PLAIN_KINDS[at:])
    kinds.COSTED_KINDS = tuple(k for k in kinds.OP_KINDS if k != kinds.FREE_KIND)
    kinds.FLOP_KINDS = (*kinds.FLOP_KINDS, *NATIVE_KINDS.values())
    kinds.OP_FEATURE_KINDS = {f"op_{k}_{s}": (k, s) for k in kinds.COSTED_KINDS for s in kinds.OP_STATS
                              if s != "flops" or k in kinds.FLOP_KINDS}
    kinds.OP_FEATURES = tuple(kinds.OP_FEATURE_KINDS)


patch_kinds()

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from perfzoo.evaluate import metrics_table, with_intervals  # noqa: E402
from perfzoo.features.memory import _runs_on_onednn  # noqa: E402
from perfzoo.fitting import fit_split  # noqa: E402
from perfzoo.stats import mape  # noqa: E402

SPLITS = ("leave_one_family_out", "batch_extrapolation", "random", "family_monte_carlo", "stratified_kfold")
SELECTION_SPLITS = ("family_monte_carlo", "stratified_kfold")
KEYS = ["model_id", "mode", "batch"]


@functools.cache
def runs_native(inp: tuple[int, ...], weight: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether PyTorch runs this convolution on its own kernel, not oneDNN, at one thread."""
    dims = len(inp) - 2
    stride, padding = [], []
    for d in range(dims):
        k = weight[2 + d]
        s = max(1, round(inp[2 + d] / out[2 + d])) if out[2 + d] > 1 else max(1, inp[2 + d] - k + 1)
        stride.append(s)
        padding.append(max(0, math.ceil(((out[2 + d] - 1) * s - inp[2 + d] + k) / 2)))
    groups = inp[1] // weight[1]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return not _runs_on_onednn((inp, torch.float32), (weight, torch.float32), None, tuple(stride),
                                   tuple(padding), (1,) * dims, False, (0,) * dims, groups)
    finally:
        torch.set_num_threads(threads)


def shapes(value) -> list[tuple[int, ...]]:
    return [tuple(int(n) for n in s) for s in (json.loads(value) if isinstance(value, str) else value)]


def conv_sums(ops: pd.DataFrame, split: bool) -> pd.DataFrame:
    """``op_<kind>_{flops,bytes,count}`` of the convolution kinds per (model, mode, batch)."""
    conv = ops[ops["kind"].isin(list(NATIVE_KINDS))].copy()
    conv["moved"] = conv["bytes_read"] + conv["bytes_written"] - conv["bytes_cached"]
    if split:
        native = []
        for row in conv.itertuples():
            ins, outs = shapes(row.in_shapes), shapes(row.out_shapes)
            inp, weight, out = (ins[0], ins[1], outs[0]) if row.kind == "conv" else (ins[1], ins[2], ins[0])
            native.append(runs_native(inp, weight, out))
        conv["kind"] = np.where(native, conv["kind"].map(NATIVE_KINDS), conv["kind"])
    sums = conv.groupby([*KEYS, "kind"]).agg(flops=("flops", "sum"), bytes=("moved", "sum"),
                                             count=("op", "size")).reset_index()
    wide = sums.pivot_table(index=KEYS, columns="kind", values=["flops", "bytes", "count"], fill_value=0)
    wide.columns = [f"op_{kind}_{stat}" for stat, kind in wide.columns]
    return wide.reset_index()


def with_split_convolutions(results: Path) -> pd.DataFrame:
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    ops = pd.read_parquet(results / "features" / "ops.parquet")
    plain = data[KEYS].merge(conv_sums(ops, split=False), on=KEYS, how="left")
    for column in [c for c in plain.columns if c.startswith("op_")]:
        if not np.allclose(plain[column].fillna(0), data[column].fillna(0)):
            raise SystemExit(f"{results}: the trace's sums do not reproduce the dataset's {column}")
    split = conv_sums(ops, split=True)
    columns = [c for c in split.columns if c.startswith("op_")]
    out = data.drop(columns=[c for c in columns if c in data.columns]).merge(split, on=KEYS, how="left")
    traced = out["op_matmul_count"].notna()
    out.loc[traced, columns] = out.loc[traced, columns].fillna(0)
    return out


def scores(results: Path, data: pd.DataFrame) -> dict[str, str]:
    predictions = pd.concat([fit_split(data, pd.read_parquet(results / "splits" / f"{s}.parquet"), "latency_ms",
                                       "composed", {})[0] for s in SPLITS], ignore_index=True)
    table = metrics_table(with_intervals(predictions),
                          pd.read_parquet(results / "dataset" / "noise_floor.parquet")).set_index("split")
    test = predictions[(predictions["set"] == "test") & (predictions["batch"] == 1)]
    batch1 = {s: mape(g["y_true"], g["y_pred"]) for s, g in test.groupby("split")}
    cells = {s: f"{table.loc[s, 'mape']:.2f}" + (f" ({batch1[s]:.1f})" if s in batch1 else "") for s in SPLITS}
    cells["select"] = f"{table.loc[list(SELECTION_SPLITS), 'mape'].mean():.2f}"
    return cells


def main() -> None:
    rows = {}
    for results in map(Path, sys.argv[1:]):
        data = pd.read_parquet(results / "dataset" / "dataset.parquet")
        for kind in NATIVE_KINDS.values():
            for stat in kinds.OP_STATS:
                data[f"op_{kind}_{stat}"] = 0.0 * data["op_matmul_count"]  # the unsplit run: no such operators
        rows[(str(results), "conv unsplit (the run's features)")] = scores(results, data)
        split = with_split_convolutions(results)
        rows[(str(results), "conv split by kernel")] = scores(results, split)
        native = split["op_conv_native_count"] / (split["op_conv_native_count"] + split["op_conv_count"])
        print(f"{results}: share of convolution calls on PyTorch's own kernel, median over configs with "
              f"convolutions: {native.dropna().median():.2f}", flush=True)
    pd.set_option("display.width", 250)
    print(pd.DataFrame(rows).T.to_markdown())


if __name__ == "__main__":
    main()
