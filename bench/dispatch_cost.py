"""What an operator call costs on the CPU, by who calls it, and whether ``composed`` can use a cost per Python call.

    PYTHONPATH=src python bench/dispatch_cost.py micro               # microbenchmarks, one intra-op thread
    PYTHONPATH=src python bench/dispatch_cost.py refit RUN_DIR       # RUN_DIR: a finished `make run`

``composed`` fits 9-12 µs per elementwise call on the default zoo (``bench/RESULTS.md``, run W), while the
README's Conv1d + GRU runs 1,282 elementwise and 257 matrix calls in a 4.2 ms inference step. Its calls are made
by ``aten::gru``'s C++ loop, the zoo's from Python, so one hypothesis is a per-call price of Python.

``micro`` times, in a loop of one thread: a 256-float ``torch.add`` called from Python, the same as ``a + b``,
``torch.sigmoid``, an ``nn.ReLU`` module call, ``torch._foreach_add_`` over 1,000 such tensors (the CPU's
fallback calls ``add_`` once per tensor from C++: a C++-dispatched call), ``torch.relu`` on a 256 KB tensor
(a zoo-sized operand at batch 1), and the GRU of ``examples/sequence_model.py`` (2 layers, hidden 256, 64 steps,
batch 1).

``refit`` refits ``composed`` on the run's dataset and splits, as the fit rule does, with a per-step term
``n_python_calls`` added to its default ``n_module_calls``; the count is a stand-in from the run's operator trace:
the forward and optimizer operators of each config (in the zoo every one of them is called from Python; the
backward's come from the autograd engine in C++). It prints the test MAPE per split and, per fold of
leave-one-family-out, the fitted per-call costs in µs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SPLITS = ("leave_one_family_out", "batch_extrapolation", "random", "family_monte_carlo", "stratified_kfold")
PYTHON_CALLS = "n_python_calls"
SHOWN = ("n_module_calls", PYTHON_CALLS, "op_elementwise_count", "op_matmul_count", "op_norm_count",
         "op_conv_count", "op_optimizer_count")


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    """Median over 5 rounds of the time of one ``fn()`` in µs, ``calls`` calls per round after one warm-up."""
    fn()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(rounds)[2]


def micro() -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    from examples.sequence_model import build

    torch.set_num_threads(1)
    torch.manual_seed(0)
    a, b, big = torch.randn(256), torch.randn(256), torch.randn(64 * 32 * 32)
    relu = torch.nn.ReLU()
    tiny = [torch.randn(256) for _ in range(1000)]
    model = build().eval()
    x = torch.randn(1, 12, 256)
    with torch.no_grad():
        rows = {
            "torch.add, 256 floats, from Python": per_call_us(lambda: torch.add(a, b), 20000),
            "a + b, 256 floats (operator)": per_call_us(lambda: a + b, 20000),
            "torch.sigmoid, 256 floats": per_call_us(lambda: torch.sigmoid(a), 20000),
            "nn.ReLU module call, 256 floats": per_call_us(lambda: relu(a), 20000),
            "add_ from C++ (_foreach_add_ over 1,000 tensors of 256 floats), per tensor":
                per_call_us(lambda: torch._foreach_add_(tiny, 1.0), 200) / len(tiny),
            "torch.relu, 65,536 floats (256 KB)": per_call_us(lambda: torch.relu(big), 5000),
            "Conv1d + GRU inference step, batch 1 (1,282 elementwise + 257 matmul calls)":
                per_call_us(lambda: model(x), 200),
        }
    width = max(map(len, rows))
    for name, us in rows.items():
        print(f"{name:<{width}}  {us:10.2f} µs")


def refit(run: Path) -> None:
    import pandas as pd

    import perfzoo.fitting as fitting
    from perfzoo.evaluate import metrics_table, with_intervals

    results = run / "results"
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    ops = pd.read_parquet(results / "features" / "ops.parquet")
    from_python = ops[ops["phase"].isin(["forward", "optimizer"])]
    counts = from_python.groupby(["model_id", "mode", "batch"]).size().rename(PYTHON_CALLS).reset_index()
    data = data.merge(counts, on=["model_id", "mode", "batch"], how="left", validate="many_to_one")
    columns = fitting.feature_columns
    fitting.feature_columns = lambda frame: [*columns(frame), *([PYTHON_CALLS] if PYTHON_CALLS in frame else [])]
    noise = pd.read_parquet(results / "dataset" / "noise_floor.parquet")
    variants = {"default (n_module_calls)": {},
                "+ n_python_calls": {"step_terms": ["n_module_calls", PYTHON_CALLS]}}
    pd.set_option("display.width", 250)
    for name, params in variants.items():
        predictions, coefficients = [], {}
        for split in SPLITS:
            table = pd.read_parquet(results / "splits" / f"{split}.parquet")
            held, models, _ = fitting.fit_split(data, table, "latency_ms", "composed", params)
            predictions.append(held)
            if split == "leave_one_family_out":
                coefficients = {fold: (m.coefficients("cpu") * 1e3).reindex(list(SHOWN)).round(2)
                                for fold, m in models.items()}
        metrics = metrics_table(with_intervals(pd.concat(predictions, ignore_index=True)), noise)
        print(f"\n{name}: test MAPE % per split")
        print(metrics.set_index("split")["mape"].round(2).to_string())
        print("per-call costs (µs) of the leave-one-family-out folds (held-out family):")
        print(pd.DataFrame(coefficients).T.to_string())


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "micro":
        micro()
    elif len(sys.argv) == 3 and sys.argv[1] == "refit":
        refit(Path(sys.argv[2]).resolve())
    else:
        sys.exit(__doc__)
