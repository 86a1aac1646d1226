"""Rule fit: one regressor, one target, every fold of one split."""
from perfzoo.fitting import fit_split, save_models
from perfzoo.io import read_parquet
from perfzoo.provenance import provenance, write_table
from perfzoo.workflow import run_step


def main() -> None:
    wc = snakemake.wildcards
    data, split = read_parquet(snakemake.input.dataset), read_parquet(snakemake.input.split)
    predictions, models, notes = fit_split(data, split, wc.target, wc.regressor)
    prov = provenance([snakemake.input.dataset, snakemake.input.split],
                      {"target": wc.target, "regressor": wc.regressor, "split": wc.split, "notes": notes})
    save_models(snakemake.output.models, models, prov)
    write_table(snakemake.output.predictions, predictions, prov)


run_step(snakemake, main)
