"""Offline: a finished default run with the measured rows of a second run added, its splits remade, refitted.

    PYTHONPATH=src python bench/extra_rows.py RUN EXTRA OUT [--variants V ...]

``RUN`` and ``EXTRA`` are finished workflow folders (``EXTRA`` needs only ``results/dataset/dataset.parquet``,
e.g. a run of a config whose zoo holds only the models to add, made up to its dataset rule). ``OUT`` becomes a run
folder whose dataset is ``RUN``'s plus ``EXTRA``'s rows of the zoo variants ``--variants`` (every row when none),
whose splits are remade from it with ``RUN``'s split settings, and whose other parts link to ``RUN``'s (so
``bench/composed_call_cap.py OUT`` predicts the user models from a fit on the merged rows). Before writing,
``RUN``'s own splits are remade from its dataset and must equal the stored ones.

Prints, for ``composed`` and ``composed_blend`` on every split, the test MAPE % on ``RUN`` and on ``OUT`` (all test
rows, then without the added ones) and the per-family MAPE of leave-one-family-out and batch extrapolation on ``OUT``.
Used for ``bench/RESULTS.md``, "Narrow deep MLPs in the zoo".
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pandas as pd
import yaml

from perfzoo.dataset.splits import make_split
from perfzoo.fitting import fit_split

SPLITS = ("leave_one_family_out", "batch_extrapolation", "random", "family_monte_carlo", "stratified_kfold")
REGRESSORS = ("composed", "composed_blend")
TARGET = "latency_ms"


def dataset(run: Path) -> pd.DataFrame:
    return pd.read_parquet(run / "results" / "dataset" / "dataset.parquet")


def split_settings(run: Path) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text())["splits"]


def check_splits_remade(run: Path) -> None:
    """``run``'s splits made again from its dataset equal the stored ones (else the comparison is not like for like)."""
    data, cfg = dataset(run), split_settings(run)
    for name in SPLITS:
        stored = pd.read_parquet(run / "results" / "splits" / f"{name}.parquet").reset_index(drop=True)
        if not make_split(name, data, cfg).reset_index(drop=True).equals(stored):
            raise SystemExit(f"{run}: split {name} made again differs from the stored one")


def link(source: Path, target: Path) -> None:
    if not target.exists():
        os.symlink(source, target)


def write_merged(run: Path, extra: Path, out: Path, variants: list[str]) -> pd.DataFrame:
    """``out`` as described in the module docstring; returns the merged dataset."""
    added = dataset(extra)
    if variants:
        added = added[added["variant"].isin(variants)]
    merged = pd.concat([dataset(run), added], ignore_index=True)
    for folder in ("dataset", "splits"):
        (out / "results" / folder).mkdir(parents=True, exist_ok=True)
    for item in os.listdir(run / "results"):
        if item not in ("dataset", "splits"):
            link(run / "results" / item, out / "results" / item)
    for item in os.listdir(run / "results" / "dataset"):
        if item != "dataset.parquet":
            link(run / "results" / "dataset" / item, out / "results" / "dataset" / item)
    for item in ("config.yaml", "examples"):
        link(run / item, out / item)
    merged.to_parquet(out / "results" / "dataset" / "dataset.parquet")
    cfg = split_settings(run)
    for name in SPLITS:
        make_split(name, merged, cfg).to_parquet(out / "results" / "splits" / f"{name}.parquet")
    print(f"{len(merged) - len(added)} rows of {run} + {len(added)} of {extra} -> {out}")
    return merged


def test_rows(run: Path, data: pd.DataFrame, split: str, regressor: str) -> pd.DataFrame:
    predictions, _, _ = fit_split(data, pd.read_parquet(run / "results" / "splits" / f"{split}.parquet"), TARGET,
                                  regressor)
    rows = predictions[predictions["set"] == "test"]
    return rows.assign(ape=(rows["y_pred"] / rows["y_true"] - 1).abs() * 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("extra", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--variants", nargs="*", default=[])
    args = parser.parse_args()
    check_splits_remade(args.run)
    merged = write_merged(args.run, args.extra, args.out, args.variants)
    original = dataset(args.run)
    added = set(dataset(args.extra)["row_id"]) & set(merged["row_id"]) - set(original["row_id"])
    table, families = [], []
    for regressor in REGRESSORS:
        for split in SPLITS:
            before = test_rows(args.run, original, split, regressor)
            after = test_rows(args.out, merged, split, regressor)
            table.append({"regressor": regressor, "split": split, "run": before["ape"].mean(),
                          "merged": after["ape"].mean(),
                          "merged, added rows left out": after.loc[~after["row_id"].isin(added), "ape"].mean(),
                          "added test rows": int(after["row_id"].isin(added).sum())})
            if split in SPLITS[:2]:
                families.append(after.groupby("family")["ape"].mean().rename(f"{regressor} {split}"))
    pd.set_option("display.width", 250)
    print(pd.DataFrame(table).round(2).to_markdown(index=False))
    print(pd.concat(families, axis=1).round(1).to_markdown())


if __name__ == "__main__":
    main()
