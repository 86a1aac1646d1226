"""Rule report: tables, figures and index.html under results/report/."""
from pathlib import Path

import pandas as pd

from perfzoo.io import read_parquet
from perfzoo.report import (
    build_report,
    importance_table,
    prediction_records_table,
    report_notes,
    report_provenance,
)
from perfzoo.workflow import run_step


def main() -> None:
    i = snakemake.input
    t = {name: read_parquet(getattr(i, name)) for name in
         ("dataset", "predictions", "metrics", "per_family", "best", "noise", "statuses", "ablation")}
    build_report(Path(snakemake.output.index).parent, t["dataset"], t["predictions"], t["metrics"], t["per_family"],
                 t["best"], t["noise"], t["statuses"], t["ablation"], importance_table(list(i.models)), prediction_records_table(list(i.records)),
                 pd.concat([pd.read_csv(p) for p in i.gianniti]) if i.gianniti else pd.DataFrame(),
                 report_notes(t["statuses"], list(i.fits), list(i.splits)), report_provenance(i, snakemake.params.config_subset))


run_step(snakemake, main)
