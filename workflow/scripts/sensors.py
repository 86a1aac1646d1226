"""Rule sensors_energy_fidelity: energy error of NVML's power.draw / power.draw.instant against an external
meter for every configured sensor run, per GPU × field × alignment × window length, and the figure of
power over time (meter vs both NVML fields)."""
from pathlib import Path

from perfzoo.io import write_json, write_text
from perfzoo.sensors.fidelity import fidelity_table, find_runs, load_run, plot_meter_vs_nvml


def main() -> None:
    from perfzoo.provenance import provenance

    runs = []
    for entry in snakemake.params.runs:  # noqa: F821 - injected by Snakemake
        root = Path(entry["path"])
        folders = [root] if (root / "gpudata.csv").exists() else find_runs(root)
        runs += [load_run(folder, utc_offset_h=float(entry["utc_offset_h"])) for folder in folders]
    out = snakemake.output  # noqa: F821
    table = fidelity_table(runs)
    write_text(out.table, table.to_csv(index=False, float_format="%.4f"))
    plot_meter_vs_nvml(runs, out.png)  # writes the PDF beside the PNG
    prov = provenance(list(snakemake.input.logs), {"sensor_logs": list(snakemake.params.runs)})  # noqa: F821
    write_json(out.provenance, {**prov, "runs": [f"{r.gpu} {r.load}" for r in runs]})


if "snakemake" in globals():
    from perfzoo.workflow import run_step

    run_step(snakemake, main)  # noqa: F821 - injected by Snakemake
