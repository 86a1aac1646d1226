"""Which calibration terms ``memory_sim`` should have: term sets side by side, and a nested choice.

    python bench/memory_terms.py RESULTS_DIR [--refeaturise]

RESULTS_DIR is a finished default run's ``results/`` (read only: its ``dataset/dataset.parquet`` with the
``sim_*`` features and its ``splits/*.parquet``). ``--refeaturise`` featurises the run's zoo manifest again with
the current code and takes the columns the run's dataset lacks from it (``sim_heap_churn_bytes`` for runs made before
it existed; the other features of the run's dataset are kept, so its other term sets are scored as the run had them). Every term set below is ``memory_sim``'s median
regression (weights 1/y, per device) on other columns; each is fitted on every fold's training rows and
scored on its test rows (MAPE %, pooled over folds). ``nested`` chooses, inside each outer fold, the term
set with the lowest inner leave-one-family-out MAPE on that fold's training families alone, so no
held-out row takes part in the choice. Printed as Markdown.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from perfzoo.features.ops import CACHE_BYTES
from perfzoo.regressors import MemorySimRegressor
from perfzoo.regressors.memory import term_contributions

TARGET, MIB = "peak_mem_mb", 2.0**20
SPLITS = ("leave_one_family_out", "batch_extrapolation", "random", "family_monte_carlo", "stratified_kfold")
Term = Callable[[pd.DataFrame], np.ndarray]
TERMS: dict[str, Term] = {
    "training": lambda X: (X["mode"] == "training").to_numpy(float),
    "peak": lambda X: X["sim_peak_bytes"].to_numpy(float) / MIB,
    "activation": lambda X: X["sim_activation_bytes"].to_numpy(float) / MIB,
    "sqrt_kinds": lambda X: np.sqrt(X["sim_op_kinds"].to_numpy(float)),
    "training_activation": lambda X: ((X["mode"] == "training").to_numpy(float)
                                      * X["sim_activation_bytes"].to_numpy(float) / MIB),
    "onednn_conv": lambda X: X["sim_onednn_conv"].to_numpy(float),
    "heap_churn": lambda X: X["sim_heap_churn_bytes"].to_numpy(float) / MIB,
}
ACTIVATION = ("training", "peak", "activation", "training_activation", "sqrt_kinds", "onednn_conv")
CHURN = ("training", "peak", "heap_churn", "sqrt_kinds", "onednn_conv")
TERM_SETS: dict[str, tuple[str, ...] | None] = {
    "activation terms (training, peak, activation, training x activation, sqrt kinds, oneDNN conv)": ACTIVATION,
    "heap churn for the activation terms (training, peak, churn, sqrt kinds, oneDNN conv)": CHURN,
    "heap churn, without sqrt kinds": tuple(t for t in CHURN if t != "sqrt_kinds"),
    "heap churn beside the activation terms": (*ACTIVATION, "heap_churn"),
    "memory_sim as the fit rule runs it": None,  # the regressor itself, not a copy
}


def fit_predict(terms: tuple[str, ...] | None, train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """Predictions for ``test`` of the median regression on ``terms`` fitted on ``train`` (one device);
    ``None``: ``memory_sim`` as the fit rule runs it."""
    if terms is None:
        return MemorySimRegressor().fit(train, train[TARGET]).predict(test)
    design = lambda X: np.column_stack([TERMS[t](X) for t in terms])  # noqa: E731
    coef = MemorySimRegressor.median_fit(design(train), train[TARGET].to_numpy(float))
    return term_contributions(design(test), coef).sum(axis=1)  # a term no training row exercised: NaN where used


def ape(pred: np.ndarray, rows: pd.DataFrame) -> np.ndarray:
    return np.abs(pred - rows[TARGET].to_numpy(float)) / rows[TARGET].to_numpy(float) * 100


def inner_choice(train: pd.DataFrame) -> str:
    """The term set with the lowest leave-one-family-out MAPE within ``train``."""
    scores = {}
    for name, terms in TERM_SETS.items():
        errors = [ape(fit_predict(terms, train[train["family"] != f], train[train["family"] == f]),
                      train[train["family"] == f]) for f in train["family"].unique()]
        scores[name] = float(np.concatenate(errors).mean())
    return min(scores, key=scores.__getitem__)


def score(data: pd.DataFrame, split: pd.DataFrame) -> tuple[dict[str, float], pd.Series]:
    """(MAPE per term set and 'nested', how often each set was chosen by the nested choice)."""
    errors: dict[str, list[np.ndarray]] = {name: [] for name in [*TERM_SETS, "nested"]}
    chosen = []
    for _, fold in split.groupby("fold"):
        train = data.loc[fold.loc[fold["set"] == "train", "row_id"]]
        test = data.loc[fold.loc[fold["set"] == "test", "row_id"]]
        for name, terms in TERM_SETS.items():
            errors[name].append(ape(fit_predict(terms, train, test), test))
        chosen.append(inner_choice(train))
        errors["nested"].append(ape(fit_predict(TERM_SETS[chosen[-1]], train, test), test))
    return {k: float(np.concatenate(v).mean()) for k, v in errors.items()}, pd.Series(chosen).value_counts()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--refeaturise", action="store_true", help="sim_* columns the run lacks from the current code")
    args = parser.parse_args()
    data = pd.read_parquet(args.results / "dataset" / "dataset.parquet")
    if args.refeaturise:  # the run's manifest featurised again, with the run's config (bench/cache_bytes.py)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from cache_bytes import traced, with_current_columns

        data = with_current_columns(data, traced(args.results, CACHE_BYTES)[1])
    data = data.set_index("row_id")
    data = data[data[TARGET].notna() & data["sim_peak_bytes"].notna()]
    if data["device"].nunique() != 1:
        raise SystemExit(f"{args.results}: this comparison fits one device; found {sorted(data['device'].unique())}")
    table, choices = {}, {}
    for name in SPLITS:
        split = pd.read_parquet(args.results / "splits" / f"{name}.parquet")
        split = split[split["row_id"].isin(data.index)]
        table[name], choices[name] = score(data, split)
    frame = pd.DataFrame(table)
    print("| terms | " + " | ".join(SPLITS) + " |\n|---|" + "---|" * len(SPLITS))
    for name, row in frame.iterrows():
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in row) + " |")
    for name, counts in choices.items():
        print(f"- nested choice, {name}: " + ", ".join(f"{k}: {v} folds" for k, v in counts.items()))


if __name__ == "__main__":
    main()
