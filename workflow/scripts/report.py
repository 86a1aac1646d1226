"""Rule report: every registry output of the report rule (perfzoo.report.registry) and index.html."""
from pathlib import Path

import pandas as pd

from perfzoo.io import read_parquet
from perfzoo.provenance import read_provenance
from perfzoo.report.html import (
    build_report,
    importance_table,
    mig_recommendation_table,
    prediction_records_table,
    report_notes,
    report_provenance,
    report_tables,
)
from perfzoo.workflow import run_step


def main() -> None:
    i = snakemake.input
    t = {name: read_parquet(getattr(i, name)) for name in
         ("dataset", "predictions", "metrics", "per_family", "best", "noise", "statuses", "ablation")}
    coefficients = pd.concat([pd.read_csv(p) for p in i.gianniti]) if i.gianniti else pd.DataFrame()
    tables = report_tables(t["predictions"], t["metrics"], t["per_family"], t["best"], t["noise"], t["statuses"],
                           t["ablation"], importance_table(list(i.models)), prediction_records_table(list(i.records)),
                           coefficients, mig_recommendation_table(list(i.records)))
    build_report(Path.cwd(), t["dataset"], t["predictions"], tables,
                 report_notes(t["statuses"], list(i.fits), list(i.splits),
                              read_provenance(i.dataset).get("featurised_as")),
                 report_provenance(i, snakemake.params.config_subset), list(i.records), snakemake.threads)


run_step(snakemake, main)
