"""Rule dataset: labels from raw traces joined with model and hardware features (+ imported rows)."""
import pandas as pd

from perfzoo.dataset import build_dataset
from perfzoo.io import read_parquet
from perfzoo.provenance import provenance, write_table
from perfzoo.workflow import run_step


def main() -> None:
    inputs = snakemake.input
    data, noise, statuses = build_dataset(read_parquet(inputs.manifest), read_parquet(inputs.features),
                                          list(inputs.traces), list(inputs.hardware))
    if inputs.external:
        data = pd.concat([data, *(read_parquet(p) for p in inputs.external)], ignore_index=True)
        data = data.sort_values("row_id").reset_index(drop=True)
    prov = provenance([inputs.manifest, inputs.features, *inputs.traces, *inputs.hardware, *inputs.external])
    write_table(snakemake.output.dataset, data, prov)
    write_table(snakemake.output.noise, noise, prov)
    write_table(snakemake.output.statuses, statuses, prov)


run_step(snakemake, main)
