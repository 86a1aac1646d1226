"""Rule report: tables, figures and index.html under results/report/."""
from pathlib import Path

from perfzoo.io import read_parquet
from perfzoo.report import build_report, report_notes, report_provenance
from perfzoo.workflow import run_step


def main() -> None:
    i = snakemake.input
    tables = {name: read_parquet(getattr(i, name)) for name in
              ("dataset", "predictions", "metrics", "per_family", "best", "noise", "statuses")}
    prov = report_provenance(i, snakemake.params.config_subset)
    build_report(Path(snakemake.output.index).parent, tables["dataset"], tables["predictions"], tables["metrics"],
                 tables["per_family"], tables["best"], tables["noise"], tables["statuses"],
                 report_notes(tables["statuses"], list(i.fits)), prov)


run_step(snakemake, main)
