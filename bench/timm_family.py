"""Benchmark: predict AMP inference latency of an unseen timm architecture family on a profiled GPU.

Reads timm's published AMP inference benchmark CSVs (as ``bench/device_transfer.py`` does: one row per
file, model and image size, latency per sample) and, per file (one GPU under one torch version), holds
out each architecture family in turn (family = the timm module that defines the model,
``perfzoo.dataset.timm.timm_family``) and fits on the other families of the same file. Features are the
ones in the CSVs: FLOPs (2 × ``infer_gmacs``), activation bytes (2 × ``infer_macts``), weight bytes
(2 × ``param_count``), batch size and image size.

Regressors (perfzoo, log target, fixed parameters): ``linear`` (ridge on standardised log features) and
``extra_trees`` by default; ``xgboost`` and ``poly_lasso`` (degree 2) on request. Baselines: the nearest training config (standardised log features) scaled by the FLOPs
ratio (``perfzoo.regressors.baselines.flops_nearest``), one constant time per FLOP (geometric mean over
the training families), and the roofline time (max of compute and memory time from the GPU's spec sheet)
times one constant factor (``roofline``). The per-device baselines of the project (same workload on
another device) do not apply: a held-out family has no row on this file.

MAPE in % pooled over every row of the file (each row predicted once, when its family is held out);
also the median over families of the per-family MAPE. The per-file summary is written to ``--out``.

With ``--op-features FILE`` (made by ``bench/timm_ops.py``: perfzoo's operator trace of every workload
on the meta device, at batches 2, 4 and 8), the rows are those whose trace exists and is linear in the batch
(the others are counted and left out of every method, so all methods score the same rows), and more methods use the operator kinds:
``<regressor>+ops`` for every regressor asked for (the CSV features plus, per sample, FLOPs, bytes and calls
of every operator kind at the row's batch, exact from the two probes) and ``composed`` (perfzoo's composed
regressor: the step time as a non-negative sum over kinds of time per FLOP, per byte and per call plus a
step overhead, fitted on the step time ``latency × batch`` and the step's operator totals), and, for each
development round (``CHOSEN_BY_ROUND``; ``CHOSEN`` is the last):
the one of ``CANDIDATES`` (extra trees with more members, on the signed log of the features, with every
operator kind's share of the step's FLOPs, bytes and calls, or averaged in log space with xgboost and/or
``composed``) that scored lowest on the development split. ``--develop [ROUND]`` scores one round's candidates
(``DEVELOP_ROUNDS``) there and on nothing else: leave-one-family-out inside a fixed random half of the families
of the RTX 3090 file (``DEV_FILE``, ``DEV_SEED``), with a bootstrap over those families of each candidate's
difference to the round's incumbent (its first).

Usage: ``PYTHONPATH=src python bench/timm_family.py [DIR] [--regressors linear extra_trees [xgboost poly_lasso]]
[--op-features bench/timm_ops.parquet [--develop [ROUND]]] [--part K/N]``
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfzoo.dataset.timm import timm_family
from perfzoo.features.op_kinds import OP_ERROR_COLUMN, OP_FEATURE_KINDS, OP_FEATURES, OP_STATS
from perfzoo.regressors import make_regressor
from perfzoo.regressors.base import signed_log1p
from perfzoo.regressors.baselines import flops_nearest
from perfzoo.stats import mape

sys.path.insert(0, str(Path(__file__).parent))
from device_transfer import load  # noqa: E402  (the bench scripts share the CSV reader)

FEATURES = ["flops", "activation_bytes", "weight_bytes", "batch", "resolution"]
#: regressor kind -> parameters (fixed, not tuned on the held-out families)
REGRESSORS = {
    "linear": {"alpha": 1.0},
    "xgboost": {"n_estimators": 300, "learning_rate": 0.05, "max_depth": 6},
    "extra_trees": {"n_estimators": 50, "min_samples_leaf": 2},
    "poly_lasso": {"degree": 2, "alpha": 1e-3},
}


def with_families(data: pd.DataFrame) -> pd.DataFrame:
    """Add ``family`` (timm module of the model) and ``resolution`` (image size) to the rows."""
    parts = data["model_id"].str.rsplit("@", n=1, expand=True)
    name, size = parts[0], parts[1]
    families = {n: timm_family(n) for n in name.unique()}
    unknown = sorted(n for n, f in families.items() if not f)
    if unknown:
        print(f"{len(unknown)} model names unknown to the installed timm, left out: {', '.join(unknown[:5])} ...")
    return data.assign(family=name.map(families), resolution=size.astype(float)).query("family != ''")


PER_SAMPLE_OPS = [f"{f}_per_sample" for f in OP_FEATURES]
#: the features of the ``<regressor>+ops`` methods: the CSV ones and the per-sample operator totals
WITH_OPS = [*FEATURES, *PER_SAMPLE_OPS]


NOT_LINEAR = "operator totals not linear in the batch (the batch-8 probe is off the line of batches 2 and 4)"
NOT_CHECKED = "no trace at batch 8 to check the line of batches 2 and 4 (run bench/timm_ops.py again on the file)"
LINE, CHECK = (2, 4), 8
"""The probe batches whose line gives a workload's totals at its batch, and the probe that checks the line
(``bench/timm_ops.py``)."""


def probe_totals(ops: pd.DataFrame, batch: int) -> pd.DataFrame:
    """The operator totals of every workload traced at ``batch``, by ``model_id``."""
    return ops[ops["batch"] == batch].set_index("model_id")[list(OP_FEATURES)]


def off_the_line(ops: pd.DataFrame) -> pd.DataFrame:
    """One row (``model_id``, reason) per workload traced at both line probes whose totals at the check batch are
    not those the line extrapolates to, or that has no trace at the check batch."""
    at = {b: probe_totals(ops, b) for b in (*LINE, CHECK)}
    on_line = at[LINE[0]].index.intersection(at[LINE[1]].index)
    common = on_line.intersection(at[CHECK].index)
    low, high = at[LINE[0]].loc[common], at[LINE[1]].loc[common]
    expected = high + (high - low) * (CHECK - LINE[1]) / (LINE[1] - LINE[0])
    off = ~np.isclose(at[CHECK].loc[common], expected, rtol=1e-9, atol=0).all(axis=1)
    unchecked = on_line.difference(common)
    return pd.DataFrame({"model_id": [*common[off], *unchecked],
                         OP_ERROR_COLUMN: [NOT_LINEAR] * int(off.sum()) + [NOT_CHECKED] * len(unchecked)})


def with_op_features(data: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Rows with their operator totals at their own batch (on the line of the probes at batches 2 and 4,
    ``q(B) = q(2) + (q(4) - q(2)) (B - 2) / 2``) and per sample; rows whose workload has no trace, or whose totals
    are not linear in the batch (:func:`off_the_line`), are left out, counted and named by reason."""
    ops = pd.read_parquet(path)
    failed = ops[ops[OP_ERROR_COLUMN].fillna("") != ""].drop_duplicates("model_id")
    failed = pd.concat([failed[["model_id", OP_ERROR_COLUMN]],
                        off_the_line(ops[~ops["model_id"].isin(failed["model_id"])])], ignore_index=True)
    ok = ops[~ops["model_id"].isin(failed["model_id"])]
    low, high = (probe_totals(ok, b) for b in LINE)
    kept = data[data["model_id"].isin(low.index.intersection(high.index))].copy()
    b = kept["batch"].to_numpy()[:, None]
    q_low, q_high = low.loc[kept["model_id"]].to_numpy(), high.loc[kept["model_id"]].to_numpy()
    step = q_low + (q_high - q_low) * (b - LINE[0]) / (LINE[1] - LINE[0])
    kept[list(OP_FEATURES)] = step
    kept[PER_SAMPLE_OPS] = step / b
    missing = data[~data.index.isin(kept.index)]
    print(f"operator features: {kept['model_id'].nunique()} workloads kept, "
          f"{missing['model_id'].nunique()} left out ({len(missing)} rows): "
          f"{len(failed)} not traceable or not linear in the batch, "
          f"{missing['model_id'].nunique() - len(failed)} not in {path}")
    for reason, models in failed.groupby(OP_ERROR_COLUMN)["model_id"]:
        print(f"  {len(models)} x {reason[:160]}: {', '.join(sorted(models)[:6])}{' ...' if len(models) > 6 else ''}")
    return kept


OP_SHARES = [f"{f}_share" for f in OP_FEATURES]
#: ``sign(x) log(1 + |x|)`` of the CSV and per-sample operator features (monotone, so the same order as the
#: raw values; signed in case a total is negative, as the extrapolation from batches 1 and 2 made the CondConv
#: models'): extra trees draw each cut point uniformly between a node's smallest and largest value, so on a
#: feature spanning decades most raw cuts fall in the top decade
LOG_FEATURES = [f"slog_{c}" for c in WITH_OPS]


def with_derived_features(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with every operator kind's share of the step's FLOPs, bytes and calls (scale-free composition)
    and the signed ``log1p`` of the CSV and per-sample operator features (``LOG_FEATURES``)."""
    derived = {}
    for measure in OP_STATS:  # a kind's share: its quantity over the step's total of that statistic
        columns = [f for f, (_, stat) in OP_FEATURE_KINDS.items() if stat == measure]
        total = rows[columns].sum(axis=1)
        if (total <= 0).any():
            bad = rows.loc[total <= 0, "model_id"].iloc[0]
            raise ValueError(f"operator trace of {bad}: no {measure} in any kind, its shares are undefined")
        derived.update({f"{c}_share": rows[c] / total for c in columns})
    derived.update({f"slog_{c}": signed_log1p(rows[c].to_numpy(dtype=float)) for c in WITH_OPS})
    return pd.concat([rows, pd.DataFrame(derived, index=rows.index)], axis=1)


@dataclass(frozen=True)
class Candidate:
    """A method on the operator features: extra trees with ``trees`` members (none with 0) on the CSV and
    per-sample operator features (their signed ``log1p`` with ``log_features``), optionally with the operator
    shares too, optionally averaged in log space (geometric mean) with xgboost on the same features and/or with
    ``composed`` (``composed_per_sample``: the operator costs summed over the trace)."""

    trees: int
    shares: bool = False
    blend_xgboost: bool = False
    log_features: bool = False
    blend_composed: bool = False

    def features(self) -> list[str]:
        base = LOG_FEATURES if self.log_features else WITH_OPS
        return [*base, *(OP_SHARES if self.shares else [])]


#: candidates of the operator-feature method, the incumbent first; the one reported beside the others
#: (``CHOSEN``) was picked by ``--develop`` on the development split alone (see ``develop``)
CANDIDATES = {
    "extra_trees+ops": Candidate(trees=50),
    "et300+ops": Candidate(trees=300),
    "et300+ops+shares": Candidate(trees=300, shares=True),
    "et300+xgb+ops": Candidate(trees=300, blend_xgboost=True),
    "et300+xgb+ops+shares": Candidate(trees=300, shares=True, blend_xgboost=True),
    "et300+log_ops": Candidate(trees=300, log_features=True),
    "et300+log_ops+shares": Candidate(trees=300, shares=True, log_features=True),
    "composed": Candidate(trees=0, blend_composed=True),
    "et300+log_ops+shares+composed": Candidate(trees=300, shares=True, log_features=True, blend_composed=True),
    "et300+log_ops+composed": Candidate(trees=300, log_features=True, blend_composed=True),
    "et300+xgb+log_ops+shares+composed": Candidate(trees=300, shares=True, blend_xgboost=True, log_features=True,
                                                   blend_composed=True),
}
#: the candidates each ``--develop`` round scored, its incumbent first. Round 1 (features from batches 1 and 2)
#: chose ``et300+log_ops+shares``; round 2, on the corrected features (batches 2, 4 and 8), where ``composed``
#: improved most, adds it and its geometric means with the round-1 choice, the list fixed before the round ran
DEVELOP_ROUNDS = {
    1: ["extra_trees+ops", "et300+ops", "et300+ops+shares", "et300+xgb+ops", "et300+xgb+ops+shares",
        "et300+log_ops", "et300+log_ops+shares"],
    2: ["et300+log_ops+shares", "composed", "et300+log_ops+shares+composed", "et300+log_ops+composed",
        "et300+xgb+log_ops+shares+composed"],
}
#: each round's choice (the lowest development MAPE); the evaluation reports every round's beside the others
CHOSEN_BY_ROUND = {1: "et300+log_ops+shares", 2: "et300+log_ops+composed"}
CHOSEN = CHOSEN_BY_ROUND[max(CHOSEN_BY_ROUND)]
#: the development split: this file, a fixed random half of its families (seed), leave-one-family-out inside
DEV_FILE, DEV_SEED = "RTX 3090 (pt240)", 0


def predict_candidates(train: pd.DataFrame, test: pd.DataFrame, names: list[str]) -> dict[str, np.ndarray]:
    """Predictions of the named candidates for ``test`` after fitting on ``train``; each distinct fit once."""
    fits: dict[tuple[str, int, bool, bool], np.ndarray] = {}

    def fitted(kind: str, trees: int, candidate: Candidate) -> np.ndarray:
        key = (kind, trees, candidate.shares, candidate.log_features)
        if key not in fits:
            columns = candidate.features()
            params = {**REGRESSORS[kind], **({"n_estimators": trees} if kind == "extra_trees" else {})}
            reg = make_regressor(kind, features=columns, **params).fit(train[columns], train["latency_ms"])
            fits[key] = np.asarray(reg.predict(test[columns]), float)
        return fits[key]

    composed: list[np.ndarray] = []  # fitted once, if any candidate asks for it

    def members(c: Candidate) -> list[np.ndarray]:
        if c.blend_composed and not composed:
            composed.append(composed_per_sample(train, test))
        return [*([fitted("extra_trees", c.trees, c)] if c.trees else []),
                *([fitted("xgboost", 0, c)] if c.blend_xgboost else []),
                *(composed if c.blend_composed else [])]

    def geometric_mean(parts: list[np.ndarray]) -> np.ndarray:
        return parts[0] if len(parts) == 1 else np.exp(np.mean(np.log(parts), axis=0))

    return {name: geometric_mean(members(CANDIDATES[name])) for name in names}


def develop(data: pd.DataFrame, candidates: list[str]) -> pd.DataFrame:
    """MAPE of every candidate, leave-one-family-out inside a fixed random half of the families of
    ``DEV_FILE``; the other half and the other files are not read. Returns one row per candidate, with the
    bootstrap interval of its difference to the first candidate (the incumbent)."""
    rows = with_derived_features(data[data["device"] == DEV_FILE])
    families = np.sort(rows["family"].unique())
    dev_families = np.random.default_rng(DEV_SEED).choice(families, size=len(families) // 2, replace=False)
    rows = rows[rows["family"].isin(dev_families)]
    print(f"development split: {DEV_FILE}, {len(dev_families)} of {len(families)} families "
          f"(seed {DEV_SEED}), {len(rows)} rows")
    pred = pd.DataFrame(index=rows.index, columns=candidates, dtype=float)
    for family in sorted(dev_families):
        test_mask = (rows["family"] == family).to_numpy()
        for name, p in predict_candidates(rows[~test_mask], rows[test_mask], candidates).items():
            pred.loc[rows.index[test_mask], name] = p
    errors = (pred.div(rows["latency_ms"], axis=0) - 1).abs() * 100
    incumbent = candidates[0]
    table = pd.DataFrame({"candidate": candidates, "dev_mape": errors.mean().to_numpy(),
                          "dev_family_median": errors.groupby(rows["family"]).mean().median().to_numpy()})
    low, high = zip(*(paired_interval(errors[n] - errors[incumbent], rows["family"]) for n in candidates))
    return table.assign(**{f"minus_{incumbent}": table["dev_mape"] - table["dev_mape"].iloc[0],
                           "interval_5%": low, "interval_95%": high})


def paired_interval(difference: pd.Series, families: pd.Series, draws: int = 2000) -> tuple[float, float]:
    """5 and 95 % points of the pooled mean of a per-row difference under a bootstrap over families."""
    by_family = difference.groupby(families).agg(["sum", "size"])
    picks = np.random.default_rng(DEV_SEED).integers(0, len(by_family), size=(draws, len(by_family)))
    means = by_family["sum"].to_numpy()[picks].sum(axis=1) / by_family["size"].to_numpy()[picks].sum(axis=1)
    return float(np.quantile(means, 0.05)), float(np.quantile(means, 0.95))


def composed_per_sample(train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """perfzoo's composed regressor on step times and step operator totals, returned per sample."""
    def frame(rows: pd.DataFrame) -> pd.DataFrame:
        return rows[list(OP_FEATURES)].assign(is_training=0.0, **{OP_ERROR_COLUMN: ""})

    # no model_id for the inner folds here; the operator-trace file records no module calls, so the constant per
    # step is its only per-step term (the figures of bench/RESULTS.md were made with it)
    reg = make_regressor("composed", group_col=None, shrinkage=0.0, step_terms=(), constant_overhead=True)
    reg.fit(frame(train), train["latency_ms"] * train["batch"])
    return np.asarray(reg.predict(frame(test)), float) / test["batch"].to_numpy()


def time_per_flop(train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """One constant time per FLOP (geometric mean over the training rows) times the test FLOPs."""
    per_flop = np.exp(np.mean(np.log(train["latency_ms"] / train["flops"])))
    return per_flop * test["flops"].to_numpy()


def predict_file(rows: pd.DataFrame, regressors: list[str], op_methods: bool = False) -> pd.DataFrame:
    """Leave-one-family-out predictions of every row of one file, one column per method."""
    out = pd.DataFrame(index=rows.index, dtype=float)
    for family in sorted(rows["family"].unique()):
        test_mask = (rows["family"] == family).to_numpy()
        train, test = rows[~test_mask], rows[test_mask]
        y = train["latency_ms"]
        for kind in regressors:
            reg = make_regressor(kind, features=FEATURES, **REGRESSORS[kind]).fit(train[FEATURES], y)
            out.loc[test.index, kind] = reg.predict(test[FEATURES])
        if op_methods:
            for kind in regressors:
                reg = make_regressor(kind, features=WITH_OPS, **REGRESSORS[kind]).fit(train[WITH_OPS], y)
                out.loc[test.index, f"{kind}+ops"] = reg.predict(test[WITH_OPS])
            # composed on its own and each round's choice, composed fitted once for all of them
            names = list(dict.fromkeys(["composed", *CHOSEN_BY_ROUND.values()]))
            for name, p in predict_candidates(train, test, names).items():
                out.loc[test.index, name] = p
        out.loc[test.index, "baseline_flops_nearest_config"] = flops_nearest(train, test, "latency_ms")
        out.loc[test.index, "baseline_time_per_flop"] = time_per_flop(train, test)
        roof = make_regressor("roofline", group_col=None, log_target=True).fit(train, y)
        out.loc[test.index, "baseline_roofline"] = roof.predict(test)
    return out


def summarise(rows: pd.DataFrame, pred: pd.DataFrame) -> dict[str, float]:
    y = rows["latency_ms"].to_numpy()
    summary: dict[str, float] = {"device": rows["device"].iloc[0], "rows": len(rows),
                                 "families": rows["family"].nunique()}
    for method in pred.columns:
        p = pred[method].to_numpy()
        ok = np.isfinite(p)
        summary[method] = mape(y[ok], p[ok])
        per_family = pd.Series(np.abs(p / y - 1) * 100, index=rows.index).groupby(rows["family"]).mean()
        summary[f"{method}_family_median"] = float(per_family.median())
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", default="../shared/data/timm-benchmark", type=Path)
    parser.add_argument("--regressors", nargs="+", default=["linear", "extra_trees"], choices=list(REGRESSORS))
    parser.add_argument("--out", type=Path, default=Path("bench/timm_family.csv"))
    parser.add_argument("--op-features", type=Path, default=None, help="operator features from bench/timm_ops.py")
    parser.add_argument("--part", default="0/1",
                        help="K/N: only every N-th file (sorted by name) from the K-th, a process each; "
                             "concatenate the parts' --out files")
    parser.add_argument("--develop", type=int, nargs="?", const=max(DEVELOP_ROUNDS), default=None,
                        choices=list(DEVELOP_ROUNDS),
                        help="score one round's candidates (default: the last) on the development split only "
                             "(needs --op-features)")
    args = parser.parse_args(argv)
    if args.develop is not None and not args.op_features:
        parser.error("--develop needs --op-features")
    start = time.perf_counter()
    data = with_families(load(args.directory))
    if args.op_features:
        data = with_op_features(data, args.op_features)
    if args.develop is not None:
        table = develop(data, DEVELOP_ROUNDS[args.develop])
        table.to_csv(args.out, index=False)
        print(table.round(2).to_markdown(index=False))
        print(f"\nlowest development MAPE: {table.loc[table['dev_mape'].idxmin(), 'candidate']}; "
              f"{time.perf_counter() - start:.0f} s")
        return 0
    if args.op_features:
        data = with_derived_features(data)
    print(f"{len(data)} rows, {data['family'].nunique()} families, {data['device'].nunique()} files")
    part, parts = (int(v) for v in args.part.split("/"))
    files = sorted(data["device"].unique())[part::parts]
    summaries = [summarise(rows, predict_file(rows, args.regressors, bool(args.op_features)))
                 for _, rows in data[data["device"].isin(files)].groupby("device", sort=True)]
    table = pd.DataFrame(summaries)
    op_methods = [*(f"{kind}+ops" for kind in args.regressors), "composed", *dict.fromkeys(CHOSEN_BY_ROUND.values())]
    op_methods = op_methods if args.op_features else []
    args.regressors = [*args.regressors, *op_methods]
    methods = [*args.regressors, "baseline_flops_nearest_config", "baseline_time_per_flop", "baseline_roofline"]
    table["best_baseline"] = table[[m for m in methods if m.startswith("baseline_")]].min(axis=1)
    ratios = [f"best_baseline / {kind}" for kind in args.regressors]
    for kind, ratio in zip(args.regressors, ratios):
        table[ratio] = table["best_baseline"] / table[kind]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    print(table[["device", "rows", "families", *methods, *ratios]].round(2).to_markdown(index=False))
    print("\nmedian over families of the per-family MAPE:")
    print(table[["device", *[f"{m}_family_median" for m in methods]]].round(2).to_markdown(index=False))
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
