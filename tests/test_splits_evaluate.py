"""Splits are seeded and disjoint; metrics match hand-computed values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfzoo.evaluate import best_per_target, metrics_table
from perfzoo.fitting import fit_split
from perfzoo.dataset.splits import make_split
from perfzoo.stats import all_metrics, mape, mape_interval

CFG = {"seed": 1337, "random_fractions": [0.7, 0.15, 0.15]}


def dataset(n: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    flops = rng.uniform(1e6, 1e9, n)
    return pd.DataFrame({
        "row_id": [f"r{i:03d}" for i in range(n)], "model_id": [f"m{i}" for i in range(n)], "device": "cpu",
        "mode": "inference", "batch": 1, "family": [f"f{i % 4}" for i in range(n)], "label": "x",
        "flops": flops, "params": flops / 100, "latency_ms": flops / 1e7 * rng.uniform(0.95, 1.05, n),
    })


def test_random_split_is_seeded_disjoint_and_sized() -> None:
    data = dataset()
    a, b = make_split("random", data, CFG), make_split("random", data.sample(frac=1, random_state=1), CFG)
    pd.testing.assert_frame_equal(a, b)  # row order of the dataset does not matter
    counts = a["set"].value_counts().to_dict()
    assert counts == {"train": 28, "val": 6, "test": 6}
    other = make_split("random", data, {**CFG, "seed": 1})
    assert not a["set"].equals(other["set"])


def test_leave_one_family_out_holds_out_each_family_once() -> None:
    data = dataset()
    split = make_split("leave_one_family_out", data, CFG)
    fam = data.set_index("row_id")["family"]
    for fold, rows in split.groupby("fold"):
        test_families = set(fam[rows.loc[rows["set"] == "test", "row_id"]])
        train_families = set(fam[rows.loc[rows["set"] == "train", "row_id"]])
        assert test_families == {fold} and fold not in train_families


def test_metrics_by_hand() -> None:
    y, p = np.array([1.0, 2.0, 4.0]), np.array([1.1, 1.8, 4.0])
    m = all_metrics(y, p)
    assert m["mape"] == pytest.approx((0.1 + 0.1 + 0) / 3 * 100)
    assert m["rmse"] == pytest.approx(np.sqrt((0.01 + 0.04) / 3))
    assert m["within_10pct"] == pytest.approx(1.0)
    assert m["kendall_tau"] == pytest.approx(1.0)


def held_out(split: str) -> pd.DataFrame:
    """Test rows of four families of five models with one batch each, one family predicted 50 % high, the
    others within 2 %."""
    rows = 20
    family = [f"f{i // 5}" for i in range(rows)]
    y_true = np.full(rows, 10.0)
    y_pred = np.where(np.array(family) == "f0", 15.0, 10.0 + np.linspace(-0.2, 0.2, rows))
    ids = [f"m{i}" for i in range(rows)]
    return pd.DataFrame({"target": "latency_ms", "regressor": "linear", "split": split, "fold": family,
                         "set": "test", "row_id": ids, "model_id": ids, "family": family,
                         "y_true": y_true, "y_pred": y_pred})


def test_mape_interval_resamples_whole_units_and_is_seeded() -> None:
    rows = held_out("leave_one_family_out")
    y, p = rows["y_true"].to_numpy(), rows["y_pred"].to_numpy()
    by_family = mape_interval(y, p, rows["family"].to_numpy())
    by_row = mape_interval(y, p, np.arange(len(rows)))
    assert by_family[0] <= mape(y, p) <= by_family[1]
    # a quarter of the families carries the error: drawn whole, the MAPE moves more than row by row
    assert by_family[1] - by_family[0] > 1.3 * (by_row[1] - by_row[0])
    assert mape_interval(y, p, rows["family"].to_numpy()) == by_family  # the same table on every run
    assert all(np.isnan(mape_interval(y, p, np.zeros(len(rows)))))  # one unit: no interval
    assert mape_interval(y[:2], np.array([12.0, 12.0]), np.array(["a", "b"])) == (20.0, 20.0)


def test_metrics_table_resamples_families_where_the_split_holds_them_out() -> None:
    noise = pd.DataFrame({"target": ["latency_ms"], "noise_mape": [2.0]})
    for split, unit in [("leave_one_family_out", "family"), ("random", "model_id")]:
        rows = held_out(split)
        table = metrics_table(rows, noise)
        expected = mape_interval(rows["y_true"].to_numpy(), rows["y_pred"].to_numpy(), rows[unit].to_numpy())
        assert (table["mape_lo90"].item(), table["mape_hi90"].item()) == expected
        assert table["mape_lo90"].item() < table["mape"].item() < table["mape_hi90"].item()
    without_ids = held_out("random").drop(columns=["model_id", "family"])  # rows resampled one by one
    table = metrics_table(without_ids, noise)
    assert table["mape_lo90"].item() < table["mape"].item() < table["mape_hi90"].item()


def test_fit_split_predicts_held_out_rows_and_skips_tiny_folds() -> None:
    data = dataset()
    data.loc[0, "latency_ms"] = np.inf
    split = make_split("leave_one_family_out", data, CFG)
    preds, models, notes = fit_split(data, split, "latency_ms", "linear")
    assert notes["excluded_nonfinite_labels"] == 1
    assert set(models) == {"f0", "f1", "f2", "f3"}
    assert len(preds) == len(data) - 1 and (preds["set"] == "test").all()
    metrics = metrics_table(preds, pd.DataFrame({"target": ["latency_ms"], "noise_mape": [2.0]}))
    assert metrics["mape"].item() < 10 and metrics["noise_floor_mape"].item() == 2.0
    assert best_per_target(metrics)["regressor"].item() == "linear"
    few = data[data["family"].isin(["f0", "f1"])].head(5)
    _, models, notes = fit_split(few, make_split("leave_one_family_out", few, CFG), "latency_ms", "linear")
    assert notes["skipped_folds"] and len(models) < 2


def test_time_only_methods_do_not_fit_memory() -> None:
    from perfzoo.fitting import unsupported_reason

    assert unsupported_reason("roofline", "peak_mem_mb") is not None
    assert unsupported_reason("gianniti_layer", "peak_mem_mb") is not None
    assert unsupported_reason("roofline", "latency_ms") is None
    assert unsupported_reason("xgboost", "peak_mem_mb") is None
