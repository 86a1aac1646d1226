"""Rule profile: measure one shard on one device; resume from the journal after an interruption."""
from pathlib import Path

from perfzoo.finished import keep_finished
from perfzoo.io import read_parquet, write_json
from perfzoo.profiling.runner import profile_shard
from perfzoo.provenance import config_link, provenance, write_table
from perfzoo.workflow import run_step
from perfzoo.models.zoo import shard_configs


def main() -> None:
    device, shard = snakemake.params.name, snakemake.wildcards.shard
    configs = shard_configs(read_parquet(snakemake.input.manifest), shard)
    settings = dict(snakemake.params.profiling, threads=snakemake.threads, num_classes=snakemake.params.num_classes)
    journal = Path(snakemake.params.journal)
    traces, sensors, meta = profile_shard(configs, device, dict(snakemake.params.device), settings, journal)
    sections = [f"devices.{device}", "profiling", "zoo.num_classes"]
    prov = provenance([snakemake.input.manifest, *snakemake.input.model_files],
                      {"device": snakemake.params.device, "profiling": settings},
                      links=config_link(snakemake.config, sections))
    write_table(snakemake.output.sensors, sensors, prov)
    write_json(snakemake.output.meta, {**meta, "attempt": snakemake.resources.attempt, "provenance": prov})
    write_table(snakemake.output.traces, traces, prov)
    keep_finished([snakemake.output.sensors, snakemake.output.meta, snakemake.output.traces])
    journal.unlink(missing_ok=True)  # the trace file now holds every row; a forced rerun measures afresh


run_step(snakemake, main)
