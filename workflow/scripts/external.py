"""Rule import_external: one external measurement table as dataset rows."""
from perfzoo.external import import_external
from perfzoo.provenance import write_table
from perfzoo.workflow import run_step


def main() -> None:
    rows, prov = import_external(snakemake.input.table)
    write_table(snakemake.output[0], rows, prov)


run_step(snakemake, main)
