"""Rule zoo: write the model-config manifest."""
from perfzoo.provenance import config_link, provenance, write_table
from perfzoo.workflow import run_step
from perfzoo.models.zoo import expand_zoo, manifest_frame


def main() -> None:
    config = {"zoo": snakemake.params.zoo, "shards": snakemake.params.shards}
    manifest = manifest_frame(expand_zoo(config))
    write_table(snakemake.output[0], manifest, provenance([], config, links=config_link(snakemake.config, ["zoo", "shards"])))


run_step(snakemake, main)
