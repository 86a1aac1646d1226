"""Every split scheme: seeded, order-independent, disjoint, sized; impossible schemes give empty + note."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfzoo.io import InputError
from perfzoo.dataset.splits import (
    DEFAULTS,
    RARE_STRATUM,
    SCHEMES,
    SETS,
    SPLIT_COLUMNS,
    default_batch_threshold,
    make_split,
    split_notes,
)

CFG = {"seed": 1337, "random_fractions": [0.7, 0.15, 0.15]}
FAMILY_SIZES = {"resnet": 40, "vit": 20, "mlp": 10, "tiny": 3, "single": 1}
BATCHES = (1, 2, 4, 8, 16)


def dataset(devices: tuple[str, ...] = ("a100", "v100", "cpu")) -> pd.DataFrame:
    """Rows of several families of uneven size, on several devices and batch sizes."""
    rows = []
    i = 0
    for family, n in FAMILY_SIZES.items():
        for j in range(n):
            rows.append({"row_id": f"r{i:04d}", "model_id": f"{family}{j}", "family": family,
                         "device": devices[i % len(devices)], "mode": "inference",
                         "batch": BATCHES[i % len(BATCHES)], "latency_ms": 1.0 + i})
            i += 1
    return pd.DataFrame(rows)


def sets_by_fold(split: pd.DataFrame) -> dict[str, dict[str, set[str]]]:
    return {str(f): {s: set(g.loc[g["set"] == s, "row_id"]) for s in SETS} for f, g in split.groupby("fold")}


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_scheme_is_seeded_order_independent_and_disjoint(name: str) -> None:
    data = dataset()
    split = make_split(name, data, CFG)
    assert list(split.columns) == SPLIT_COLUMNS and len(split) > 0
    assert (split["split"] == name).all() and split["fold"].map(type).eq(str).all()
    assert set(split["set"]) <= set(SETS)
    shuffled = make_split(name, data.sample(frac=1, random_state=7), CFG)
    pd.testing.assert_frame_equal(split, shuffled)
    pd.testing.assert_frame_equal(split, make_split(name, data, CFG))
    for fold, rows in split.groupby("fold"):
        assert not rows["row_id"].duplicated().any(), f"{name}/{fold}: a row is in two sets"
        assert set(rows["row_id"]) == set(data["row_id"]), f"{name}/{fold}: rows missing"
        assert (rows["set"] == "train").any() and (rows["set"] != "train").any()
    assert split_notes(name, data, CFG) == split_notes(name, data.iloc[::-1], CFG)


def test_random_keeps_its_70_15_15_behaviour() -> None:
    data = dataset()
    counts = make_split("random", data, CFG)["set"].value_counts().to_dict()
    n = len(data)
    n_train, n_val = round(0.7 * n), round(0.15 * n)
    assert counts == {"train": n_train, "val": n_val, "test": n - n_train - n_val}


def test_family_monte_carlo_is_70_30_within_each_family_per_seed() -> None:
    data = dataset()
    split = make_split("family_monte_carlo", data, CFG)
    assert sorted(split["fold"].unique()) == [str(s) for s in range(1337, 1342)]
    assert DEFAULTS["mc_seeds"] == [1337, 1338, 1339, 1340, 1341]
    family = data.set_index("row_id")["family"]
    for fold, rows in split.groupby("fold"):
        counts = (rows.assign(family=rows["row_id"].map(family))
                  .groupby(["family", "set"]).size().unstack(fill_value=0))
        for fam, n in FAMILY_SIZES.items():
            expected_train = n if n == 1 else min(max(round(0.7 * n), 1), n - 1)
            assert counts.loc[fam, "train"] == expected_train, (fold, fam)
            assert counts.loc[fam].get("test", 0) == n - expected_train
    by_fold = sets_by_fold(split)
    assert by_fold["1337"]["test"] != by_fold["1338"]["test"]  # the seeds give different folds
    custom = make_split("family_monte_carlo", data, {**CFG, "mc_seeds": [1, 2], "mc_train_fraction": 0.5})
    assert sorted(custom["fold"].unique()) == ["1", "2"]
    assert (custom[custom["fold"] == "1"]["set"] == "train").sum() == sum(
        n if n == 1 else min(max(round(0.5 * n), 1), n - 1) for n in FAMILY_SIZES.values())
    assert any("single" in note for note in split_notes("family_monte_carlo", data, CFG))


def test_family_monte_carlo_is_stable_when_another_family_is_added() -> None:
    data = dataset()
    fewer = data[data["family"] != "vit"]
    resnet = set(data.loc[data["family"] == "resnet", "row_id"])
    a, b = make_split("family_monte_carlo", data, CFG), make_split("family_monte_carlo", fewer, CFG)
    pd.testing.assert_frame_equal(a[a["row_id"].isin(resnet)].reset_index(drop=True),
                                  b[b["row_id"].isin(resnet)].reset_index(drop=True))


def test_stratified_kfold_tests_every_row_once_and_balances_families() -> None:
    data = dataset()
    split = make_split("stratified_kfold", data, CFG)
    assert sorted(split["fold"].unique()) == ["0", "1", "2", "3", "4"]
    test = split[split["set"] == "test"]
    assert sorted(test["row_id"]) == sorted(data["row_id"])  # each row tests in exactly one fold
    family = data.set_index("row_id")["family"]
    per_fold = (test.assign(family=test["row_id"].map(family))
                .groupby(["family", "fold"]).size().unstack(fill_value=0))
    for fam in ("resnet", "vit", "mlp"):  # families with >= k rows are spread evenly
        assert per_fold.loc[fam].max() - per_fold.loc[fam].min() <= 1
        assert per_fold.loc[fam].sum() == FAMILY_SIZES[fam]
    assert make_split("stratified_kfold", data, {**CFG, "seed": 1}).pipe(
        lambda s: not s["set"].equals(split["set"]))
    notes = split_notes("stratified_kfold", data, CFG)
    assert len(notes) == 1 and "single" in notes[0] and "tiny" in notes[0]
    three = make_split("stratified_kfold", data, {**CFG, "kfold": 3})
    assert three["fold"].nunique() == 3
    assert RARE_STRATUM not in set(three["fold"])


def test_stratified_kfold_when_every_family_is_smaller_than_k() -> None:
    data = dataset()
    data = data.groupby("family").head(3).reset_index(drop=True)  # 3+3+3+3+1 rows, k = 5
    split = make_split("stratified_kfold", data, CFG)
    assert split["fold"].nunique() == 5
    assert sorted(split.loc[split["set"] == "test", "row_id"]) == sorted(data["row_id"])


def test_leave_one_device_out_holds_out_exactly_one_device() -> None:
    data = dataset()
    split = make_split("leave_one_device_out", data, CFG)
    device = data.set_index("row_id")["device"]
    assert sorted(split["fold"].unique()) == ["a100", "cpu", "v100"]
    for fold, rows in split.groupby("fold"):
        test_devices = set(device[rows.loc[rows["set"] == "test", "row_id"]])
        train_devices = set(device[rows.loc[rows["set"] == "train", "row_id"]])
        assert test_devices == {fold} and fold not in train_devices and len(train_devices) == 2


def test_batch_extrapolation_tests_only_larger_batches() -> None:
    data = dataset()
    assert default_batch_threshold(data["batch"]) == 4
    assert default_batch_threshold([1, 4, 16, 64]) == 4  # lower median: always a batch size in the data
    split = make_split("batch_extrapolation", data, CFG)
    assert split["fold"].unique().tolist() == ["le4"]
    batch = data.set_index("row_id")["batch"]
    assert batch[split.loc[split["set"] == "test", "row_id"]].min() == 8
    assert batch[split.loc[split["set"] == "train", "row_id"]].max() == 4
    custom = make_split("batch_extrapolation", data, {**CFG, "batch_threshold": 1})
    assert custom["fold"].unique().tolist() == ["le1"]
    assert set(batch[custom.loc[custom["set"] == "test", "row_id"]]) == {2, 4, 8, 16}


@pytest.mark.parametrize(("name", "data", "cfg", "reason"), [
    ("leave_one_device_out", dataset(devices=("a100",)), CFG, "at least 2 devices"),
    ("batch_extrapolation", dataset().assign(batch=8), CFG, "no batch size above k=8"),
    ("batch_extrapolation", dataset(), {**CFG, "batch_threshold": 16}, "no batch size above k=16"),
    ("batch_extrapolation", dataset(), {**CFG, "batch_threshold": 0.5}, "at or below k=0.5"),
    ("leave_one_family_out", dataset().assign(family="one"), CFG, "at least 2 families"),
    ("stratified_kfold", dataset().head(4), CFG, "at least 5 rows"),
    ("family_monte_carlo", dataset().drop_duplicates("family"), CFG, "single row"),
    ("random", dataset().head(0), CFG, "no rows"),
])
def test_impossible_schemes_give_an_empty_table_and_a_note(
        name: str, data: pd.DataFrame, cfg: dict, reason: str) -> None:
    split = make_split(name, data, cfg)
    assert split.empty and list(split.columns) == SPLIT_COLUMNS
    notes = split_notes(name, data, cfg)
    assert notes and reason in " ".join(notes)


def test_feasible_schemes_have_no_blocking_note_and_bad_input_is_named() -> None:
    data = dataset()
    assert split_notes("leave_one_device_out", data, CFG) == []
    assert split_notes("batch_extrapolation", data, CFG) == []
    with pytest.raises(InputError, match="unknown split scheme 'nope'"):
        make_split("nope", data, CFG)
    with pytest.raises(InputError, match="no column"):
        make_split("leave_one_device_out", data.drop(columns="device"), CFG)
    with pytest.raises(InputError, match="kfold"):
        make_split("stratified_kfold", data, {**CFG, "kfold": 1})
    with pytest.raises(InputError, match="mc_train_fraction"):
        make_split("family_monte_carlo", data, {**CFG, "mc_train_fraction": 1.0})
    with pytest.raises(InputError, match="duplicate row_id"):
        make_split("random", pd.concat([data, data.head(1)]), CFG)


def test_missing_config_keys_take_the_defaults() -> None:
    data = dataset()
    pd.testing.assert_frame_equal(make_split("family_monte_carlo", data, {}),
                                  make_split("family_monte_carlo", data, DEFAULTS))
    pd.testing.assert_frame_equal(make_split("stratified_kfold", data, {"seed": 1337}),
                                  make_split("stratified_kfold", data, {**CFG, "kfold": 5}))
    pd.testing.assert_frame_equal(make_split("batch_extrapolation", data, {"batch_threshold": None}),
                                  make_split("batch_extrapolation", data, {}))
    assert np.array_equal(make_split("random", data, {"seed": 1337})["set"],
                          make_split("random", data, CFG)["set"])
