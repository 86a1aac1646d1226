"""The report page (``results/report/index.html``): the answer first, then the trust verdict, then details.

First screen: per predicted model and device, the recommendation and the predicted latency (or step time),
memory, energy and cost with their intervals; a one-paragraph verdict on trust (best error per target beside
the noise floor and baselines, interval coverage, failed and flagged configs); a table of contents. Below,
every registry output (:mod:`perfzoo.report.registry`) under its category, tables folded in ``<details>``.
Columns other stages may not write yet (``baseline_mape``, ``interval_coverage``, ``interference``) are shown
when present and reported as "not computed" when absent. Numbers: 3 significant digits with units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from perfzoo.dataset.build import NOT_MEASURED_STATUS
from perfzoo.evaluate import COVERAGE_BAND, DEFAULT_RESAMPLING_UNIT, RESAMPLING_UNITS, outside_coverage_band
from perfzoo.plotting import quantity_label
from perfzoo.report.registry import CATEGORY_ORDER, REPORT_OUTPUTS, ReportOutput

NOT_COMPUTED = "not computed"
SHOWN = (  # (quantity, column title, unit) of the first screen
    ("latency_ms", "latency", "ms"), ("peak_mem_mb", "peak memory", "MB"),
    ("energy_per_sample_j", "energy per sample", "J"), ("cost_per_1k_samples", "cost per 1000 samples", ""),
)  # fmt: skip
BASELINE_REGRESSORS = ("roofline", "linear")
BASELINE_PREFIX = "baseline:"  # rows of perfzoo.regressors.baselines in the metrics table
COVERAGE_COLUMNS = ("coverage90", "interval_coverage", "coverage")
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
NEAR_NOISE = 1.5  # best MAPE within 1.5x the noise floor counts as "at the noise floor"
NOISE_WARNING_PCT = 10.0  # a noise floor above this many percent is warned about on the first screen
MEMORY_REFERENCE_WARNING = 0.05
"""Relative spread of a device's memory reference (over its rows' shards and its hardware record) above which
the first screen warns: repeats of the reference within one state of the machine agree within 1 %; two states
of one VM differed by 10-35 % (``bench/RESULTS.md``, "Peak-memory labels of the same configs, 90 minutes
apart")."""


def fmt(value: Any, unit: str = "") -> str:
    """A number for people: 3 significant digits, thousands separators, no exponent; missing as an en dash."""
    if value is None or isinstance(value, str):
        return value or "–"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(v):
        return "–"
    if v == 0:
        text = "0"
    elif abs(v) >= 1e6:
        exponent = math.floor(math.log10(abs(v)))
        text = f"{v / 10**exponent:.3g} × 10{str(exponent).translate(SUPERSCRIPT)}"
    else:
        rounded = float(f"{v:.3g}")
        decimals = max(0, 2 - math.floor(math.log10(abs(rounded))))
        text = f"{rounded:,.{decimals}f}"
    return f"{text} {unit}".rstrip() if unit and unit != "%" else text + unit


def fmt_interval(q: dict[str, Any] | None, unit: str) -> tuple[str, str]:
    """(value, interval) strings of a predicted quantity; a missing one gives ("not available", reason)."""
    if not q or "missing" in q or q.get("value") is None or not math.isfinite(q["value"]):
        return "not available", (q or {}).get("missing", "not predicted")
    lo, hi = q.get("lo"), q.get("hi")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return fmt(q["value"], unit), "interval not available"
    return fmt(q["value"], unit), f"{fmt(lo)}–{fmt(hi, unit)}"


@dataclass
class DeviceRow:
    device: str
    recommended: bool
    cells: list[tuple[str, str]]


@dataclass
class PredictionSummary:
    name: str
    model: str
    mode: str
    batch: Any
    recommendation: str
    devices: list[DeviceRow]
    warnings: list[str] = field(default_factory=list)


def prediction_summaries(records: list[dict[str, Any]]) -> list[PredictionSummary]:
    """One summary per record of ``results/predictions/*.json`` (the configured ``predict:`` models)."""
    out = []
    for record in records:
        model = record.get("model", {})
        rec = record.get("recommendation") or {}
        best = rec.get("device")
        if best:
            text = (f"{best}: lowest predicted {quantity_label(rec.get('metric', ''))}, "
                    f"{fmt(rec.get('value'), rec.get('unit', ''))}")
            if rec.get("intervals_overlap"):
                text += f" (interval overlaps {rec.get('runner_up')}'s: ranking uncertain)"
        else:
            text = f"no recommendation: {rec.get('reason', 'no device qualifies')}"
        rows = [DeviceRow(device, device == best,
                          [fmt_interval((entry.get("quantities") or {}).get(q), unit) for q, _, unit in SHOWN])
                for device, entry in (record.get("devices") or {}).items()]
        out.append(PredictionSummary(record.get("name") or model.get("text") or model.get("name", "?"),
                                     model.get("text") or model.get("name", "?"), model.get("mode", ""),
                                     model.get("batch", ""), text, rows, list(record.get("warnings", []))))
    return out


PRIMARY_SPLIT = "random"


def _best_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per target, the lowest-MAPE row of the random split (else of each target's first split)."""
    if metrics.empty or "mape" not in metrics:
        return metrics
    rows = metrics.dropna(subset=["mape"])
    rows = rows[~rows["regressor"].astype(str).str.startswith(BASELINE_PREFIX)]
    first = rows.groupby("target")["split"].transform(lambda s: PRIMARY_SPLIT if (s == PRIMARY_SPLIT).any()
                                                      else sorted(s)[0])
    rows = rows[rows["split"] == first]
    return rows.loc[rows.groupby("target")["mape"].idxmin()].sort_values("target")


def _hardest_text(metrics: pd.DataFrame, target: str) -> str:
    """The split on which even the best regressor errs most (how far the accuracy carries)."""
    rows = metrics[(metrics["target"] == target) & ~metrics["regressor"].astype(str).str.startswith(BASELINE_PREFIX)]
    best_rows = rows.dropna(subset=["mape"])
    if best_rows["split"].nunique() < 2:
        return ""
    best = best_rows.loc[best_rows.groupby("split")["mape"].idxmin()].set_index("split")
    split = best["mape"].idxmax()
    row = best.loc[split].copy()
    row["split"] = split
    return (f"; on the hardest split ({split.replace('_', ' ')}) the best MAPE is {fmt(row['mape'], '%')} "
            f"({row['regressor']}; {_baseline_text(metrics, row)})")


def _baseline_text(metrics: pd.DataFrame, row: pd.Series) -> str:
    if "best_baseline_mape" in metrics and pd.notna(row.get("best_baseline_mape")):
        verdict = "beats" if row["mape"] < row["best_baseline_mape"] else "does NOT beat"
        return f"best baseline ({row['best_baseline']}) {fmt(row['best_baseline_mape'], '%')} ({verdict} it)"
    same = metrics[(metrics["target"] == row["target"]) & (metrics["split"] == row["split"])]
    simple = [f"{r.regressor} {fmt(r.mape, '%')}" for r in same.itertuples() if r.regressor in BASELINE_REGRESSORS]
    text = "baseline MAPE " + NOT_COMPUTED
    return text + (f"; simple regressors on the same split: {', '.join(simple)}" if simple else "")


def _coverage_text(metrics: pd.DataFrame, row: pd.Series) -> str:
    """The measured coverage of the row's 90 % intervals, on how many held-out rows, and whether it lies
    outside the band of a calibrated interval; the reason when it was not measured."""
    column = next((c for c in COVERAGE_COLUMNS if c in metrics), None)
    if column is None or pd.isna(row.get(column)):
        reason = row.get("interval_missing")
        why = f" ({reason})" if isinstance(reason, str) and reason else ""
        return f"interval coverage {NOT_COMPUTED}{why}"
    share = float(row[column]) / (1 if float(row[column]) <= 1 else 100)
    n = pd.to_numeric(row.get("n_interval"), errors="coerce")
    rows = f" of {int(n)}" if pd.notna(n) else ""
    text = f"{fmt(share * 100, '%')}{rows} held-out values inside the 90 % interval"
    if outside_coverage_band(share):
        low, high = COVERAGE_BAND
        text += f", outside the {low:.0%}–{high:.0%} band of a calibrated interval"
    return text


def trust_lines(metrics: pd.DataFrame) -> list[str]:
    """Per target: best error beside the noise floor, the baselines and the interval coverage."""
    lines = []
    for _, row in _best_rows(metrics).iterrows():
        noise = row.get("noise_floor_mape")
        lines.append(_target_line(metrics, row, noise))
    return lines


def _noise_text(mape: float, noise: float, low: float = math.nan, high: float = math.nan) -> str:
    """The noise floor (with its 90 % interval over the repeated pairs, where known) and where ``mape`` lies
    against it."""
    if pd.isna(noise):
        return "noise floor not measured"
    bounds = "" if pd.isna(low) or pd.isna(high) else f" [90 % interval {fmt(low)}–{fmt(high, '%')}]"
    if mape <= NEAR_NOISE * noise:
        level = "at the measurement noise floor"
    elif noise > 0:
        level = f"{fmt(mape / noise)}× the noise floor"
    else:
        level = "repeat measurements agree exactly, so all of the error is the model's"
    return f"noise floor {fmt(noise, '%')}{bounds}, {level}"


UNIT_NAMES = {"family": "families", "model_id": "models"}
"""How the trust lines name the units a MAPE interval resamples (:data:`perfzoo.evaluate.RESAMPLING_UNITS`)."""


def _mape_interval_text(row: pd.Series) -> str:
    """`` [90 % interval lo–hi %, resampling held-out <unit>s]`` of the row's MAPE; empty where not computed."""
    low, high = row.get("mape_lo90"), row.get("mape_hi90")
    if pd.isna(low) or pd.isna(high):
        return ""
    unit = RESAMPLING_UNITS.get(row["split"], DEFAULT_RESAMPLING_UNIT)
    return f" [90 % interval {fmt(low)}–{fmt(high, '%')}, resampling held-out {UNIT_NAMES.get(unit, unit)}]"


def _target_line(metrics: pd.DataFrame, row: pd.Series, noise: float) -> str:
    noise_text = _noise_text(row["mape"], noise, row.get("noise_floor_lo90", math.nan),
                             row.get("noise_floor_hi90", math.nan))
    name = quantity_label(row["target"])
    return (f"{name[:1].upper() + name[1:]}: best MAPE {fmt(row['mape'], '%')}{_mape_interval_text(row)} "
            f"({row['regressor']}, {row['split'].replace('_', ' ')} split); {noise_text}; "
            f"{_baseline_text(metrics, row)}; {_coverage_text(metrics, row)}{_hardest_text(metrics, row['target'])}.")


def health_line(statuses: pd.DataFrame, noise: pd.DataFrame, notes: list[str], n_warnings: int,
                data: pd.DataFrame | None = None) -> str:
    """Failed and interference-flagged configs, a warning for a noisy measurement, the memory reference of
    each device (a warning when it moved), notes and prediction warnings, in one sentence."""
    imported = (statuses["status"] == NOT_MEASURED_STATUS if "status" in statuses
                else pd.Series(False, index=statuses.index))
    not_measured = int(statuses.loc[imported, "configs"].sum()) if imported.any() else 0
    statuses = statuses[~imported]  # the rest are the profiled configs
    total = int(statuses["configs"].sum()) if "configs" in statuses else 0
    failed = int(statuses.loc[statuses["status"] != "ok", "configs"].sum()) if total else 0
    if "flagged" in statuses:
        flag_text = (f"{int(statuses['flagged'].sum())} flagged for interference (of {total} configs; measured "
                     "while the machine was disturbed, left out of fitting)")
    else:
        flag_text = "interference flags " + NOT_COMPUTED
    imported_text = (f"{not_measured} imported config(s) not measured in their table (no time, left out); "
                     if not_measured else "")
    return (f"{failed} of {total} profiled configs failed (oom, error or timeout); {imported_text}{flag_text}; "
            f"{noise_warning(noise)}{memory_reference_text(data)}{len(notes)} note(s) below; "
            f"{n_warnings} prediction warning(s).")


def memory_reference_text(data: pd.DataFrame | None) -> str:
    """Per device, the range of the memory reference its rows were measured with and its hardware record's;
    a warning when they lie more than :data:`MEMORY_REFERENCE_WARNING` apart."""
    if data is None or "memory_reference_mb" not in data.columns:
        return ""
    parts = []
    for device, rows in data.groupby("device", sort=True):
        measured = rows["memory_reference_mb"].dropna()
        if measured.empty:
            continue
        recorded = rows.get("memory_reference_hardware_mb", pd.Series(dtype=float)).dropna()
        values = [float(measured.min()), float(measured.max()), *recorded.head(1).astype(float)]
        spread = (max(values) - min(values)) / min(values)
        text = (f"memory reference on {device}: {fmt(values[0])}-{fmt(values[1])} MB over {len(measured)} rows"
                + (f" (hardware rule: {fmt(values[2])} MB)" if len(values) > 2 else ""))
        if spread > MEMORY_REFERENCE_WARNING:
            text = (f"warning: {text}, {100 * spread:.0f} % apart: its peak-memory labels were measured in "
                    "different states of the machine (the first-touch code a step counts), so a memory error "
                    "may be the machine's")
        parts.append(text + "; ")
    return "".join(parts)


def noise_warning(noise: pd.DataFrame) -> str:
    """A warning for every device and target whose noise floor is above :data:`NOISE_WARNING_PCT`."""
    if not {"device", "target", "noise_mape"} <= set(noise.columns):
        return ""
    high = noise[noise["noise_mape"] > NOISE_WARNING_PCT]
    return "".join(
        f"warning: the {quantity_label(r.target).split(' (')[0]} noise floor on {r.device} is "
        f"{fmt(r.noise_mape, '%')}, above {NOISE_WARNING_PCT:g} %: repeats of one config disagree, so its labels "
        "(and every error measured against them) are unreliable; "
        for r in high.itertuples()
    )


def table_html(df: pd.DataFrame, max_rows: int = 400) -> str:
    """A table with numbers formatted for people (3 significant digits)."""
    if df.empty:
        return f"<p class='na'>empty ({NOT_COMPUTED} or nothing to show)</p>"
    shown = df.head(max_rows)
    formatters = {c: fmt for c in shown.columns if pd.api.types.is_float_dtype(shown[c])}
    text = shown.to_html(index=False, formatters=formatters, na_rep="–", border=0, classes="t", escape=True)
    return text + (f"<p class='prov'>first {max_rows} of {len(df)} rows; all in the CSV</p>" if len(df) > max_rows
                   else "")


@dataclass
class Section:
    entry: ReportOutput
    caption: str
    items: list[dict[str, str]]  # {"title", "html" or "src", "prov"}


def _external_items(workdir: Path, entry: ReportOutput) -> list[dict[str, str]]:
    """Files of an output written by another rule, one per device where the file has a {device}."""
    pattern = entry.file.replace("{device}", "*")
    items = []
    for path in sorted(workdir.glob(pattern)):
        rel = Path("..") / path.relative_to(workdir / "results")
        title = path.parent.name if "{device}" in entry.file else entry.label
        if entry.kind == "figure":
            items.append({"title": title, "src": str(rel), "prov": str(path.relative_to(workdir))})
        else:
            items.append({"title": title, "html": table_html(pd.read_csv(path)), "prov": str(path.relative_to(workdir))})
    return items


def sections(workdir: Path, tables: dict[str, pd.DataFrame], prov: dict[str, Any]) -> dict[str, list[Section]]:
    """Registry outputs grouped by category (in :data:`CATEGORY_ORDER`, then any other)."""
    grouped: dict[str, list[Section]] = {}
    for entry in REPORT_OUTPUTS:
        if entry.rule == "report":
            rel = str(Path(entry.file).relative_to("results/report"))
            hashes = prov.get("tables" if entry.kind == "table" else "figures", {}).get(entry.name, {})
            stamp = f"{rel} · " + "; ".join(f"{Path(p).name} {h[:12]}" for p, h in sorted(hashes.items()))
            item = ({"title": entry.label, "html": table_html(tables[entry.name]), "prov": stamp}
                    if entry.kind == "table" else {"title": entry.label, "src": rel, "prov": stamp})
            items = [item]
        else:
            items = _external_items(workdir, entry)
        grouped.setdefault(entry.category, []).append(Section(entry, entry.caption, items))
    order = [c for c in CATEGORY_ORDER if c in grouped] + [c for c in grouped if c not in CATEGORY_ORDER]
    return {c: grouped[c] for c in order}


def anchor(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower())


TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>perfzoo report</title>
<style>
body{font-family:system-ui,sans-serif;max-width:1180px;margin:auto;padding:0 1em;color:#222}
h1{margin:.4em 0 .1em}h2{border-bottom:1px solid #ccc;margin-top:1.4em}
table.t{border-collapse:collapse;font-size:13px}table.t td,table.t th{padding:2px 8px;border-bottom:1px solid #e4e4e4;
text-align:right;white-space:nowrap}table.t th{background:#f4f4f4}
.rec{background:#e7f4e4;font-weight:600}.iv{color:#666;font-size:11px;display:block}.na{color:#999}
.prov{color:#888;font-size:11px}.verdict{background:#f7f7fb;border-left:4px solid #0072B2;padding:.5em 1em}
.warn{color:#a35a00;font-size:12px}nav ol{columns:3;font-size:14px}figure{margin:1em 0}
figure img{max-width:640px;width:100%}figcaption{font-size:13px;color:#333;max-width:760px}
details{margin:.3em 0}summary{cursor:pointer;font-weight:600}
</style></head><body>
<h1>perfzoo report</h1>
<p class="prov">code {{ prov.code_version }} · inputs sha256 in provenance.json</p>
<h2 id="recommendation">Recommendation</h2>
{% if not summaries %}<p class="na">no model configured under <code>predict:</code>: no recommendation
(predictions {{ not_computed }})</p>{% endif %}
{% for s in summaries %}
<h3>{{ s.model }} · {{ s.mode }} · batch {{ s.batch }}</h3>
<p><b>Recommended: {{ s.recommendation }}</b></p>
<table class="t"><tr><th>device</th>{% for q in shown %}<th>{{ q[1] if not (q[0] == 'latency_ms' and s.mode == 'training')
else 'step time' }}</th>{% endfor %}</tr>
{% for d in s.devices %}<tr{% if d.recommended %} class="rec"{% endif %}><td>{{ d.device }}{% if d.recommended %}
✓{% endif %}</td>{% for value, interval in d.cells %}<td{% if value == 'not available' %} class="na" title="{{ interval }}"
{% endif %}>{{ value }}<span class="iv">{{ interval }}</span></td>{% endfor %}</tr>{% endfor %}
</table>
{% if s.warnings %}<ul class="warn">{% for w in s.warnings %}<li>{{ w }}</li>{% endfor %}</ul>{% endif %}
{% endfor %}
<p class="prov">Values with their prediction interval below; the full record per device (throughput, power,
EDP, carbon, MIG profile, power cap) is in the predictions table and results/predictions/*.json.</p>
<h2 id="trust">Can these numbers be trusted?</h2>
<div class="verdict"><p>{% for line in trust %}{{ line }} {% endfor %}{{ health }}</p></div>
<nav><h2 id="contents">Contents</h2><ol>
<li><a href="#recommendation">Recommendation</a></li><li><a href="#trust">Trust</a></li>
<li><a href="#notes">Notes ({{ notes|length }})</a></li>
{% for category, secs in sections.items() %}<li><a href="#{{ anchor(category) }}">{{ category }}</a><ul>
{% for sec in secs %}<li><a href="#{{ sec.entry.name }}">{{ sec.entry.label }}</a></li>{% endfor %}</ul></li>
{% endfor %}</ol></nav>
<h2 id="notes">Notes</h2>
<details><summary>{{ notes|length }} note(s): failed configs, splits not formed, excluded labels, skipped
folds</summary><ul>{% for n in notes %}<li>{{ n }}</li>{% endfor %}</ul></details>
{% for category, secs in sections.items() %}
<h2 id="{{ anchor(category) }}">{{ category }}</h2>
{% for sec in secs %}<section id="{{ sec.entry.name }}">
{% if sec.entry.kind == 'figure' %}<h3>{{ sec.entry.label }}</h3>
{% for it in sec.items %}<figure><img src="{{ it.src }}" alt="{{ sec.entry.name.replace('_', ' ') }} ({{ it.title }})">
<figcaption>{{ sec.caption }}{% if it.title != sec.entry.label %} ({{ it.title }}){% endif %}
<span class="prov">{{ it.prov }}; vector PDF beside it</span></figcaption></figure>
{% else %}<p class="na">{{ sec.entry.label }}: {{ not_computed }} ({{ sec.entry.file }} absent)</p>{% endfor %}
{% else %}<details><summary>{{ sec.entry.label }}</summary><p>{{ sec.caption }}</p>
{% for it in sec.items %}{% if sec.items|length > 1 %}<h4>{{ it.title }}</h4>{% endif %}{{ it.html|safe }}
<p class="prov">{{ it.prov }}</p>
{% else %}<p class="na">{{ not_computed }} ({{ sec.entry.file }} absent)</p>{% endfor %}</details>{% endif %}
</section>{% endfor %}
{% endfor %}
</body></html>
"""


def render_index(workdir: Path, tables: dict[str, pd.DataFrame], records: list[dict[str, Any]], notes: list[str],
                 prov: dict[str, Any], data: pd.DataFrame | None = None) -> str:
    """The HTML page (see the module docstring)."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    summaries = prediction_summaries(records)
    return env.from_string(TEMPLATE).render(
        prov=prov, summaries=summaries, shown=SHOWN, trust=trust_lines(tables["metrics"]),
        health=health_line(tables["status_counts"], tables["noise_floor"], notes,
                           sum(len(s.warnings) for s in summaries), data),
        notes=notes, sections=sections(workdir, tables, prov), anchor=anchor, not_computed=NOT_COMPUTED,
    )
