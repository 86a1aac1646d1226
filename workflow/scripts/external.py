"""Rule import_external: one external measurement table (perfzoo's long format or timm's) as dataset rows."""
import sys

from perfzoo.dataset.external import entry_options, featurise_tables, import_external, import_summary
from perfzoo.provenance import write_table
from perfzoo.workflow import run_step


def main() -> None:
    device_map = (snakemake.input.device_map or [None])[0]
    options = entry_options(snakemake.params.options, device_map, snakemake.threads, snakemake.params.feature_cache)
    for why in featurise_tables(snakemake.params.tables, options):  # every table's models at once, shared
        print(f"import_external: not featurised ahead (its own import reports it): {why}", file=sys.stderr)
    rows, prov = import_external(snakemake.input.table, options=options)
    write_table(snakemake.output[0], rows, prov)
    for line in import_summary(rows, snakemake.output[0], prov):
        print(f"import_external: {line}", file=sys.stderr)


run_step(snakemake, main)
