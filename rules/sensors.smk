# Energy fidelity of NVML's power fields against an external meter, for the runs listed under
# `sensor_logs:` (nothing when the list is empty, the default):
#   snakemake results/sensors/energy_fidelity.csv
from perfzoo.report_outputs import by_name as report_output, snakemake_report_args

SENSOR_RUNS = config.get("sensor_logs", [])
SENSOR_FILES = ("gpudata.csv", "PMD_data.bin", "PMD_start_ts.txt", "timestamps.csv")


def sensor_log_files(wildcards=None):
    """Every file of every configured sensor run (so a changed log reruns the rule)."""
    files = []
    for entry in SENSOR_RUNS:
        root = Path(entry["path"])
        folders = (
            [root] if (root / "gpudata.csv").exists() else sorted(p.parent for p in root.rglob("gpudata.csv"))
        )
        files += [str(f / name) for f in folders for name in SENSOR_FILES if (f / name).exists()]
    return files or [entry["path"] for entry in SENSOR_RUNS]


def sensors_targets(wildcards=None):
    """Outputs of the sensors rule, for ``rule all`` (empty when no sensor log is configured)."""
    if not SENSOR_RUNS:
        return []
    return [
        f"results/sensors/{name}"
        for name in ("energy_fidelity.csv", "meter_vs_nvml.png", "meter_vs_nvml.pdf", "provenance.json")
    ]


if SENSOR_RUNS:

    rule sensors_energy_fidelity:
        input:
            pkg("energy.py", "sensors"),
            logs=sensor_log_files,
        output:
            table=report(
                "results/sensors/energy_fidelity.csv",
                **snakemake_report_args(report_output("sensors_energy_fidelity")),
            ),
            png=report(
                "results/sensors/meter_vs_nvml.png",
                **snakemake_report_args(report_output("sensors_meter_vs_nvml")),
            ),
            pdf="results/sensors/meter_vs_nvml.pdf",
            provenance="results/sensors/provenance.json",
        log:
            "logs/sensors/energy_fidelity.log",
        localrule: True
        conda:
            "../envs/perfzoo.yaml"
        params:
            runs=SENSOR_RUNS,
        script:
            "../workflow/scripts/sensors.py"
