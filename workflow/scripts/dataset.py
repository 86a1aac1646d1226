"""Rule dataset: labels from raw traces joined with model and hardware features (+ imported rows)."""
import pandas as pd

from perfzoo.dataset.build import build_dataset, imported_only, with_imported_statuses
from perfzoo.io import read_parquet
from perfzoo.provenance import provenance, read_provenance, write_table
from perfzoo.workflow import run_step


def main() -> None:
    inputs = snakemake.input
    external = [read_parquet(p) for p in inputs.external]
    if hasattr(inputs, "manifest"):
        data, noise, statuses = build_dataset(read_parquet(inputs.manifest), read_parquet(inputs.features),
                                              list(inputs.traces), list(inputs.hardware))
        local = [inputs.manifest, inputs.features, *inputs.traces, *inputs.hardware]
    else:  # an import-only config: no zoo, no local device
        data, noise, statuses = imported_only(external)
        external, local = [], []
    if external:
        data = pd.concat([data, *external], ignore_index=True)
        data = data.sort_values("row_id").reset_index(drop=True)
    imports = [read_provenance(p) for p in inputs.external]
    statuses = with_imported_statuses(statuses, [m for record in imports for m in record.get("not_measured", [])])
    prov = provenance([*local, *inputs.external])
    renamed = {old: new for record in imports for old, new in record.get("featurised_as", {}).items()}
    if renamed:  # the report names them
        prov["featurised_as"] = renamed
    write_table(snakemake.output.dataset, data, prov)
    write_table(snakemake.output.noise, noise, prov)
    write_table(snakemake.output.statuses, statuses, prov)


run_step(snakemake, main)
