"""Rule import_external: one external measurement table (perfzoo's long format or timm's) as dataset rows."""
import sys

from perfzoo.dataset.external import ImportOptions, import_external, import_summary, load_device_map
from perfzoo.provenance import write_table
from perfzoo.workflow import run_step


def main() -> None:
    options = dict(snakemake.params.options)
    device_map = options.pop("device_map", None)
    mapping = device_map if isinstance(device_map, dict) else load_device_map(
        snakemake.input.device_map[0] if device_map else None)
    fmt = options.pop("format", "long")
    rows, prov = import_external(snakemake.input.table, options=ImportOptions(
        fmt=fmt, device_map=mapping, workers=snakemake.threads, **options))
    write_table(snakemake.output[0], rows, prov)
    for line in import_summary(rows, snakemake.output[0], prov):
        print(f"import_external: {line}", file=sys.stderr)


run_step(snakemake, main)
