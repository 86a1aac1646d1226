"""Rule op_times: measured per-operator times of every profiled config, per operator kind."""
from perfzoo.features.op_times import op_time_table
from perfzoo.provenance import provenance, write_table
from perfzoo.workflow import run_step


def main() -> None:
    paths = list(snakemake.input.ops)
    write_table(snakemake.output[0], op_time_table(paths), provenance(paths))


run_step(snakemake, main)
