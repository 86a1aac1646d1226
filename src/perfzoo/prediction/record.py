"""The result of a prediction: its JSON-ready record, the table of one row per device, and the text the
CLI prints."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.io import write_text
from perfzoo.prediction.quantities import QUANTITIES

#: the quantities of a device block of ``to_text``, with their labels (latency's depends on the mode)
TEXT_LABELS = {
    "latency_ms": "latency (ms)",
    "throughput": "throughput (samples/s)",
    "peak_mem_mb": "peak memory (MB)",
    "mean_power_w": "power (W)",
    "energy_per_sample_j": "energy per sample (J)",
    "edp": "EDP (J·s per step)",
    "cost_per_1k_samples": "cost per 1k samples",
    "carbon_g_per_1k_samples": "carbon per 1k samples (g)",
}


def clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf → None, numpy scalars → Python, tuples → lists, paths → str."""
    if isinstance(obj, Mapping):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | np.ndarray):
        return [clean(v) for v in obj]
    if isinstance(obj, bool | np.bool_):
        return bool(obj)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _float(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _precision_text(model: Mapping[str, Any]) -> str:
    """``precision amp``; a record written before predictions had a precision says so instead of guessing one."""
    return f"precision {model['precision']}" if model.get("precision") else "precision not recorded (older record)"


def _head_lines(r: Mapping[str, Any]) -> list[str]:
    m, f = r["model"], r["features"]
    head = (
        f"perfzoo predict {m['text']}: batch {m['batch']}, input {'x'.join(map(str, m['input_shape']))} "
        f"({m['dtype']}), {m['mode']}, {_precision_text(m)}, objective {r['objective']}"
    )
    where = f.get("featurised_on") or "meta device"  # a record written before the key: the meta device
    summary = (
        f"  features ({where}): {_fmt(_float(f.get('flops')))} FLOPs per step, "
        f"{_fmt(_float(f.get('params')))} parameters, {f.get('n_layers')} layers"
    )
    return [head, summary]


def _device_lines(device: str, entry: Mapping[str, Any], labels: Mapping[str, str]) -> list[str]:
    lines = ["", f"device {device} ({entry['kind']})"]
    if entry.get("missing"):
        return [*lines, f"  missing: {entry['missing']}"]
    lines.append(f"  {'quantity':<27} {'prediction':>11}  {'90% interval':<23} source")
    for key, label in labels.items():
        q = entry["quantities"][key]
        if "missing" in q:
            lines.append(f"  {label:<27} {'missing':>11}  {q['missing']}")
            continue
        interval = "out of range" if q.get("out_of_range") else f"[{_fmt(q['lo'])}, {_fmt(q['hi'])}]"
        lines.append(f"  {label:<27} {_fmt(q['value']):>11}  {interval:<23} {q['source']}")
    mig = entry.get("mig")
    if mig is not None:
        lines.append(f"  {'MIG profile':<27} {mig.get('profile') or 'none'!s:>11}  {mig.get('reason', '')}")
        if mig.get("mig_state"):
            lines.append(f"  {'':<27} {'':>11}  {mig['mig_state']}")
    cap = entry.get("power_cap")
    if cap is not None:
        lines.append(f"  {'power cap (W)':<27} {_fmt(cap.get('power_cap_w')):>11}  {cap.get('reason', '')}")
    return lines


def _recommendation_lines(rec: Mapping[str, Any]) -> list[str]:
    if rec["device"]:
        lines = [
            f"recommended device ({rec['objective']}): {rec['device']}  {rec['metric']} "
            f"{_fmt(rec['value'])} {rec['unit']} [{_fmt(rec['lo'])}, {_fmt(rec['hi'])}]; {rec['reason']}"
        ]
    else:
        lines = [f"recommended device ({rec['objective']}): none; {rec['reason']}"]
    return lines + [f"  excluded {d}: {why}" for d, why in rec["excluded"].items()]


def _score_text(p: Mapping[str, Any]) -> str:
    if p["validation_mape"] is None:
        return "no held-out score"
    return f"MAPE {p['validation_mape']:.3g} % on {p.get('validation_splits') or p['split']}"


def _predictor_lines(r: Mapping[str, Any]) -> list[str]:
    lines = [f"predictors ({r.get('predictor_choice', '')}):"]
    for target, p in r["predictors"].items():
        lines.append(f"  {target:<20} {p['path']} ({_score_text(p)}; sha256 {p['sha256'][:12]}…)")
        lines += [f"  {'':<20} fallback where a feature it uses is missing: {f['path']} ({_score_text(f)}; "
                  f"sha256 {f['sha256'][:12]}…)" for f in p.get("fallbacks", [])]
    lines += [f"  {target:<20} missing: {why}" for target, why in r["missing_targets"].items()]
    if r["warnings"]:
        lines += ["warnings:", *(f"  - {w}" for w in r["warnings"])]
    return lines


@dataclass
class Prediction:
    """A prediction: ``table`` (one row per device), ``recommendation``, ``warnings`` and the full
    JSON-ready ``record`` (with provenance)."""

    record: dict[str, Any]
    table: pd.DataFrame

    @property
    def recommendation(self) -> dict[str, Any]:
        return self.record["recommendation"]

    @property
    def warnings(self) -> list[str]:
        return self.record["warnings"]

    def to_dict(self) -> dict[str, Any]:
        return clean(self.record)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, allow_nan=False)

    def save(self, path: str | Path) -> Path:
        """Write the record as JSON, atomically."""
        write_text(path, self.to_json() + "\n")
        return Path(path)

    def to_text(self) -> str:
        """The table the CLI prints: every device's quantities, the recommendation, the predictors."""
        r = self.record
        labels = dict(TEXT_LABELS)
        if r["model"]["mode"] == "training":
            labels["latency_ms"] = "step time (ms)"
        lines = _head_lines(r)
        for device, entry in r["devices"].items():
            lines += _device_lines(device, entry, labels)
        lines += ["", *_recommendation_lines(r["recommendation"]), *_predictor_lines(r)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def prediction_table(entries: Mapping[str, Any]) -> pd.DataFrame:
    """One row per device: every quantity with its interval and source, MIG profile, power cap, and
    what is missing."""
    rows = []
    for device, entry in entries.items():
        row: dict[str, Any] = {"device": device, "kind": entry["kind"]}
        notes = []
        for key in QUANTITIES:
            q = entry["quantities"][key]
            row[key], row[f"{key}_lo"], row[f"{key}_hi"] = q["value"], q["lo"], q["hi"]
            row[f"{key}_source"] = q.get("source", "missing")
            if "missing" in q:
                notes.append(f"{key}: {q['missing']}")
        mig, cap = entry.get("mig"), entry.get("power_cap")
        row["mig_profile"] = (mig or {}).get("profile")
        row["power_cap_w"] = (cap or {}).get("power_cap_w")
        row["missing"] = "; ".join(notes)
        rows.append(row)
    table = pd.DataFrame(rows)
    for key in QUANTITIES:
        for suffix in ("", "_lo", "_hi"):
            table[key + suffix] = pd.to_numeric(table[key + suffix], errors="coerce").astype(float)
    return table
