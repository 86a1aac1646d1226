"""Rule fit: one regressor, one target, every fold of one split."""
from perfzoo.fitting import fit_split, save_models, skipped_fit, unsupported_reason
from perfzoo.io import read_parquet
from perfzoo.provenance import provenance, write_table
from perfzoo.workflow import run_step


def main() -> None:
    wc = snakemake.wildcards
    data, split = read_parquet(snakemake.input.dataset), read_parquet(snakemake.input.split)
    if reason := unsupported_reason(wc.regressor, wc.target, snakemake.params.regressor):
        predictions, models, notes = skipped_fit(reason)
    elif wc.regressor == "xgboost_grid" and wc.split not in snakemake.params.grid_search_splits:
        predictions, models, notes = skipped_fit(f"grid search runs on splits {snakemake.params.grid_search_splits}")
    else:
        predictions, models, notes = fit_split(data, split, wc.target, wc.regressor, snakemake.params.regressor)
    prov = provenance([snakemake.input.dataset, snakemake.input.split, *snakemake.input.extra],
                      {"target": wc.target, "regressor": wc.regressor, "split": wc.split, "notes": notes})
    save_models(snakemake.output.models, models, prov)
    write_table(snakemake.output.predictions, predictions, prov)


run_step(snakemake, main)
