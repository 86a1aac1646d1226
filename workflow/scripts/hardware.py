"""Rule hardware: identify one device and measure its microbenchmarks."""
from perfzoo.profiling.microbench import describe_device
from perfzoo.io import write_json
from perfzoo.provenance import config_link, provenance
from perfzoo.workflow import run_step


def main() -> None:
    device = snakemake.params.name
    hw = describe_device(device, dict(snakemake.params.device))
    write_json(snakemake.output[0], {**hw, "provenance": provenance([], {"device": snakemake.params.device}, links=config_link(snakemake.config, [f"devices.{device}"]))})


run_step(snakemake, main)
