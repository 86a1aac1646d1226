"""Split stage: named, seeded train/validation/test assignments, stored as tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

SPLIT_COLUMNS = ["split", "fold", "row_id", "set"]


def random_split(data: pd.DataFrame, seed: int, fractions: list[float]) -> pd.DataFrame:
    """One fold: rows shuffled with ``seed`` and cut into train/val/test by ``fractions`` (seed 001)."""
    rng = np.random.default_rng(seed)
    ids = data["row_id"].to_numpy()[rng.permutation(len(data))]
    n_train = int(round(fractions[0] * len(ids)))
    n_val = int(round(fractions[1] * len(ids)))
    sets = ["train"] * n_train + ["val"] * n_val + ["test"] * (len(ids) - n_train - n_val)
    return pd.DataFrame({"fold": "0", "row_id": ids, "set": sets})


def leave_one_family_out(data: pd.DataFrame, seed: int, fractions: list[float]) -> pd.DataFrame:
    """One fold per family: that family is the test set, every other family trains."""
    folds = []
    for family in sorted(data["family"].unique()):
        held_out = data["family"] == family
        folds.append(pd.DataFrame({"fold": family, "row_id": data["row_id"],
                                   "set": np.where(held_out, "test", "train")}))
    return pd.concat(folds, ignore_index=True) if folds else pd.DataFrame(columns=SPLIT_COLUMNS[1:])


SCHEMES: dict[str, Callable[[pd.DataFrame, int, list[float]], pd.DataFrame]] = {
    "random": random_split,
    "leave_one_family_out": leave_one_family_out,
}


def make_split(name: str, data: pd.DataFrame, cfg: dict[str, Any]) -> pd.DataFrame:
    """The split table of scheme ``name``: one row per (fold, dataset row)."""
    ordered = data.sort_values("row_id").reset_index(drop=True)
    table = SCHEMES[name](ordered, cfg["seed"], cfg["random_fractions"])
    table.insert(0, "split", name)
    return table[SPLIT_COLUMNS].sort_values(["fold", "row_id"]).reset_index(drop=True)
