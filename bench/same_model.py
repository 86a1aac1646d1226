"""A regressor's prediction corrected by the same model's residuals on its profiled configs.

    python bench/same_model.py RESULTS [--members composed_blend composed memory_sim ...]

For every split of ``RESULTS/splits/`` and every fold, each base regressor is fitted as the fit rule does, its
log residuals on the training rows are taken per group (device and model; device, model and mode), shrunk
towards 0 by the empirical-Bayes (random-effects) weight ``tau^2 / (tau^2 + sigma^2 / n)``, and added to the log
prediction of the held-out rows of the same group (a held-out row whose group has no training row keeps the base
prediction: leave-one-family-out is unchanged by construction). Test MAPE % of the base (equal to the evaluate
stage's) and of the two corrections, side by side. Not adopted (bench/RESULTS.md, "The same model's residuals").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from perfzoo.dataset.build import finite_target_rows  # noqa: E402
from perfzoo.fitting import (  # noqa: E402
    OPERATOR_FEATURE_REGRESSORS,
    applies_device_calibration,
    build_regressor,
    featurised_rows,
    regressor_inputs,
)

def shrunk_means(resid: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    """Per group the empirical-Bayes shrunk mean of ``resid`` (method of moments for tau^2 and sigma^2)."""
    frame = pd.DataFrame({"r": resid, "g": groups})
    stats = frame.groupby("g")["r"].agg(["mean", "count", "var"])
    multi = stats[stats["count"] >= 2]
    sigma2 = float((multi["var"] * (multi["count"] - 1)).sum() / max((multi["count"] - 1).sum(), 1))
    tau2 = max(float(stats["mean"].var(ddof=1) - (sigma2 / stats["count"]).mean()), 0.0)
    weight = tau2 / (tau2 + sigma2 / stats["count"]) if tau2 > 0 else stats["count"] * 0.0
    return (weight * stats["mean"]).to_dict()


def group_keys(X: pd.DataFrame, by: tuple[str, ...]) -> np.ndarray:
    return X[["device", *by]].astype(str).agg("|".join, axis=1).to_numpy()


def run(results: Path, members: list[str], by_options: list[tuple[str, ...]]) -> pd.DataFrame:
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    rows = []
    for member in members:
        target = "peak_mem_mb" if member == "memory_sim" else "latency_ms"
        usable = finite_target_rows(data, target) & featurised_rows(data)
        d = data[usable].set_index("row_id", drop=False)
        ops = member in OPERATOR_FEATURE_REGRESSORS
        calib = applies_device_calibration(member)
        for split_path in sorted((results / "splits").glob("*.parquet")):  # the run's own splits
            split_name, split = split_path.stem, pd.read_parquet(split_path)
            out = {"base": [], **{"+".join(by): [] for by in by_options}}
            for _, fold in split.groupby("fold", sort=True):
                train = d.loc[fold.loc[fold["set"] == "train", "row_id"]]
                test = d.loc[fold.loc[fold["set"] == "test", "row_id"]]
                if test.empty:
                    continue
                xtr, xte = regressor_inputs(train, "all", ops, calib), regressor_inputs(test, "all", ops, calib)
                model = build_regressor(member).fit(xtr, train[target])
                ptr, pte = np.asarray(model.predict(xtr), float), np.asarray(model.predict(xte), float)
                y = test[target].to_numpy(float)
                out["base"].append(np.abs(pte - y) / y)
                ok = np.isfinite(ptr) & (ptr > 0)
                resid = np.log(train[target].to_numpy(float)[ok]) - np.log(ptr[ok])
                for by in by_options:
                    shift = shrunk_means(resid, group_keys(xtr[ok], by))
                    corr = np.array([shift.get(k, 0.0) for k in group_keys(xte, by)])
                    out["+".join(by)].append(np.abs(pte * np.exp(corr) - y) / y)
            rows.append({"member": member, "split": split_name,
                         **{k: 100 * float(np.nanmean(np.concatenate(v))) for k, v in out.items() if v}})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--members", nargs="+", default=["composed_blend", "composed", "memory_sim"])
    args = parser.parse_args()
    table = run(args.results, args.members, [("model_id",), ("model_id", "mode")])
    print(table.round(2).to_string(index=False))


if __name__ == "__main__":
    main()
