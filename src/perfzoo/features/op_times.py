"""Measured per-operator times grouped into the operator trace's kinds, and the share of a held-out family's
measured step that falls in kinds its training families have.

The profile rule records every aten operator call of a config's timed per-op steps
(``traces/{device}/{shard}.ops.parquet``, :mod:`perfzoo.profiling.op_timing`); :func:`kind_times` names each
call's kind exactly as the meta trace does (:func:`perfzoo.features.ops.recorded_op_kind`) and sums, per
config and kind, the time of a step (mean over the timed steps) into :data:`KIND_TIME_COLUMNS`.

These times are **auxiliary labels**: measurements of the step, like the end-to-end latency, so they are
never features of a regressor (:func:`perfzoo.dataset.build.feature_columns` selects features by name, and
no ``optime_`` column is among them).

A config without per-operator times (it failed, or the device is a GPU) keeps one row with an empty
``kind``, NaN times and the reason in ``message``: missing, never zero.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from perfzoo.features.op_kinds import OP_KINDS, OP_TIME_PREFIX
from perfzoo.io import InputError, read_parquet
from perfzoo.profiling.op_timing import OP_TIME_COLUMNS

CONFIG_KEY = ["device", "config_id", "model_id", "mode", "batch", "power_limit_w"]
KIND_TIME_COLUMNS = [*CONFIG_KEY, "kind", "time_ms", "calls", "step_ms", "ops_ms", "n_steps", "status", "message"]
"""Columns of ``results/features/op_times.parquet``: per (config, kind), the kind's measured time and calls in
one step (means over the timed steps), the step's wall time under the timer (``step_ms``) and the sum of
all its operators' times (``ops_ms``); ``status``/``message`` of the config's per-op times."""
OUTSIDE_OPS = "outside operators"
"""Name of the part of the timed step spent outside any aten operator (Python, autograd engine, timer)."""


def read_op_traces(path: str | Path) -> pd.DataFrame:
    """One ``traces/{device}/{shard}.ops.parquet`` with its device; errors name the file."""
    table = read_parquet(path)
    missing = [c for c in OP_TIME_COLUMNS if c not in table.columns]
    if missing:
        raise InputError(f"{path}: not a per-operator trace file, missing columns {missing}")
    return table.assign(device=Path(path).parent.name)


def classify(raw: pd.DataFrame) -> pd.DataFrame:
    """The measured calls (status ok) with their ``kind``; calls the meta trace does not record are dropped."""
    from perfzoo.features.ops import recorded_op_kind  # lazy: torch (~3 s); the coverage rule never needs it

    ok = raw[raw["status"] == "ok"]
    kinds = [recorded_op_kind(op, bool(g), phase)
             for op, g, phase in zip(ok["op"], ok["grouped"], ok["phase"], strict=True)]
    return ok.assign(kind=kinds).dropna(subset=["kind"])


def kind_times(raw: pd.DataFrame) -> pd.DataFrame:
    """Per (config, kind) measured time of one step (:data:`KIND_TIME_COLUMNS`) from raw per-op rows."""
    raw = raw.copy()
    raw["power_limit_w"] = raw["power_limit_w"].astype("float64")
    calls = classify(raw)
    steps = (calls.groupby([*CONFIG_KEY, "step"], dropna=False)
             .agg(step_ms=("step_ms", "first"), ops_ms=("time_ms", "sum")).reset_index()
             .groupby(CONFIG_KEY, dropna=False)
             .agg(step_ms=("step_ms", "mean"), ops_ms=("ops_ms", "mean"), n_steps=("step", "nunique")))
    # mean over the timed steps, a step without a call of the kind counting 0 ms
    table = (calls.groupby([*CONFIG_KEY, "kind"], dropna=False)
             .agg(time_ms=("time_ms", "sum"), calls=("time_ms", "size")).reset_index()
             .merge(steps.reset_index(), on=CONFIG_KEY))
    table["time_ms"] /= table["n_steps"]
    table["calls"] /= table["n_steps"]
    failed = (raw[raw["status"] != "ok"].drop_duplicates(CONFIG_KEY)[[*CONFIG_KEY, "status", "message"]]
              .assign(kind=""))
    table = pd.concat([table.assign(status="ok", message=""), failed], ignore_index=True)
    return (table.reindex(columns=KIND_TIME_COLUMNS)
            .astype({"time_ms": "float64", "calls": "float64", "step_ms": "float64", "ops_ms": "float64",
                     "n_steps": "float64"})
            .sort_values([*CONFIG_KEY, "kind"]).reset_index(drop=True))


def op_time_table(paths: list[str]) -> pd.DataFrame:
    """:func:`kind_times` of every per-operator trace file."""
    frames = [kind_times(read_op_traces(p)) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=KIND_TIME_COLUMNS)


def kind_time_labels(table: pd.DataFrame) -> pd.DataFrame:
    """One row per measured config: ``optime_<kind>_ms`` per kind of :data:`OP_KINDS` (0 for a kind the
    config measured no call of, NaN for a config without per-op times), ``optime_step_ms`` and
    ``optime_message``; keyed by ``device, model_id, mode, batch``."""
    key = ["device", "model_id", "mode", "batch"]
    ok = table[table["status"] == "ok"]
    wide = ok.pivot_table(index=key, columns="kind", values="time_ms", aggfunc="sum").reindex(columns=OP_KINDS)
    wide = wide.fillna(0.0).add_prefix(OP_TIME_PREFIX).add_suffix("_ms")
    wide[f"{OP_TIME_PREFIX}step_ms"] = ok.groupby(key)["step_ms"].first()
    wide = wide.reset_index()
    wide[f"{OP_TIME_PREFIX}message"] = ""
    failed = table[table["status"] != "ok"].drop_duplicates(key)[[*key, "message"]]
    failed = failed.rename(columns={"message": f"{OP_TIME_PREFIX}message"})
    return pd.concat([wide, failed], ignore_index=True)


def kind_shares(table: pd.DataFrame) -> pd.DataFrame:
    """Per measured config and kind, the kind's share of the step timed under the timer (``share``), plus a
    row of kind :data:`OUTSIDE_OPS` for the time outside any operator."""
    ok = table[table["status"] == "ok"]
    shares = ok.assign(share=ok["time_ms"] / ok["step_ms"])[[*CONFIG_KEY, "kind", "share"]]
    per_config = ok.drop_duplicates(CONFIG_KEY)
    outside = per_config.assign(kind=OUTSIDE_OPS, share=1.0 - per_config["ops_ms"] / per_config["step_ms"])
    return pd.concat([shares, outside[[*CONFIG_KEY, "kind", "share"]]], ignore_index=True)


COVERAGE_COLUMNS = ["split", "fold", "device", "family", "configs", "configs_without_op_times", "covered_share",
                    "unseen_share", "outside_share", "unseen_kinds"]
"""Columns of ``results/evaluate/op_coverage.parquet``: per held-out family (fold) and device, the median over
its configs of the step's share in kinds measured in the training families (``covered_share``), in kinds
they never ran (``unseen_share``) and outside any operator (``outside_share``); ``unseen_kinds`` names each
unseen kind with its median share, e.g. ``"attention 0.12; embedding 0.01"``; held-out configs without per-op
times (failed, or measured on a GPU) are counted in ``configs_without_op_times``."""


def family_coverage(table: pd.DataFrame, split: pd.DataFrame, dataset: pd.DataFrame) -> pd.DataFrame:
    """:data:`COVERAGE_COLUMNS` of every fold of ``split`` (e.g. leave_one_family_out): the share of each
    held-out config's measured step in kinds that the fold's training configs of the same device ran."""
    rows_of = dataset[["row_id", "device", "model_id", "mode", "batch", "family"]]
    assigned = split.merge(rows_of, on="row_id", how="inner")
    shares = kind_shares(table)
    shares = shares.merge(rows_of.drop(columns="row_id"), on=["device", "model_id", "mode", "batch"])
    out = []
    for (fold, device), rows in assigned.groupby(["fold", "device"], sort=True):
        train = rows.loc[rows["set"] == "train", "model_id"].to_numpy()
        held = rows[rows["set"] != "train"]
        on_device = shares[shares["device"] == device]
        seen = set(on_device.loc[on_device["model_id"].isin(train) & (on_device["kind"] != OUTSIDE_OPS), "kind"])
        mine = on_device[on_device["model_id"].isin(held["model_id"])
                         & on_device.set_index(["model_id", "mode", "batch"]).index.isin(
                             held.set_index(["model_id", "mode", "batch"]).index)]
        if mine.empty:
            continue
        row = _coverage_row(split["split"].iloc[0], str(fold), device, mine, seen)
        out.append({**row, "configs_without_op_times": len(held) - row["configs"]})
    return pd.DataFrame(out, columns=COVERAGE_COLUMNS)


def _coverage_row(split: str, fold: str, device: str, shares: pd.DataFrame, seen: set[str]) -> dict:
    config = ["config_id"]
    kind = shares["kind"]
    status = np.where(kind == OUTSIDE_OPS, "outside", np.where(kind.isin(seen), "covered", "unseen"))
    per_config = shares.assign(status=status).pivot_table(index=config, columns="status", values="share",
                                                          aggfunc="sum").reindex(
        columns=["covered", "unseen", "outside"]).fillna(0.0)
    unseen = shares[status == "unseen"].pivot_table(index=config, columns="kind", values="share",
                                                    aggfunc="sum").reindex(per_config.index).fillna(0.0)
    medians = unseen.median().sort_values(ascending=False)
    return {"split": split, "fold": fold, "device": device,
            "family": ", ".join(sorted(set(shares["family"]))), "configs": len(per_config),
            "covered_share": float(per_config["covered"].median()),
            "unseen_share": float(per_config["unseen"].median()),
            "outside_share": float(per_config["outside"].median()),
            "unseen_kinds": "; ".join(f"{k} {v:.3f}" for k, v in medians.items())}
