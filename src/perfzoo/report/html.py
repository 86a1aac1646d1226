"""Report stage: the tables, figures and HTML page, all regenerated from the pipeline's outputs.

Which outputs exist, their files and captions: :mod:`perfzoo.report.registry` (the one registry). The figures:
:mod:`perfzoo.report.figures`. The page: :mod:`perfzoo.report.page`.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from perfzoo.evaluate import comparison_table, error_quantiles, family_table
from perfzoo.fitting import load_models
from perfzoo.io import read_json, write_text
from perfzoo.plotting import save_figure
from perfzoo.provenance import code_version, package_versions, read_provenance, sha256_file
from perfzoo.regressors import feature_importances
from perfzoo.report import figures
from perfzoo.report.page import render_index
from perfzoo.report.registry import outputs

def report_tables(
    predictions: pd.DataFrame, metrics: pd.DataFrame, per_family: pd.DataFrame, best: pd.DataFrame,
    noise: pd.DataFrame, statuses: pd.DataFrame, ablation: pd.DataFrame, importance: pd.DataFrame,
    records: pd.DataFrame, coefficients: pd.DataFrame, mig: pd.DataFrame,
) -> dict[str, pd.DataFrame]:
    """Every table of the report rule (registry names of :mod:`perfzoo.report.registry`)."""
    return {"metrics": metrics, "best": best, "comparison": comparison_table(metrics),
            "family_mape": family_table(per_family, "mape"), "family_rmse": family_table(per_family, "rmse"),
            "ablation": ablation, "feature_importance": importance,
            "hidden_family": hidden_family_table(predictions, best), "predictions": records,
            "mig_recommendation": mig, "gianniti_coefficients": coefficients, "per_family": per_family,
            "noise_floor": noise, "status_counts": statuses}


FigureInputs = tuple[dict[str, pd.DataFrame], pd.DataFrame, pd.DataFrame]  # tables, dataset, held-out predictions

#: how each figure of the report rule is drawn from the tables, the dataset and the held-out predictions
FIGURE_DRAWERS: dict[str, Callable[[dict[str, pd.DataFrame], pd.DataFrame, pd.DataFrame], Figure]] = {
    "actual_vs_predicted": lambda tables, data, predictions: figures.actual_vs_predicted(predictions, tables["best"]),
    "per_family_mape": lambda tables, data, predictions: figures.per_family_mape(tables["per_family"]),
    "error_cdf": lambda tables, data, predictions: figures.error_cdf(error_quantiles(predictions)),
    "feature_importance_figure": lambda tables, data, predictions: figures.feature_importance(
        tables["feature_importance"]),
    "ablation_figure": lambda tables, data, predictions: figures.ablation(tables["ablation"]),
    "batch_extrapolation": lambda tables, data, predictions: figures.batch_extrapolation(predictions, data),
    "latency_vs_batch": lambda tables, data, predictions: figures.latency_vs_batch(data),
    "cv_distribution": lambda tables, data, predictions: figures.cv_distribution(data),
}


def _draw_and_save(inputs: FigureInputs, workdir: Path, line: str, name: str, file: str) -> None:
    """Draw figure ``name`` from ``inputs`` and write it (PNG and PDF) to ``file`` under ``workdir``."""
    save_figure(FIGURE_DRAWERS[name](*inputs), workdir / file, line)


def save_report_figures(inputs: FigureInputs, workdir: Path, line: str, workers: int = 1) -> None:
    """Draw and write every figure of the report rule, in ``workers`` processes forked from this one (each
    figure's files are what one process writes; drawing and rasterising is most of the report rule's time)."""
    entries = outputs(rule="report", kind="figure")
    names, files = [e.name for e in entries], [e.file for e in entries]
    draw = partial(_draw_and_save, inputs, workdir, line)
    if workers <= 1:
        list(map(draw, names, files))
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        list(pool.map(draw, names, files))


def build_report(
    workdir: Path, data: pd.DataFrame, predictions: pd.DataFrame, tables: dict[str, pd.DataFrame],
    notes: list[str], prov: dict[str, Any], record_paths: list[str] = (), workers: int = 1,
) -> None:
    """Write every registry output of the report rule, provenance.json and index.html (paths under ``workdir``);
    the figures in ``workers`` processes."""
    for entry in outputs(rule="report", kind="table"):
        write_text(workdir / entry.file, tables[entry.name].to_csv(index=False, float_format="%.6g"))
    save_report_figures((tables, data, predictions), workdir, f"perfzoo {prov['code_version']}", workers)
    out_dir = workdir / "results/report"
    write_text(out_dir / "provenance.json", json.dumps(prov, indent=2, sort_keys=True) + "\n")
    records = [{"name": Path(p).stem, **read_json(p)} for p in sorted(record_paths)]
    write_text(out_dir / "index.html", render_index(workdir, tables, records, notes, prov, data))


def report_provenance(inputs: Any, config_subset: dict[str, Any]) -> dict[str, Any]:
    """Per table and figure: the sha256 of the files it was computed from; plus code and packages."""
    def files(name: str) -> list[str]:
        value = getattr(inputs, name)
        return [value] if isinstance(value, str) else list(value)

    entries = outputs(rule="report")
    hashes = {name: {str(p): sha256_file(p) for p in files(name)} for name in {n for o in entries for n in o.sources}}

    def merged(names: tuple[str, ...]) -> dict[str, str]:
        return {p: h for n in names for p, h in hashes[n].items()}

    return {"code_version": code_version(), "packages": package_versions(), "config": config_subset,
            "tables": {o.name: merged(o.sources) for o in entries if o.kind == "table"},
            "figures": {o.name: merged(o.sources) for o in entries if o.kind == "figure"}}


#: how many of the imported models featurised under another name a report note names (the import log has all)
RENAMED_NAMED = 10


def report_notes(statuses: pd.DataFrame, prediction_files: list[str], split_files: list[str] = (),
                 featurised_as: dict[str, str] | None = None) -> list[str]:
    """Visible notes: failed configs, imported models featurised under the name timm gives them now (the
    dataset's ``featurised_as`` provenance), splits that cannot be formed, excluded labels, skipped folds."""
    notes = [f"{int(r.configs)} config(s) on {r.device} ended with status {r.status}"
             for r in statuses.itertuples() if r.status != "ok"]
    if featurised_as:
        pairs = sorted(featurised_as.items())
        named = ", ".join(f"{old} -> {new}" for old, new in pairs[:RENAMED_NAMED])
        left = len(pairs) - RENAMED_NAMED
        more = f", and {left} more (each import's log names them)" if left > 0 else ""
        notes.append(f"{len(pairs)} imported model(s) featurised under the name timm gives them now: {named}{more}")
    for path in sorted(split_files):
        split = read_provenance(path).get("config", {})
        notes += [f"split {split.get('scheme')}: {note}" for note in split.get("notes", [])]
    for path in sorted(prediction_files):
        fit = read_provenance(path).get("config", {})
        info = fit.get("notes", {})
        where = f"{fit.get('target')}/{fit.get('regressor')}/{fit.get('split')}"
        if info.get("excluded_nonfinite_labels"):
            notes.append(f"{where}: {info['excluded_nonfinite_labels']} row(s) with NaN or infinite labels excluded")
        if info.get("excluded_unfeaturised_rows"):
            notes.append(f"{where}: {info['excluded_unfeaturised_rows']} row(s) of "
                         f"{len(info.get('unfeaturised_models', []))} model(s) that could not be featurised excluded")
        for fold, why in sorted(info.get("skipped_folds", {}).items()):
            notes.append(f"{where}: fold {fold} skipped ({why})")
    return notes


TREE_REGRESSORS = ("random_forest", "extra_trees", "xgboost", "xgboost_grid")


def importance_table(model_files: list[str], top: int = 10) -> pd.DataFrame:
    """Mean feature importance over the folds of each tree model of the random split (else the first), top ``top``."""
    rows = []
    tree_files = [p for p in model_files if Path(p).parent.name in TREE_REGRESSORS]
    names = sorted({Path(p).name for p in tree_files})
    chosen = "random.models.json" if "random.models.json" in names else (names[0] if names else "")
    for path in sorted(p for p in tree_files if Path(p).name == chosen):
        models, meta = load_models(path)
        fit = meta.get("config", {})
        if fit.get("regressor") not in ("random_forest", "extra_trees", "xgboost", "xgboost_grid"):
            continue
        series = [s for s in (feature_importances(m) for m in models.values()) if s is not None]
        if not series:
            continue
        mean = pd.concat(series, axis=1).fillna(0).mean(axis=1).sort_values(ascending=False).head(top)
        rows += [{"target": fit["target"], "regressor": fit["regressor"], "split": fit["split"], "feature": f,
                  "importance": float(v)} for f, v in mean.items()]
    return pd.DataFrame(rows, columns=["target", "regressor", "split", "feature", "importance"])


def hidden_family_table(predictions: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """Per family and target: the median-error held-out config of the best leave-one-family-out regressor."""
    lofo = best[best["split"] == "leave_one_family_out"]
    rows = []
    for b in lofo.itertuples():
        held = predictions[(predictions["split"] == b.split) & (predictions["regressor"] == b.regressor)
                           & (predictions["target"] == b.target) & (predictions["set"] == "test")]
        for family, all_rows in held.groupby("family", sort=True):
            g = all_rows[np.isfinite(all_rows["y_pred"].to_numpy(dtype=float))]  # rows lacking a feature: none
            if g.empty:
                rows.append({"target": b.target, "family": family, "regressor": b.regressor,
                             "config": f"none of its {len(all_rows)} held-out configs predicted (a feature the "
                                       "regressor uses is missing)", "mode": "", "batch": None,
                             "measured": np.nan, "predicted": np.nan, "error_pct": np.nan, "family_mape": np.nan})
                continue
            err = (g["y_pred"] - g["y_true"]) / g["y_true"]
            pick = g.loc[(err.abs() - err.abs().median()).abs().idxmin()]
            rows.append({"target": b.target, "family": family, "regressor": b.regressor, "config": pick["label"],
                         "mode": pick["mode"], "batch": int(pick["batch"]), "measured": pick["y_true"],
                         "predicted": pick["y_pred"], "error_pct": float(err.loc[pick.name] * 100),
                         "family_mape": float(err.abs().mean() * 100)})
    return pd.DataFrame(rows)


def prediction_records_table(paths: list[str]) -> pd.DataFrame:
    """One row per (predicted model, device): the point value and interval of every predicted quantity."""
    rows = []
    for path in sorted(paths):
        record = json.loads(Path(path).read_text())
        recommended = (record.get("recommendation") or {}).get("device")
        for device, entry in (record.get("devices") or {}).items():
            row = {"prediction": Path(path).stem, "model": record["model"].get("text") or record["model"].get("name"),
                   "batch": record["model"].get("batch"), "mode": record["model"].get("mode"), "device": device,
                   "recommended": device == recommended, "warnings": len(record.get("warnings", []))}
            for name, q in (entry.get("quantities") or {}).items():
                if isinstance(q, dict) and "value" in q:
                    row.update({name: q["value"], f"{name}_lo": q.get("lo"), f"{name}_hi": q.get("hi")})
            rows.append(row)
    return pd.DataFrame(rows)


MIG_COLUMNS = ["prediction", "model", "device", "gpu", "profile", "reason", "mig_mode", "mig_state"]


def mig_recommendation_table(paths: list[str]) -> pd.DataFrame:
    """One row per (predicted model, device with a MIG entry): the recommended MIG profile or why there is none."""
    rows = []
    for path in sorted(paths):
        record = read_json(path)
        model = record["model"].get("text") or record["model"].get("name")
        for device, entry in (record.get("devices") or {}).items():
            mig = entry.get("mig")
            if isinstance(mig, dict):
                rows.append({"prediction": Path(path).stem, "model": model, "device": device, "gpu": mig.get("gpu"),
                             "profile": mig.get("profile"), "reason": mig.get("reason"),
                             "mig_mode": mig.get("mig_mode"), "mig_state": mig.get("mig_state")})
    return pd.DataFrame(rows, columns=MIG_COLUMNS)
