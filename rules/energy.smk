# Energy analysis (Grzelka, Measuring Energy Consumption of Deep Learning Workloads) of every cuda device, regenerated from its raw sensor samples:
#   snakemake energy_<device>
from perfzoo.report.registry import outputs as report_outputs, snakemake_report_args

ENERGY_DEVICES = [d for d in DEVICES if config["devices"][d]["kind"] == "cuda"]
# Tables and figures (file, caption, category) come from the registry perfzoo.report.registry.
ENERGY_OUTPUTS = report_outputs(rule="energy")


def energy_targets(wildcards=None):
    """Every output of the energy rules, for ``rule all`` (empty when no device is of kind cuda)."""
    files = [f for o in ENERGY_OUTPUTS for f in (o.file, o.vector_file) if f]
    files.append("results/energy/{device}/provenance.json")
    return [f.format(device=d) for d in ENERGY_DEVICES for f in files]


for _energy_device in ENERGY_DEVICES:

    rule:
        name:
            f"energy_{_energy_device}"
        input:
            pkg("energy.py"),
            manifest="results/zoo/manifest.parquet",
            sensors=expand(f"results/traces/{_energy_device}/{{shard}}.sensors.parquet", shard=SHARDS),
            traces=expand(f"results/traces/{_energy_device}/{{shard}}.parquet", shard=SHARDS),
        output:
            **{
                o.name[len("energy_") :]: report(
                    o.path(_energy_device), **snakemake_report_args(o, _energy_device)
                )
                for o in ENERGY_OUTPUTS
            },
            **{
                f"{o.name[len('energy_'):]}_pdf": o.vector_file.format(device=_energy_device)
                for o in ENERGY_OUTPUTS
                if o.vector_file
            },
            provenance=f"results/energy/{_energy_device}/provenance.json",
        log:
            f"logs/energy/{_energy_device}.log",
        benchmark:
            f"benchmarks/energy/{_energy_device}.tsv"
        localrule: True
        conda:
            "../envs/perfzoo.yaml"
        params:
            device=_energy_device,
        script:
            "../workflow/scripts/energy.py"
