"""Rule split: one named, seeded split scheme of the dataset."""
from perfzoo.io import read_parquet
from perfzoo.provenance import provenance, write_table
from perfzoo.splits import make_split
from perfzoo.workflow import run_step


def main() -> None:
    table = make_split(snakemake.wildcards.split, read_parquet(snakemake.input.dataset), snakemake.params.splits)
    write_table(snakemake.output[0], table, provenance([snakemake.input.dataset], snakemake.params.splits))


run_step(snakemake, main)
