"""Anonymous memory a CPU step keeps per distinct oneDNN convolution, and ``memory_sim`` with that count.

    python bench/onednn_primitives.py measure                 # memory per distinct layer shape, by kind
    python bench/onednn_primitives.py offline RESULTS         # memory_sim variants on a finished run's splits

``measure``: in a fresh process per case (one intra-op thread), 40 layers of a kind, each of a distinct shape
(or 40 of one shape: ``conv3x3_same``), are run once and then once more; printed is the growth of the
process's anonymous resident memory (``RssAnon``) in each pass, after ``gc``, above what one small convolution
and one linear layer run beforehand left. The first pass creates a oneDNN primitive per distinct convolution
(PyTorch caches them); the second reuses them.

``offline``: the distinct oneDNN convolutions of every config of ``RESULTS/features/ops.parquet`` (forward
convolutions that PyTorch runs on oneDNN at one thread, :func:`conv_backend.runs_native`; distinct by input,
weight and output shape) as a count, and ``memory_sim``'s calibration refitted on every split of
``RESULTS/splits/`` by its own design and solver with: its terms as now; the binary ``onednn_conv`` term
replaced by the count; the count and its product with training added; the count's cost fixed at the measured
0.11 MiB (inference) and 0.25 MiB (training) per primitive and the other terms refitted (with and without
``onednn_conv``). MAPE % per split, and per held-out family on leave-one-family-out.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

CASES = ("conv3x3 2", "conv3x3 16", "conv3x3 2 training", "conv3x3 1", "conv1x1 2", "conv1x1 16", "depthwise 2",
         "depthwise 2 training", "conv3x3_same 2", "conv3x3_same 2 training", "linear 16", "linear 16 training",
         "batchnorm 2")
LAYERS = 40
PRIMITIVE_MIB = {"inference": 0.11, "training": 0.25}


def anonymous_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no RssAnon in /proc/self/status (Linux only)")


def layers(kind: str, batch: int, training: bool) -> list[tuple]:
    import torch

    def x(*shape: int) -> torch.Tensor:
        return torch.randn(batch, *shape, requires_grad=training)

    n = range(LAYERS)
    return {
        "conv3x3": lambda: [(torch.nn.Conv2d(16 + i, 17 + i, 3, padding=1), x(16 + i, 8, 8)) for i in n],
        "conv3x3_same": lambda: [(torch.nn.Conv2d(32, 32, 3, padding=1), x(32, 8, 8)) for _ in n],
        "conv1x1": lambda: [(torch.nn.Conv2d(16 + i, 17 + i, 1), x(16 + i, 8, 8)) for i in n],
        "depthwise": lambda: [(torch.nn.Conv2d(16 + i, 16 + i, 3, padding=1, groups=16 + i), x(16 + i, 8, 8))
                              for i in n],
        "linear": lambda: [(torch.nn.Linear(64 + i, 65 + i), x(64 + i)) for i in n],
        "batchnorm": lambda: [(torch.nn.BatchNorm2d(16 + i), x(16 + i, 8, 8)) for i in n],
    }[kind]()


def measure_case(kind: str, batch: int, training: bool) -> str:
    import torch

    torch.set_num_threads(1)
    warm = torch.nn.Conv2d(3, 4, 3)(torch.randn(2, 3, 8, 8)).sum() + torch.nn.Linear(3, 4)(torch.randn(2, 3)).sum()
    if training:
        warm.backward()
    pairs = layers(kind, batch, training)
    growth = []
    for _ in range(2):
        gc.collect()
        before = anonymous_mib()
        for layer, x in pairs:
            y = layer(x)
            if training:
                y.sum().backward()
            del y
        gc.collect()
        growth.append(anonymous_mib() - before)
    mode = "training" if training else "inference"
    return (f"| {kind} | {batch} | {mode} | {growth[0]:.2f} | {1024 * growth[0] / LAYERS:.0f} | "
            f"{growth[1]:.2f} |")


def measure() -> None:
    print("| layers (40) | batch | mode | first pass MiB | KiB per layer | second pass MiB |")
    print("|---|---|---|---|---|---|")
    for case in CASES:
        out = subprocess.run([sys.executable, __file__, "_case", *case.split()], capture_output=True, text=True,
                             check=True)
        print(out.stdout.strip(), flush=True)


def primitive_counts(results: Path):
    import pandas as pd
    from conv_backend import runs_native, shapes

    ops = pd.read_parquet(results / "features" / "ops.parquet")
    conv = ops[ops["kind"].isin(["conv", "conv_grouped"]) & (ops["phase"] == "forward")]
    distinct: dict[tuple, set] = {}
    for row in conv.itertuples():
        ins, outs = shapes(row.in_shapes), shapes(row.out_shapes)
        key = (row.model_id, row.mode, row.batch)
        distinct.setdefault(key, set())
        if not runs_native(ins[0], ins[1], outs[0]):
            distinct[key].add((ins[0], ins[1], outs[0]))
    return pd.Series({k: len(v) for k, v in distinct.items()}, name="onednn_primitives").rename_axis(
        ["model_id", "mode", "batch"]).reset_index()


def offline(results: Path) -> None:
    import numpy as np
    import pandas as pd

    from perfzoo.regressors import MemorySimRegressor
    from perfzoo.regressors.memory import term_contributions
    from perfzoo.stats import mape

    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    data = data.merge(primitive_counts(results), on=["model_id", "mode", "batch"], how="left")
    data["onednn_primitives"] = data["onednn_primitives"].fillna(0)
    data = data.set_index("row_id")
    print(data.groupby("family")["onednn_primitives"].agg(["min", "max"]).T.to_string())
    base = MemorySimRegressor()

    def fixed(X: pd.DataFrame) -> np.ndarray:
        per = np.where(X["mode"] == "training", PRIMITIVE_MIB["training"], PRIMITIVE_MIB["inference"])
        return X["onednn_primitives"].to_numpy(float) * per

    def design(X: pd.DataFrame, variant: str) -> np.ndarray:
        D = base._design(X)  # training, peak, activation, training x activation, sqrt(op kinds), onednn_conv
        count, training = X["onednn_primitives"].to_numpy(float), D[:, 0]
        return {"as now": D, "count for onednn_conv": np.column_stack([D[:, :5], count]),
                "count and count x training added": np.column_stack([D, count, count * training]),
                "count fixed at the measured cost": D,
                "count fixed, no onednn_conv": D[:, :5]}[variant]

    variants = ("as now", "count for onednn_conv", "count and count x training added",
                "count fixed at the measured cost", "count fixed, no onednn_conv")
    table, families = {}, {}
    for split in ("leave_one_family_out", "batch_extrapolation", "random", "family_monte_carlo",
                  "stratified_kfold"):
        folds = pd.read_parquet(results / "splits" / f"{split}.parquet")
        held: dict[str, list[pd.DataFrame]] = {v: [] for v in variants}
        for _, g in folds.groupby("fold"):
            train = data.loc[[r for r in g.loc[g["set"] == "train", "row_id"] if r in data.index]]
            test = data.loc[[r for r in g.loc[g["set"] == "test", "row_id"] if r in data.index]]
            if test.empty:
                continue
            y = train["peak_mem_mb"].to_numpy()
            for v in variants:
                offset = fixed if "fixed" in v else (lambda X: np.zeros(len(X)))
                coef = MemorySimRegressor.median_fit(design(train, v), y - offset(train))
                held[v].append(pd.DataFrame({"y": test["peak_mem_mb"].to_numpy(), "family": test["family"].to_numpy(),
                                             "p": term_contributions(design(test, v), coef).sum(axis=1)
                                             + offset(test)}))
        table[split] = {v: mape(pd.concat(h)["y"], pd.concat(h)["p"]) for v, h in held.items()}
        if split == "leave_one_family_out":
            families = {v: pd.concat(h).groupby("family").apply(lambda q: mape(q["y"], q["p"])) for v, h in held.items()}
    coef_all = MemorySimRegressor.median_fit(design(data, "count for onednn_conv"), data["peak_mem_mb"].to_numpy())
    print(pd.DataFrame(table).round(2).to_markdown())
    print(pd.DataFrame(families).T.round(1).to_markdown())
    print("'count for onednn_conv' fitted on every row: MiB per oneDNN primitive", round(float(coef_all[-1]), 3))


if __name__ == "__main__":
    if sys.argv[1:2] == ["_case"]:
        kind, batch, *rest = sys.argv[2:]
        print(measure_case(kind, int(batch), rest == ["training"]))
    elif sys.argv[1:2] == ["measure"]:
        measure()
    elif sys.argv[1:2] == ["offline"] and len(sys.argv) == 3:
        offline(Path(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
