"""Report stage: the tables, figures and HTML page, all regenerated from the pipeline's outputs."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from perfzoo.io import atomic_path, write_text  # noqa: E402

TABLES = ("metrics", "best", "comparison", "family_mape", "family_rmse", "ablation", "feature_importance",
          "hidden_family", "predictions", "gianniti_coefficients", "per_family", "noise_floor", "status_counts")
FIGURES = ("per_family_mape", "actual_vs_predicted", "error_cdf", "feature_importance", "batch_extrapolation",
           "latency_vs_batch", "cv_distribution")
CAPTIONS = {
    "metrics": "Accuracy of every regressor on every split's held-out test rows, with the measurement "
               "noise floor (MAPE of an independent repeat measurement) beside each target.",
    "best": "The lowest-MAPE regressor per target and split.",
    "comparison": "Regressor comparison per target (layout of seed 003 Table 6.5): MAPE [%], RMSE and Kendall "
                  "tau on held-out rows, one column group per split.",
    "family_mape": "MAPE [%] per family and regressor (layout of seed 003 Table 5.2).",
    "family_rmse": "RMSE per family and regressor (layout of seed 003 Table 5.3).",
    "ablation": "Feature ablation (seed 003 Table 6.6): model features only vs model + hardware features.",
    "hidden_family": "Hidden-from-training check: for each family, the best leave-one-family-out regressor's "
                     "prediction of one of its configs with the whole family left out of training, beside the "
                     "measured value.",
    "predictions": "Predictions for the models listed under predict: in the config (value and interval per device).",
    "gianniti_coefficients": "Per-layer linear models t = b0 + b1 * c per layer category, forward and backward "
                             "(layout of the 'Linear Regression Coefficients' slide of seed 004).",
    "feature_importance": "Feature importance of the tree models (mean over the folds of the random split), top 10.",
    "error_cdf": "Cumulative distribution of the absolute relative error per regressor (held-out rows).",
    "batch_extrapolation": "Batch-size extrapolation (seed 004): trained on small batches, predicted for larger "
                           "ones, beside the measured curve.",
    "per_family": "MAPE and RMSE per model family on the held-out rows.",
    "noise_floor": "Measurement noise floor: MAPE of the second independent measurement against the first.",
    "status_counts": "Profiled configs per device and status (ok, oom, error, timeout).",
    "per_family_mape": "MAPE per family of each regressor (held-out test rows; one panel per target and split).",
    "actual_vs_predicted": "Measured vs predicted on held-out rows (log-log), with y = x and ±10 % bands.",
    "latency_vs_batch": "Measured median latency vs batch size, per family (one line per model and mode).",
    "cv_distribution": "Distribution of the coefficient of variation of the measured iterations per config.",
}


def save_figure(fig: Any, path: Path, prov_line: str) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, metadata={"Software": None, "Description": prov_line})
    plt.close(fig)


def plot_per_family_mape(per_family: pd.DataFrame, path: Path, prov: str) -> None:
    panels = sorted(per_family.groupby(["target", "split"]).groups) if len(per_family) else []
    fig, axes = plt.subplots(max(len(panels), 1), 1, figsize=(9, 3.2 * max(len(panels), 1)), squeeze=False)
    for ax, (target, split) in zip(axes[:, 0], panels, strict=False):
        g = per_family[(per_family["target"] == target) & (per_family["split"] == split)]
        wide = g.pivot(index="family", columns="regressor", values="mape").sort_index()
        wide.plot.bar(ax=ax, rot=30, width=0.8)
        ax.set_ylabel("MAPE [%]")
        ax.set_yscale("log")
        ax.set_title(f"{target} · split {split}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, prov)


def plot_actual_vs_predicted(predictions: pd.DataFrame, best: pd.DataFrame, path: Path, prov: str) -> None:
    rows = best.to_dict("records")
    fig, axes = plt.subplots(1, max(len(rows), 1), figsize=(4.2 * max(len(rows), 1), 4.2), squeeze=False)
    for ax, b in zip(axes[0], rows, strict=False):
        g = predictions[(predictions["set"] == "test") & (predictions["target"] == b["target"])
                        & (predictions["regressor"] == b["regressor"]) & (predictions["split"] == b["split"])]
        lo, hi = np.nanmin(g[["y_true", "y_pred"]].to_numpy()), np.nanmax(g[["y_true", "y_pred"]].to_numpy())
        line = np.geomspace(lo * 0.8, hi * 1.25, 50)
        ax.fill_between(line, line * 0.9, line * 1.1, color="0.85", label="±10 %")
        ax.plot(line, line, "k-", lw=0.8, label="y = x")
        for family, f in g.groupby("family"):
            ax.scatter(f["y_true"], f["y_pred"], s=14, label=family)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {b['target']}")
        ax.set_ylabel("predicted")
        ax.set_title(f"{b['regressor']} · {b['split']} · MAPE {b['mape']:.1f} %", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path, prov)


def profiled_rows(data: pd.DataFrame, column: str) -> pd.DataFrame:
    """Rows that carry ``column`` (profiled rows; imported rows have no CI or CV): empty when none do."""
    return data[data[column].notna()] if column in data.columns else data.iloc[0:0].assign(**{column: []})


def plot_latency_vs_batch(data: pd.DataFrame, path: Path, prov: str) -> None:
    data = profiled_rows(data, "latency_ci_lo")
    families = sorted(data["family"].unique())
    cols = 3
    nrows = max(int(np.ceil(len(families) / cols)), 1)
    fig, axes = plt.subplots(nrows, cols, figsize=(12, 3.2 * nrows), squeeze=False)
    for ax, family in zip(axes.ravel(), families, strict=False):
        g = data[data["family"] == family]
        for (label, mode, device), m in g.groupby(["label", "mode", "device"]):
            m = m.sort_values("batch")
            ax.errorbar(m["batch"], m["latency_ms"], yerr=[m["latency_ms"] - m["latency_ci_lo"],
                        m["latency_ci_hi"] - m["latency_ms"]], marker="o" if mode == "inference" else "s",
                        ms=4, lw=1, label=f"{label} {mode[:5]}" + (f" {device}" if data["device"].nunique() > 1 else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(family)
        ax.set_xlabel("batch")
        ax.set_ylabel("latency [ms]")
        ax.legend(fontsize=5)
    for ax in axes.ravel()[len(families):]:
        ax.set_visible(False)
    fig.tight_layout()
    save_figure(fig, path, prov)


def plot_cv_distribution(data: pd.DataFrame, path: Path, prov: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    cv = profiled_rows(data, "cv")["cv"] * 100
    ax.hist(cv, bins=30, color="tab:blue")
    ax.set_xlabel("coefficient of variation of iteration times [%]")
    ax.set_ylabel("configs")
    ax.set_title(f"median CV {np.median(cv):.2f} % over {len(cv)} configs" if len(cv) else "no configs")
    fig.tight_layout()
    save_figure(fig, path, prov)


def plot_error_cdf(errors: pd.DataFrame, path: Path, prov: str) -> None:
    panels = sorted(errors.groupby(["target", "split"]).groups) if len(errors) else []
    n = max(len(panels), 1)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    for ax, (target, split) in zip(axes[0], panels, strict=False):
        g = errors[(errors["target"] == target) & (errors["split"] == split)]
        for regressor, r in g.groupby("regressor"):
            e = np.sort(r["abs_rel_error"].to_numpy() * 100)
            ax.step(e, np.arange(1, len(e) + 1) / len(e), where="post", label=regressor)
        ax.axvline(10, color="0.6", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("absolute relative error [%]")
        ax.set_ylabel("share of predictions")
        ax.set_title(f"{target} · {split}", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path, prov)


def plot_feature_importance(importance: pd.DataFrame, path: Path, prov: str) -> None:
    panels = sorted(importance.groupby(["target", "regressor"]).groups) if len(importance) else []
    n = max(len(panels), 1)
    cols = min(n, 3)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for ax, (target, regressor) in zip(axes.ravel(), panels, strict=False):
        g = importance[(importance["target"] == target) & (importance["regressor"] == regressor)]
        g = g.sort_values("importance")
        ax.barh(g["feature"], g["importance"])
        ax.set_title(f"{target} · {regressor}", fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    save_figure(fig, path, prov)


def plot_batch_extrapolation(predictions: pd.DataFrame, data: pd.DataFrame, path: Path, prov: str) -> None:
    held = predictions[(predictions["split"] == "batch_extrapolation") & (predictions["set"] == "test")
                       & (predictions["target"] == "latency_ms")]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if held.empty:
        ax.text(0.5, 0.5, "split batch_extrapolation not configured or not formable", ha="center", va="center")
        ax.set_axis_off()
    series = held[["model_id", "mode", "device", "label"]].drop_duplicates().head(6).to_dict("records")
    for i, s in enumerate(series):
        color = f"C{i}"
        measured = data[(data["model_id"] == s["model_id"]) & (data["mode"] == s["mode"])
                        & (data["device"] == s["device"])].sort_values("batch")
        ax.plot(measured["batch"], measured["latency_ms"], "o-", color=color, label=f"{s['label']} {s['mode'][:5]}")
        p = held[(held["model_id"] == s["model_id"]) & (held["mode"] == s["mode"]) & (held["device"] == s["device"])]
        for marker, (regressor, r) in zip("x+^v", p.groupby("regressor"), strict=False):
            ax.scatter(r["batch"], r["y_pred"], marker=marker, color=color, s=40,
                       label=f"  {regressor}" if i == 0 else None)
    if series:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("latency [ms]")
        ax.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path, prov)


def _table_html(df: pd.DataFrame) -> str:
    return df.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="–", border=0, classes="t")


def render_index(tables: dict[str, pd.DataFrame], notes: list[str], prov: dict[str, Any]) -> str:
    """The report page: every table and figure with its caption and provenance line."""
    stamp = html.escape(f"code {prov['code_version']} · inputs sha256 in provenance.json")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>perfzoo report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}"
        "table.t{border-collapse:collapse;font-size:12px}table.t td,table.t th{padding:2px 6px;"
        "border-bottom:1px solid #ddd;text-align:right}.prov{color:#777;font-size:11px}"
        "img{max-width:100%}</style></head><body>",
        "<h1>perfzoo report</h1>",
        f"<p class='prov'>{stamp}</p>",
    ]
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    for name in TABLES:
        parts += [f"<h2>{name.replace('_', ' ')}</h2><p>{html.escape(CAPTIONS[name])}</p>",
                  _table_html(tables[name]),
                  f"<p class='prov'>tables/{name}.csv · {html.escape(_short(prov['tables'][name]))}</p>"]
    for name in FIGURES:
        parts += [f"<h2>{name.replace('_', ' ')}</h2><p>{html.escape(CAPTIONS[name])}</p>",
                  f"<img src='figures/{name}.png' alt='{name}'>",
                  f"<p class='prov'>figures/{name}.png · {html.escape(_short(prov['figures'][name]))}</p>"]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _short(inputs: dict[str, str]) -> str:
    return "; ".join(f"{Path(p).name} {h[:12]}" for p, h in sorted(inputs.items()))


def build_report(
    out_dir: Path, data: pd.DataFrame, predictions: pd.DataFrame, metrics: pd.DataFrame,
    per_family: pd.DataFrame, best: pd.DataFrame, noise: pd.DataFrame, statuses: pd.DataFrame,
    ablation: pd.DataFrame, importance: pd.DataFrame, records: pd.DataFrame, coefficients: pd.DataFrame,
    notes: list[str], prov: dict[str, Any],
) -> None:
    """Write tables/*.csv, figures/*.png, provenance.json and index.html under ``out_dir``."""
    from perfzoo.evaluate import comparison_table, error_quantiles, family_table

    tables = {"metrics": metrics, "best": best, "comparison": comparison_table(metrics),
              "family_mape": family_table(per_family, "mape"), "family_rmse": family_table(per_family, "rmse"),
              "ablation": ablation, "feature_importance": importance,
              "hidden_family": hidden_family_table(predictions, best), "predictions": records,
              "gianniti_coefficients": coefficients,
              "per_family": per_family,
              "noise_floor": noise, "status_counts": statuses}
    for name, df in tables.items():
        write_text(out_dir / "tables" / f"{name}.csv", df.to_csv(index=False, float_format="%.6g"))
    line = f"perfzoo {prov['code_version']}"
    figures = out_dir / "figures"
    plot_per_family_mape(per_family, figures / "per_family_mape.png", line)
    plot_actual_vs_predicted(predictions, best, figures / "actual_vs_predicted.png", line)
    plot_error_cdf(error_quantiles(predictions), figures / "error_cdf.png", line)
    plot_feature_importance(importance, figures / "feature_importance.png", line)
    plot_batch_extrapolation(predictions, data, figures / "batch_extrapolation.png", line)
    plot_latency_vs_batch(data, figures / "latency_vs_batch.png", line)
    plot_cv_distribution(data, figures / "cv_distribution.png", line)
    write_text(out_dir / "provenance.json", json.dumps(prov, indent=2, sort_keys=True) + "\n")
    write_text(out_dir / "index.html", render_index(tables, notes, prov))


SOURCES = {
    "metrics": ("metrics", "noise"), "best": ("best",), "per_family": ("per_family",), "noise_floor": ("noise",),
    "comparison": ("metrics",), "family_mape": ("per_family",), "family_rmse": ("per_family",),
    "ablation": ("ablation",), "feature_importance": ("models",), "error_cdf": ("predictions",),
    "hidden_family": ("predictions", "best"), "predictions": ("records",), "gianniti_coefficients": ("gianniti",),
    "batch_extrapolation": ("predictions", "dataset"),
    "status_counts": ("statuses",), "per_family_mape": ("per_family",),
    "actual_vs_predicted": ("predictions", "best"), "latency_vs_batch": ("dataset",),
    "cv_distribution": ("dataset",),
}


def report_provenance(inputs: Any, config_subset: dict[str, Any]) -> dict[str, Any]:
    """Per table and figure: the sha256 of the files it was computed from; plus code and packages."""
    from perfzoo.provenance import code_version, package_versions, sha256_file

    def files(name: str) -> list[str]:
        value = getattr(inputs, name)
        return [value] if isinstance(value, str) else list(value)

    hashes = {name: {str(p): sha256_file(p) for p in files(name)}
              for name in {n for names in SOURCES.values() for n in names}}

    def merged(names: tuple[str, ...]) -> dict[str, str]:
        return {p: h for n in names for p, h in hashes[n].items()}

    return {"code_version": code_version(), "packages": package_versions(), "config": config_subset,
            "tables": {t: merged(SOURCES[t]) for t in TABLES}, "figures": {f: merged(SOURCES[f]) for f in FIGURES}}


def report_notes(statuses: pd.DataFrame, prediction_files: list[str], split_files: list[str] = ()) -> list[str]:
    """Visible notes: failed configs, splits that cannot be formed, excluded labels, skipped folds."""
    from perfzoo.provenance import read_provenance

    notes = [f"{int(r.configs)} config(s) on {r.device} ended with status {r.status}"
             for r in statuses.itertuples() if r.status != "ok"]
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
    from perfzoo.fitting import load_models
    from perfzoo.regressors import feature_importances

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
        for family, g in held.groupby("family", sort=True):
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
