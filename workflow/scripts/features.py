"""Rule features: featurise every (model, mode, batch) of the manifest on the meta device."""
from perfzoo.features.meta import featurise_manifest
from perfzoo.features.ops import op_table
from perfzoo.io import read_parquet
from perfzoo.provenance import config_link, provenance, write_table
from perfzoo.workflow import run_step


def main() -> None:
    manifest = read_parquet(snakemake.input.manifest)
    op_tables: list = []
    models, layers = featurise_manifest(manifest, snakemake.params.num_classes,
                                        optimizer=snakemake.params.optimizer, op_tables=op_tables,
                                        workers=snakemake.threads)
    prov = provenance([snakemake.input.manifest, *snakemake.input.model_files],
                      links=config_link(snakemake.config, ["zoo.num_classes", "profiling.optimizer"]))
    write_table(snakemake.output.models, models, prov)
    write_table(snakemake.output.layers, layers, prov)
    write_table(snakemake.output.ops, op_table(op_tables), prov)


run_step(snakemake, main)
