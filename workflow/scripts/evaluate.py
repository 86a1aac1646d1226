"""Rule evaluate: metrics of every prediction file on held-out rows."""
import pandas as pd

from perfzoo.evaluate import best_per_target, metrics_table, per_family_table, with_intervals
from perfzoo.io import read_parquet
from perfzoo.provenance import provenance, write_table
from perfzoo.regressors.baselines import baseline_predictions
from perfzoo.workflow import run_step


def main() -> None:
    files = list(snakemake.input.predictions)
    predictions = with_intervals(pd.concat([read_parquet(p) for p in files], ignore_index=True))
    dataset = read_parquet(snakemake.input.dataset)
    baselines = [baseline_predictions(dataset, read_parquet(s), t)
                 for s in snakemake.input.splits for t in snakemake.params.targets if t in dataset.columns]
    scored = pd.concat([predictions, *[with_intervals(b) for b in baselines if len(b)]], ignore_index=True)
    metrics = metrics_table(scored, read_parquet(snakemake.input.noise))
    prov = provenance([*files, snakemake.input.noise, snakemake.input.dataset, *snakemake.input.splits])
    write_table(snakemake.output.metrics, metrics, prov)
    write_table(snakemake.output.per_family, per_family_table(predictions), prov)
    write_table(snakemake.output.best, best_per_target(metrics), prov)
    write_table(snakemake.output.predictions, predictions, prov)


run_step(snakemake, main)
