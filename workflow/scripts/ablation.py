"""Rule ablation: model-only vs model + hardware features, per target, regressor and split."""
import pandas as pd

from perfzoo.fitting import ablation
from perfzoo.io import read_parquet
from perfzoo.provenance import provenance, write_table
from perfzoo.workflow import run_step


def main() -> None:
    data = read_parquet(snakemake.input.dataset)
    splits = [read_parquet(p) for p in snakemake.input.splits]
    tables = [ablation(data, split, target, regressor) for split in splits if len(split)
              for target in snakemake.params.targets for regressor in snakemake.params.regressors]
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    write_table(snakemake.output[0], table, provenance([snakemake.input.dataset, *snakemake.input.splits]))


run_step(snakemake, main)
