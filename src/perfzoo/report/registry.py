"""The one registry of report outputs: every table and figure with its file, caption, category and sources.

Both ``rules/report.smk`` / ``rules/energy.smk`` (the Snakemake ``report()`` flags, so ``snakemake --report``
carries each output with its caption) and :mod:`perfzoo.report.html` (the HTML page, provenance and tables of
contents) read :data:`REPORT_OUTPUTS`; nothing else lists them.

Adding an output takes one entry here and one caption file:

1. write the caption as one reStructuredText paragraph in ``src/perfzoo/captions/<name>.rst``
   (cite papers by author and title);
2. append ``ReportOutput(name, file, kind, category, label, sources, rule)`` to :data:`REPORT_OUTPUTS`:

   - ``file``: the path under the working directory, with ``{device}`` where there is one file per device;
   - ``kind``: ``"table"`` (CSV) or ``"figure"`` (PNG; a PDF is written beside it with the same stem);
   - ``rule``: ``"report"`` for outputs the report rule writes (their producer goes in
     :func:`perfzoo.report.html.build_report`), or the name of the rule that writes it (``"energy"`` for the
     per-device energy rule, or any other rule: its ``output:`` then uses :func:`snakemake_report_args`);
   - ``sources``: the report rule's input names whose sha256 go into ``provenance.json`` for this output;
3. a figure is a function of tables only: put it in :mod:`perfzoo.plotting`, colours from its palette.

Outputs written by other rules (e.g. ``results/sensors/energy_fidelity.csv``) appear in the HTML page under
their category when the file exists after the run; when it does not, the page says "not computed".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PACKAGE_DATA = ("report/captions",)  # read by perfzoo.depends: rules rerun when a caption changes
CAPTIONS_DIR = Path(__file__).parent / "captions"


@dataclass(frozen=True)
class ReportOutput:
    """One table or figure of the report."""

    name: str
    file: str
    kind: str  # "table" | "figure"
    category: str
    label: str
    sources: tuple[str, ...] = ()
    rule: str = "report"
    caption_of: str | None = None  # share another entry's caption (the same table written by two rules)

    @property
    def caption_file(self) -> Path:
        return CAPTIONS_DIR / f"{self.caption_of or self.name}.rst"

    @property
    def caption(self) -> str:
        """The caption as one line of text (from the caption file, the single place it is written)."""
        return " ".join(self.caption_file.read_text().split())

    def path(self, device: str | None = None) -> str:
        return self.file.format(device=device) if device is not None else self.file

    @property
    def vector_file(self) -> str | None:
        """The PDF written beside a figure's PNG (None for tables)."""
        return self.file[: -len(".png")] + ".pdf" if self.kind == "figure" else None


def _t(name: str, category: str, label: str, *sources: str) -> ReportOutput:
    return ReportOutput(name, f"results/report/tables/{name}.csv", "table", category, label, sources)


def _f(name: str, category: str, label: str, *sources: str, stem: str | None = None) -> ReportOutput:
    return ReportOutput(name, f"results/report/figures/{stem or name}.png", "figure", category, label, sources)


def _energy(name: str, kind: str, label: str) -> ReportOutput:
    ext = "csv" if kind == "table" else "png"
    return ReportOutput(f"energy_{name}", f"results/energy/{{device}}/{name}.{ext}", kind, "Energy", label,
                        rule="energy")


REPORT_OUTPUTS: tuple[ReportOutput, ...] = (
    _t("predictions", "Predictions", "predicted models", "records"),
    _t("mig_recommendation", "Predictions", "MIG recommendation", "records"),
    _t("best", "Accuracy", "best regressor", "best"),
    _t("metrics", "Accuracy", "metrics", "metrics", "noise"),
    _t("comparison", "Accuracy", "regressor comparison", "metrics"),
    _t("family_mape", "Accuracy", "family MAPE", "per_family"),
    _t("family_rmse", "Accuracy", "family RMSE", "per_family"),
    _t("per_family", "Accuracy", "per family", "per_family"),
    _t("ablation", "Accuracy", "feature ablation", "ablation"),
    _t("feature_importance", "Accuracy", "feature importance", "models"),
    _t("hidden_family", "Accuracy", "hidden family check", "predictions", "best"),
    _t("gianniti_coefficients", "Gianniti per-layer models", "layer coefficients (report copy)", "gianniti"),
    ReportOutput("gianniti_coefficients_fit", "results/gianniti/coefficients.csv", "table",
                 "Gianniti per-layer models", "layer coefficients", rule="gianniti_coefficients",
                 caption_of="gianniti_coefficients"),
    _t("noise_floor", "Measurements", "noise floor", "noise"),
    _t("status_counts", "Measurements", "status counts", "statuses"),
    _f("actual_vs_predicted", "Accuracy", "actual vs predicted", "predictions", "best"),
    _f("per_family_mape", "Accuracy", "per-family MAPE", "per_family"),
    _f("error_cdf", "Accuracy", "error CDF", "predictions"),
    _f("feature_importance_figure", "Accuracy", "feature importance", "models", stem="feature_importance"),
    _f("ablation_figure", "Accuracy", "feature ablation", "ablation", stem="ablation"),
    _f("batch_extrapolation", "Accuracy", "batch extrapolation", "predictions", "dataset"),
    _f("latency_vs_batch", "Measurements", "latency vs batch", "dataset"),
    _f("cv_distribution", "Measurements", "CV distribution", "dataset"),
    ReportOutput("sensors_energy_fidelity", "results/sensors/energy_fidelity.csv", "table", "Energy",
                 "NVML vs meter energy error", rule="sensors_energy_fidelity"),
    ReportOutput("sensors_meter_vs_nvml", "results/sensors/meter_vs_nvml.png", "figure", "Energy",
                 "meter vs NVML power", rule="sensors_energy_fidelity"),
    _energy("runs", "table", "runs"),
    _energy("summary", "table", "mean ± sd per power limit"),
    _energy("fits", "table", "quadratic fits"),
    _energy("counter_vs_samples", "table", "counter vs samples"),
    _energy("jitter", "table", "sampling rate"),
    _energy("power_over_time", "figure", "power over time"),
    _energy("cumulative_energy", "figure", "cumulative energy"),
    _energy("metrics_vs_limit", "figure", "energy, time, EDP vs limit"),
    _energy("sampling_jitter", "figure", "sampling jitter"),
)
CATEGORY_ORDER = ("Predictions", "Accuracy", "Measurements", "Energy", "Gianniti per-layer models")


def outputs(rule: str | None = None, kind: str | None = None) -> list[ReportOutput]:
    """Registry entries, optionally of one producing rule and/or kind, in registry order."""
    return [o for o in REPORT_OUTPUTS if (rule is None or o.rule == rule) and (kind is None or o.kind == kind)]


def by_name(name: str) -> ReportOutput:
    for o in REPORT_OUTPUTS:
        if o.name == name:
            return o
    raise KeyError(f"no report output named {name!r}")


def snakemake_report_args(entry: ReportOutput, device: str | None = None) -> dict[str, object]:
    """Keyword arguments of Snakemake's ``report()`` flag for ``entry`` (caption, category, labels)."""
    labels = {entry.kind: entry.label, **({"device": device} if device is not None else {})}
    args: dict[str, object] = {"caption": str(entry.caption_file), "category": entry.category, "labels": labels}
    if device is not None:
        args["subcategory"] = device
    return args
