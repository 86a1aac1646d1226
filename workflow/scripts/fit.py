"""Rule fit: one regressor, one target, every fold of every split (one output pair per split)."""
from pathlib import Path

from perfzoo.fitting import fit_cell, load_models, save_models
from perfzoo.io import read_parquet
from perfzoo.provenance import provenance, write_table
from perfzoo.workflow import run_step


def split_name(path: str) -> str:
    """The split a split file or a fit output belongs to (``random`` for ``.../random.models.json``)."""
    return Path(path).name.split(".")[0]


def main() -> None:
    wc, params = snakemake.wildcards, snakemake.params
    data = read_parquet(snakemake.input.dataset)
    outputs = zip(snakemake.input.splits, snakemake.output.predictions, snakemake.output.models, strict=True)
    for split_path, predictions_path, models_path in outputs:
        split = split_name(split_path)
        assert split == split_name(predictions_path) == split_name(models_path), (split_path, predictions_path)
        reuse = [path for path in snakemake.input.reuse if split_name(path) == split]  # a blend's members' models
        reusable = [model for path in reuse for model in load_models(path)[0].values()]
        predictions, models, notes = fit_cell(data, read_parquet(split_path), split, wc.target, wc.regressor,
                                              params.regressor, params.grid_search_splits, reusable)
        prov = provenance([snakemake.input.dataset, split_path, *snakemake.input.extra, *reuse],
                          {"target": wc.target, "regressor": wc.regressor, "split": split, "notes": notes})
        save_models(models_path, models, prov)
        write_table(predictions_path, predictions, prov)


run_step(snakemake, main)
