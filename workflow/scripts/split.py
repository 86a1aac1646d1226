"""Rule split: one named, seeded split scheme of the dataset."""
from perfzoo.io import read_parquet
from perfzoo.provenance import provenance, write_table
from perfzoo.dataset.splits import make_split, split_notes
from perfzoo.workflow import run_step


def main() -> None:
    name, cfg = snakemake.wildcards.split, snakemake.params.splits
    data = read_parquet(snakemake.input.dataset)
    notes = split_notes(name, data, cfg)
    write_table(snakemake.output[0], make_split(name, data, cfg),
                provenance([snakemake.input.dataset], {**cfg, "scheme": name, "notes": notes}))


run_step(snakemake, main)
