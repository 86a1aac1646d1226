"""Rule predict: the prediction record of one model listed under `predict:` in the config."""
from perfzoo.prediction import predict_to_file
from perfzoo.workflow import run_step


def main() -> None:
    predict_to_file(snakemake.params.spec, snakemake.output[0], results_dir="results", config=snakemake.params.config)


run_step(snakemake, main)
