"""Split stage: named, seeded train/validation/test assignments, stored as tables.

Every scheme returns the long table ``SPLIT_COLUMNS`` (``split, fold, row_id, set``): one row per
(fold, dataset row), ``fold`` a string, ``set`` one of ``train``/``val``/``test``. Within a fold the
sets are disjoint. Schemes do not depend on the row order of the dataset (rows are sorted by
``row_id`` first), so a scheme is a pure function of (data, config).

Schemes (``SCHEMES``):

``random``
    One fold ``"0"``: rows shuffled with ``seed`` and cut 70/15/15 (``random_fractions``; as in Panner Selvam and Brorsson, MAELSTROM D3.5 Performance model for hardware configurations).
``family_monte_carlo``
    Per-family Monte-Carlo (Panner Selvam, Performance Prediction Models for Deep Learning, PhD thesis 2025, ch. 5): one fold per seed of ``mc_seeds`` (default 1337..1341),
    named by the seed; within *each* family, ``mc_train_fraction`` (0.7) of its rows train and the
    rest test (a family with >= 2 rows keeps at least one row on each side). Metrics are averaged
    over the folds downstream.
``stratified_kfold``
    Stratified k-fold (same thesis, ch. 6): sklearn ``StratifiedKFold(kfold, shuffle=True,
    random_state=seed)`` stratified by family; folds ``"0"``..``"k-1"``, each test once. Families
    with fewer rows than ``kfold`` are pooled into one stratum so that they are spread over the
    folds instead of making sklearn fail or warn.
``leave_one_family_out``
    One fold per family (named by it): that family tests, every other family trains.
``leave_one_device_out``
    One fold per device (named by it): that device tests, every other device trains. With
    ``device_group`` naming another column (e.g. the GPU model when one GPU was measured under two
    software versions), all rows of a group are held out together.
``few_shot_device``
    One fold per device group (``device_group``, default the ``device`` column) and draw: that group
    tests, except ``few_shot_k`` (default 20) of its rows, drawn with ``seed`` and the draw number,
    which train with every other group's rows; ``few_shot_draws`` (default 1) draws, folds named
    ``{group}/k{k}/d{draw}``. ``few_shot_k: 0`` is leave-one-device-out.
``batch_extrapolation``
    Batch-size extrapolation (Gianniti, Zhang and Ardagna, Performance Prediction of GPU-based Deep Learning Applications): rows with ``batch <= k`` train, larger
    batches test; ``k`` is ``batch_threshold`` or, by default, the (lower) median of the distinct
    batch sizes, so it is always a batch size present in the data. One fold named ``le{k}``.

A scheme that cannot be formed from the data (one device for leave-one-device-out, no batch above
``k``, fewer rows than folds, ...) does not raise: ``make_split`` returns an empty table with the
split columns and ``split_notes`` says why.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from sklearn.model_selection import StratifiedKFold

from perfzoo.io import InputError

SPLIT_COLUMNS = ["split", "fold", "row_id", "set"]
SETS = ("train", "val", "test")

DEFAULTS: dict[str, Any] = {
    "seed": 1337,
    "random_fractions": [0.70, 0.15, 0.15],
    "mc_seeds": [1337, 1338, 1339, 1340, 1341],
    "mc_train_fraction": 0.7,
    "kfold": 5,
    "batch_threshold": None,
    "device_group": "device",
    "few_shot_k": 20,
    "few_shot_draws": 1,
}

SchemeResult = tuple[pd.DataFrame, list[str]]
Scheme = Callable[[pd.DataFrame, dict[str, Any]], SchemeResult]


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in SPLIT_COLUMNS[1:]})


def _fold(fold: str, row_ids: Any, sets: Any) -> pd.DataFrame:
    return pd.DataFrame({"fold": str(fold), "row_id": np.asarray(row_ids), "set": np.asarray(sets)})


def _concat(folds: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(folds, ignore_index=True) if folds else _empty()


def _stable_int(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


# --------------------------------------------------------------------------- the original two schemes


def random_split(data: pd.DataFrame, seed: int, fractions: list[float]) -> pd.DataFrame:
    """One fold: rows shuffled with ``seed`` and cut into train/val/test by ``fractions`` (Panner Selvam and Brorsson, MAELSTROM D3.5)."""
    rng = np.random.default_rng(seed)
    ids = data["row_id"].to_numpy()[rng.permutation(len(data))]
    n_train = round(fractions[0] * len(ids))
    n_val = round(fractions[1] * len(ids))
    sets = ["train"] * n_train + ["val"] * n_val + ["test"] * (len(ids) - n_train - n_val)
    return pd.DataFrame({"fold": "0", "row_id": ids, "set": sets})


def leave_one_family_out(data: pd.DataFrame, seed: int, fractions: list[float]) -> pd.DataFrame:
    """One fold per family: that family is the test set, every other family trains."""
    return _leave_one_out(data, "family")


def _leave_one_out(data: pd.DataFrame, column: str) -> pd.DataFrame:
    folds = []
    for value in sorted(data[column].astype(str).unique()):
        held_out = data[column].astype(str) == value
        folds.append(_fold(value, data["row_id"], np.where(held_out, "test", "train")))
    return _concat(folds)


def _random(data: pd.DataFrame, cfg: dict[str, Any]) -> SchemeResult:
    fractions = [float(f) for f in cfg["random_fractions"]]
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise InputError(
            f"splits.random_fractions: expected 3 non-negative fractions summing to 1, got {fractions}")
    return random_split(data, int(cfg["seed"]), fractions), []


def _lofo(data: pd.DataFrame, cfg: dict[str, Any]) -> SchemeResult:
    families = data["family"].dropna().astype(str).unique()
    if data["family"].isna().any():
        return _empty(), [f"{int(data['family'].isna().sum())} rows have no family"]
    if len(families) < 2:
        return _empty(), [f"leave_one_family_out needs at least 2 families; the dataset has {len(families)}"]
    return _leave_one_out(data, "family"), []


# --------------------------------------------------------------------------- Panner Selvam's thesis, ch. 5 and ch. 6


def family_monte_carlo(data: pd.DataFrame, seeds: list[int], train_fraction: float) -> pd.DataFrame:
    """One fold per seed: within each family, ``train_fraction`` of its rows train, the rest test.

    Each family is shuffled with a generator seeded by (seed, hash of the family name), so adding
    or removing a family does not change the assignment of the others.
    """
    families = data["family"].astype(str).to_numpy()
    row_ids = data["row_id"].to_numpy()
    folds = []
    for seed in seeds:
        sets = np.empty(len(data), dtype=object)
        for family in sorted(set(families)):
            idx = np.flatnonzero(families == family)
            rng = np.random.default_rng([int(seed), _stable_int(family)])
            idx = idx[rng.permutation(len(idx))]
            n_train = max(round(train_fraction * len(idx)), 1)  # a single-row family trains
            if len(idx) >= 2:
                n_train = min(n_train, len(idx) - 1)
            sets[idx[:n_train]] = "train"
            sets[idx[n_train:]] = "test"
        folds.append(_fold(str(seed), row_ids, sets))
    return _concat(folds)


def _family_mc(data: pd.DataFrame, cfg: dict[str, Any]) -> SchemeResult:
    seeds = [int(s) for s in cfg["mc_seeds"]]
    fraction = float(cfg["mc_train_fraction"])
    if not seeds or len(set(seeds)) != len(seeds):
        raise InputError(f"splits.mc_seeds: expected a non-empty list of distinct seeds, got {seeds}")
    if not 0 < fraction < 1:
        raise InputError(f"splits.mc_train_fraction: expected a number in (0, 1), got {fraction}")
    if data["family"].isna().any():
        return _empty(), [f"{int(data['family'].isna().sum())} rows have no family"]
    table = family_monte_carlo(data, seeds, fraction)
    if not (table["set"] == "test").any():
        return _empty(), ["family_monte_carlo: every family has a single row, so no family has a test row"]
    notes = []
    sizes = data["family"].astype(str).value_counts()
    single = sorted(sizes[sizes < 2].index)
    if single:
        notes.append(f"families with a single row are always in train: {', '.join(single)}")
    return table, notes


RARE_STRATUM = "__families_with_fewer_rows_than_folds__"


def stratified_kfold(data: pd.DataFrame, k: int, seed: int) -> pd.DataFrame:
    """Folds ``"0"``..``"k-1"`` of sklearn's shuffled ``StratifiedKFold`` stratified by family.

    Families with fewer than ``k`` rows are pooled into one stratum (``RARE_STRATUM``); a pooled
    stratum still smaller than ``k`` is allowed (sklearn's warning about it is silenced).
    """
    family = data["family"].astype(str)
    sizes = family.value_counts()
    strata = family.where(family.map(sizes) >= k, RARE_STRATUM).to_numpy()
    row_ids = data["row_id"].to_numpy()
    folds = []
    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        for i, (_, test_idx) in enumerate(splitter.split(np.zeros(len(strata)), strata)):
            sets = np.full(len(data), "train", dtype=object)
            sets[test_idx] = "test"
            folds.append(_fold(str(i), row_ids, sets))
    return _concat(folds)


def _stratified(data: pd.DataFrame, cfg: dict[str, Any]) -> SchemeResult:
    k = int(cfg["kfold"])
    if k < 2:
        raise InputError(f"splits.kfold: expected an integer >= 2, got {cfg['kfold']}")
    if data["family"].isna().any():
        return _empty(), [f"{int(data['family'].isna().sum())} rows have no family"]
    if len(data) < k:
        why = f"stratified_kfold with {k} folds needs at least {k} rows; the dataset has {len(data)}"
        return _empty(), [why]
    notes = []
    sizes = data["family"].astype(str).value_counts()
    rare = sorted(sizes[sizes < k].index)
    if rare:
        notes.append(f"families with fewer than {k} rows are stratified together: {', '.join(rare)}")
    return stratified_kfold(data, k, int(cfg["seed"])), notes


# --------------------------------------------------------------------------- device and batch extrapolation


def _device_groups(data: pd.DataFrame, cfg: dict[str, Any], scheme: str) -> tuple[str, list[str]]:
    """The device-group column and why the scheme cannot be formed (empty when it can)."""
    column = str(cfg["device_group"])
    if column not in data.columns:
        raise InputError(f"splits.device_group: dataset has no column {column!r}")
    if data[column].isna().any():
        return column, [f"{int(data[column].isna().sum())} rows have no {column}"]
    devices = data[column].astype(str).unique()
    if len(devices) < 2:
        return column, [f"{scheme} needs at least 2 devices; the dataset has {len(devices)}"
                        + (f" ({devices[0]})" if len(devices) else "")]
    return column, []


def _lodo(data: pd.DataFrame, cfg: dict[str, Any]) -> SchemeResult:
    column, notes = _device_groups(data, cfg, "leave_one_device_out")
    return (_empty(), notes) if notes else (_leave_one_out(data, column), [])


def few_shot_device(data: pd.DataFrame, column: str, k: int, draws: int, seed: int) -> pd.DataFrame:
    """Per device group and draw: the group tests except ``k`` seeded random rows, which train."""
    folds = []
    groups = data[column].astype(str)
    for value in sorted(groups.unique()):
        held = np.flatnonzero((groups == value).to_numpy())
        for draw in range(draws):
            rng = np.random.default_rng([seed, draw, _stable_int(value)])
            shots = rng.choice(held, size=min(k, len(held)), replace=False)
            sets = np.where(groups == value, "test", "train")
            sets[shots] = "train"
            folds.append(_fold(f"{value}/k{k}/d{draw}", data["row_id"], sets))
    return _concat(folds)


def _few_shot(data: pd.DataFrame, cfg: dict[str, Any]) -> SchemeResult:
    k, draws = int(cfg["few_shot_k"]), int(cfg["few_shot_draws"])
    if k < 0 or draws < 1:
        raise InputError(f"splits: few_shot_k must be >= 0 and few_shot_draws >= 1, got {k} and {draws}")
    column, notes = _device_groups(data, cfg, "few_shot_device")
    if notes:
        return _empty(), notes
    small = data[column].astype(str).value_counts()
    small = small[small <= k]
    if len(small):
        return _empty(), [f"few_shot_device: k={k} leaves no test rows for {', '.join(small.index)}"]
    return few_shot_device(data, column, k, draws, int(cfg["seed"])), []


def default_batch_threshold(batches: Any) -> float:
    """The lower median of the distinct batch sizes (a batch size present in the data)."""
    distinct = np.unique(np.asarray(batches, dtype=float))
    return float(distinct[(len(distinct) - 1) // 2])


def _format_batch(k: float) -> str:
    return str(int(k)) if float(k).is_integer() else f"{k:g}"


def batch_extrapolation(data: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """One fold ``le{threshold}``: batch <= threshold trains, larger batches test."""
    batch = pd.to_numeric(data["batch"]).to_numpy(dtype=float)
    sets = np.where(batch <= threshold, "train", "test")
    return _fold(f"le{_format_batch(threshold)}", data["row_id"], sets)


def _batch(data: pd.DataFrame, cfg: dict[str, Any]) -> SchemeResult:
    batch = pd.to_numeric(data["batch"], errors="coerce")
    if batch.isna().any():
        return _empty(), [f"{int(batch.isna().sum())} rows have no numeric batch size"]
    given = cfg.get("batch_threshold")
    k = float(given) if given is not None else default_batch_threshold(batch)
    distinct = sorted(set(batch.astype(float)))
    shown = f"(batch sizes in the dataset: {', '.join(_format_batch(b) for b in distinct)})"
    if not any(b > k for b in distinct):
        return _empty(), [f"batch_extrapolation: no batch size above k={_format_batch(k)} {shown}"]
    if not any(b <= k for b in distinct):
        why = f"batch_extrapolation: no batch size at or below k={_format_batch(k)} to train on {shown}"
        return _empty(), [why]
    return batch_extrapolation(data, k), []


SCHEMES: dict[str, Scheme] = {
    "random": _random,
    "family_monte_carlo": _family_mc,
    "stratified_kfold": _stratified,
    "leave_one_family_out": _lofo,
    "leave_one_device_out": _lodo,
    "batch_extrapolation": _batch,
    "few_shot_device": _few_shot,
}
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "random": ("row_id",),
    "family_monte_carlo": ("row_id", "family"),
    "stratified_kfold": ("row_id", "family"),
    "leave_one_family_out": ("row_id", "family"),
    "leave_one_device_out": ("row_id", "device"),
    "batch_extrapolation": ("row_id", "batch"),
    "few_shot_device": ("row_id",),
}


def _run(name: str, data: pd.DataFrame, cfg: dict[str, Any]) -> SchemeResult:
    if name not in SCHEMES:
        raise InputError(f"unknown split scheme {name!r} (known: {', '.join(SCHEMES)})")
    missing = [c for c in REQUIRED_COLUMNS[name] if c not in data.columns]
    if missing:
        raise InputError(f"split {name}: dataset has no column(s) {missing}")
    if data["row_id"].duplicated().any():
        dup = data.loc[data["row_id"].duplicated(), "row_id"].iloc[0]
        raise InputError(f"split {name}: duplicate row_id {dup!r} in the dataset")
    full = {**DEFAULTS, **{k: v for k, v in (cfg or {}).items() if v is not None}}
    if data.empty:
        return _empty(), ["the dataset has no rows"]
    ordered = data.sort_values("row_id").reset_index(drop=True)
    return SCHEMES[name](ordered, full)


def make_split(name: str, data: pd.DataFrame, cfg: dict[str, Any]) -> pd.DataFrame:
    """The split table of scheme ``name``: one row per (fold, dataset row), columns ``SPLIT_COLUMNS``.

    ``cfg`` is the ``splits`` config section; missing keys take ``DEFAULTS``. A scheme that cannot be
    formed gives an empty table (see ``split_notes`` for why).
    """
    table, _ = _run(name, data, cfg)
    table = table.copy()
    table.insert(0, "split", name)
    table = table[SPLIT_COLUMNS].sort_values(["fold", "row_id"]).reset_index(drop=True)
    return table.astype({"split": str, "fold": str, "row_id": str, "set": str}) if len(table) else table


def split_notes(name: str, data: pd.DataFrame, cfg: dict[str, Any]) -> list[str]:
    """Human-readable notes on scheme ``name`` for this data: why it cannot be formed (table empty), or
    caveats (e.g. small families pooled). An empty list means nothing to say."""
    return list(_run(name, data, cfg)[1])
