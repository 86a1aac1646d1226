"""Rule profile: measure one shard on one device; resume from the journal after an interruption."""
from pathlib import Path

from perfzoo.finished import keep_finished
from perfzoo.io import read_json, read_parquet, write_json
from perfzoo.profiling.runner import profile_shard_with_ops, worker_settings
from perfzoo.provenance import config_link, provenance, write_table
from perfzoo.workflow import run_step
from perfzoo.models.zoo import shard_configs


def main() -> None:
    device, shard = snakemake.params.name, snakemake.wildcards.shard
    configs = shard_configs(read_parquet(snakemake.input.manifest), shard)
    device_cfg = dict(snakemake.params.device)
    settings = worker_settings(dict(snakemake.params.profiling), device_cfg, snakemake.params.num_classes)
    journal = Path(snakemake.params.journal)
    result = profile_shard_with_ops(configs, device, device_cfg, settings, journal,
                                    hardware=read_json(snakemake.input.hardware))
    sections = [f"devices.{device}", "profiling", "zoo.num_classes"]
    prov = provenance([snakemake.input.manifest, snakemake.input.hardware, *snakemake.input.model_files],
                      {"device": snakemake.params.device, "profiling": settings},
                      links=config_link(snakemake.config, sections))
    write_table(snakemake.output.sensors, result.sensors, prov)
    write_table(snakemake.output.ops, result.op_times, prov)
    write_json(snakemake.output.meta, {**result.meta, "attempt": snakemake.resources.attempt, "provenance": prov})
    write_table(snakemake.output.traces, result.traces, prov)
    outputs = [snakemake.output.sensors, snakemake.output.ops, snakemake.output.meta, snakemake.output.traces]
    keep_finished(outputs)
    journal.unlink(missing_ok=True)  # the trace file now holds every row; a forced rerun measures afresh


run_step(snakemake, main)
