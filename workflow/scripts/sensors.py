"""Rule sensors_energy_fidelity: energy error of NVML's power.draw / power.draw.instant against an external
meter for every configured sensor run, per GPU × field × alignment × window length, and the figure of
power over time (meter vs both NVML fields)."""
from perfzoo.io import write_json, write_text
from perfzoo.sensors.fidelity import fidelity_table, load_run, plot_meter_vs_nvml, run_folders


def main() -> None:
    from perfzoo.provenance import provenance

    runs = []
    for entry in snakemake.params.runs:  # noqa: F821 - injected by Snakemake
        runs += [load_run(folder, utc_offset_h=float(entry["utc_offset_h"])) for folder in run_folders(entry["path"])]
    out = snakemake.output  # noqa: F821
    table = fidelity_table(runs)
    write_text(out.table, table.to_csv(index=False, float_format="%.4f"))
    plot_meter_vs_nvml(runs, out.png)  # writes the PDF beside the PNG
    prov = provenance(list(snakemake.input.logs), {"sensor_logs": list(snakemake.params.runs)})  # noqa: F821
    write_json(out.provenance, {**prov, "runs": [f"{r.gpu} {r.load}" for r in runs]})


if "snakemake" in globals():
    from perfzoo.workflow import run_step

    run_step(snakemake, main)  # noqa: F821 - injected by Snakemake
