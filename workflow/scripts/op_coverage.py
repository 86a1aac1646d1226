"""Rule op_coverage: per held-out family, the share of its measured step in operator kinds seen in training."""
from perfzoo.features.op_times import family_coverage
from perfzoo.io import read_parquet
from perfzoo.provenance import provenance, write_table
from perfzoo.workflow import run_step


def main() -> None:
    inputs = snakemake.input
    table = family_coverage(read_parquet(inputs.op_times), read_parquet(inputs.split), read_parquet(inputs.dataset))
    write_table(snakemake.output[0], table, provenance([inputs.op_times, inputs.split, inputs.dataset]))


run_step(snakemake, main)
