"""Rules layers_<device> and gianniti_coefficients: per-layer CPU timings and the coefficients of
Gianniti, Zhang and Ardagna, "Performance Prediction of GPU-based Deep Learning Applications"."""

from perfzoo.regressors.gianniti import coefficient_table
from perfzoo.io import read_parquet, write_text
from perfzoo.profiling.layers import select_layer_configs
from perfzoo.profiling.runner import profile_layer_configs
from perfzoo.provenance import provenance, write_table
from perfzoo.workflow import run_step


def time_layers() -> None:
    params = snakemake.params
    manifest = read_parquet(snakemake.input.manifest)
    configs = select_layer_configs(manifest, params.families, params.max_configs)
    settings = dict(
        params.profiling,
        threads=int(params.device["threads"]),  # the device's setting, whatever --cores gives the job
        num_classes=params.num_classes,
        layer_iters=params.layer_iters,
    )
    table = profile_layer_configs(configs, params.name, settings)
    prov = provenance(
        [snakemake.input.manifest],
        {
            "device": params.device,
            "settings": settings,
            "families": params.families,
            "max_configs": params.max_configs,
            "configs": configs["config_id"].tolist(),
        },
    )
    write_table(snakemake.output.timings, table, prov)


def coefficients() -> None:
    table = coefficient_table(list(snakemake.input.timings), snakemake.input.layers)
    prov = provenance([*snakemake.input.timings, snakemake.input.layers])
    write_table(snakemake.output.table, table, prov)
    write_text(snakemake.output.csv, table.to_csv(index=False, float_format="%.6g"))


run_step(snakemake, time_layers if hasattr(snakemake.output, "timings") else coefficients)
