"""``composed`` with the bytes an operator reads from cache left out of its memory traffic, for several cache
capacities, refitted offline on a finished default run.

    python bench/cache_bytes.py RESULTS [--capacities-mib 2 4 8 16 32] [--user MODEL_FILE:build SHAPE CSV ...]

For each capacity, every (model, mode, batch) of ``RESULTS/zoo/manifest.parquet`` is traced again by the
features stage's own code (:func:`perfzoo.features.meta.featurise_manifest` with the capacity as its
``cache_bytes``), its ``op_<kind>_bytes`` taken as ``bytes_read + bytes_written - bytes_cached`` and, as "no cache",
``bytes_read + bytes_written`` (the aggregates before ``bytes_cached`` existed); ``composed`` is refitted on
every split as the fit rule does and scored as the evaluate rule does (:func:`composed_shrinkage.scores`: test
MAPE %, coverage % of the 90 % intervals in brackets; ``select`` is the mean over family_monte_carlo and
stratified_kfold, the splits a variant is chosen on).

``--user`` adds a user's model measured by ``bench/user_model.py`` (its ``--out`` CSV): ``composed`` and
``memory_sim`` fitted on every row of the run, their errors % against the CSV's measured medians per config.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from composed_shrinkage import SELECTION_SPLITS, SPLITS, scores, with_module_calls  # noqa: E402

from perfzoo.features.ops import op_aggregates  # noqa: E402
from perfzoo.config import load_config  # noqa: E402
from perfzoo.features.meta import featurise, featurise_manifest  # noqa: E402
from perfzoo.features.op_kinds import OP_FEATURE_KINDS  # noqa: E402
from perfzoo.fitting import build_regressor, regressor_inputs  # noqa: E402

KEYS = ["model_id", "mode", "batch"]
OP_COLUMNS = list(OP_FEATURE_KINDS)


def traced(results: Path, capacity: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The operator tables of every config of the run, ``bytes_cached`` for a cache of ``capacity`` bytes, and
    the model table featurised by the current code."""
    classes = load_config(results.parent / "config.yaml")["zoo"]["num_classes"]
    tables: list[pd.DataFrame] = []
    models, _ = featurise_manifest(pd.read_parquet(results / "zoo" / "manifest.parquet"), num_classes=classes,
                                   progress=False, op_tables=tables, cache_bytes=capacity)
    return pd.concat(tables, ignore_index=True), models


def with_current_columns(data: pd.DataFrame, models: pd.DataFrame) -> pd.DataFrame:
    """``data`` with the model columns it lacks (added to the features stage since the run) from ``models``."""
    missing = [c for c in models.columns if c not in data.columns]
    return data.merge(models[[*KEYS, *missing]], on=KEYS, how="left", validate="many_to_one") if missing else data


def aggregates(table: pd.DataFrame, cached: bool) -> pd.DataFrame:
    """``op_<kind>_flops/bytes/count`` per config (the features stage's :func:`perfzoo.features.ops.op_aggregates`);
    without ``cached``, every byte read counts as moved (the aggregates before ``bytes_cached``)."""
    table = table if cached else table.assign(bytes_cached=0)
    return pd.DataFrame([{**dict(zip(KEYS, key, strict=True)), **op_aggregates(rows)}
                         for key, rows in table.groupby(KEYS, sort=True)])


def with_ops(data: pd.DataFrame, ops_table: pd.DataFrame) -> pd.DataFrame:
    return data.drop(columns=OP_COLUMNS, errors="ignore").merge(ops_table, on=KEYS, how="left",
                                                                validate="many_to_one")


def score_row(results: Path, data: pd.DataFrame, splits: tuple[str, ...]) -> dict[str, str]:
    table = scores(results, {}, splits, data)
    cells = {s: f"{table.loc[s, 'mape']:.1f} [{100 * table.loc[s, 'coverage90']:.0f}]" for s in splits}
    if set(SELECTION_SPLITS) <= set(splits):
        cells["select"] = f"{table.loc[list(SELECTION_SPLITS), 'mape'].mean():.2f}"
    return cells


def load_build(spec: str):  # noqa: ANN201 - a user's builder
    path, _, name = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("user_model", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, name or "build")


def user_errors(data: pd.DataFrame, spec: str, shape: tuple[int, ...], csv: Path, cached: bool) -> dict[str, str]:
    """Errors % of composed and memory_sim fitted on every row of ``data`` on the user's measured configs."""
    measured = pd.read_csv(csv)
    build, tables, rows = load_build(spec), [], []
    for config in measured.itertuples():
        features, _ = featurise(build, shape, int(config.batch), config.mode, "float32", "user", op_tables=tables)
        rows.append(features)
    features = pd.DataFrame(rows).assign(device="cpu", is_training=lambda f: (f["mode"] == "training") * 1.0)
    features = with_ops(features, aggregates(pd.concat(tables, ignore_index=True), cached))
    out = {}
    for regressor, target in (("composed", "latency_ms"), ("memory_sim", "peak_mem_mb")):
        rows_ = data[np.isfinite(data[target])]
        model = build_regressor(regressor).fit(regressor_inputs(rows_, "all", True), rows_[target])
        predicted = model.predict(regressor_inputs(features, "all", True))
        truth = measured[f"meas_{target}"].to_numpy(float)
        errors = 100 * (predicted - truth) / truth
        out[regressor] = f"{np.abs(errors).mean():.1f} {np.round(errors).astype(int).tolist()}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--capacities-mib", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--splits", nargs="+", default=list(SPLITS))
    parser.add_argument("--user", nargs=3, action="append", default=[], metavar=("MODEL", "SHAPE", "CSV"),
                        help="a user's model file:function, its input shape (e.g. 12,256), its bench/user_model.py CSV")
    args = parser.parse_args()
    data = with_module_calls(args.results, pd.read_parquet(args.results / "dataset" / "dataset.parquet"))
    for column in OP_COLUMNS:  # kinds added since the run: none of its operators is of them
        if column not in data.columns:
            data[column] = 0.0
    rows, users = {}, {}
    for mib in args.capacities_mib:
        table, models = traced(args.results, mib * 2**20)
        data = with_current_columns(data, models)
        variants = {f"{mib} MiB": True} if rows else {"no cache": False, f"{mib} MiB": True}
        for name, cached in variants.items():
            scored = with_ops(data, aggregates(table, cached))
            rows[name] = score_row(args.results, scored, tuple(args.splits))
            for spec, shape, csv in args.user:
                users[(Path(spec.partition(":")[0]).stem, name)] = user_errors(
                    scored, spec, tuple(int(v) for v in shape.split(",")), Path(csv), cached)
        print(pd.DataFrame(rows).T.to_string(), flush=True)
    if users:
        print(pd.DataFrame(users).T.to_string())


if __name__ == "__main__":
    main()
