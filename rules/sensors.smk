# Energy fidelity of NVML's power fields against an external meter, for the runs listed under
# `sensor_logs:` (nothing when the list is empty, the default):
#   snakemake results/sensors/energy_fidelity.csv
from perfzoo.report.registry import by_name as report_output, snakemake_report_args

if SENSOR_RUNS:

    rule sensors_energy_fidelity:
        input:
            pkg("sensors.py"),
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
