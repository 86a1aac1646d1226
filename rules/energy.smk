# Energy analysis (seed 002) of every cuda device, regenerated from its raw sensor samples:
#   snakemake energy_<device>
ENERGY_DEVICES = [d for d in DEVICES if config["devices"][d]["kind"] == "cuda"]
ENERGY_TABLES = ["runs", "summary", "fits", "counter_vs_samples", "jitter"]
ENERGY_FIGURES = ["power_over_time", "cumulative_energy", "metrics_vs_limit", "sampling_jitter"]


def energy_targets(wildcards=None):
    """Every output of the energy rules, for ``rule all`` (empty when no device is of kind cuda)."""
    names = [f"{t}.csv" for t in ENERGY_TABLES] + [f"{f}.png" for f in ENERGY_FIGURES] + ["provenance.json"]
    return [f"results/energy/{d}/{name}" for d in ENERGY_DEVICES for name in names]


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
            runs=report(
                f"results/energy/{_energy_device}/runs.csv",
                caption="../report/energy_runs.rst",
                category="Energy",
                subcategory=_energy_device,
                labels={"device": _energy_device, "table": "runs"},
            ),
            summary=report(
                f"results/energy/{_energy_device}/summary.csv",
                caption="../report/energy_summary.rst",
                category="Energy",
                subcategory=_energy_device,
                labels={"device": _energy_device, "table": "mean ± sd per power limit"},
            ),
            fits=report(
                f"results/energy/{_energy_device}/fits.csv",
                caption="../report/energy_fits.rst",
                category="Energy",
                subcategory=_energy_device,
                labels={"device": _energy_device, "table": "quadratic fits"},
            ),
            counter_vs_samples=report(
                f"results/energy/{_energy_device}/counter_vs_samples.csv",
                caption="../report/energy_counter_vs_samples.rst",
                category="Energy",
                subcategory=_energy_device,
                labels={"device": _energy_device, "table": "counter vs samples"},
            ),
            jitter=report(
                f"results/energy/{_energy_device}/jitter.csv",
                caption="../report/energy_jitter.rst",
                category="Energy",
                subcategory=_energy_device,
                labels={"device": _energy_device, "table": "sampling rate"},
            ),
            power_over_time=report(
                f"results/energy/{_energy_device}/power_over_time.png",
                caption="../report/energy_power_over_time.rst",
                category="Energy",
                subcategory=_energy_device,
                labels={"device": _energy_device, "figure": "power over time"},
            ),
            cumulative_energy=report(
                f"results/energy/{_energy_device}/cumulative_energy.png",
                caption="../report/energy_cumulative_energy.rst",
                category="Energy",
                subcategory=_energy_device,
                labels={"device": _energy_device, "figure": "cumulative energy"},
            ),
            metrics_vs_limit=report(
                f"results/energy/{_energy_device}/metrics_vs_limit.png",
                caption="../report/energy_metrics_vs_limit.rst",
                category="Energy",
                subcategory=_energy_device,
                labels={"device": _energy_device, "figure": "energy, time, EDP vs limit"},
            ),
            sampling_jitter=report(
                f"results/energy/{_energy_device}/sampling_jitter.png",
                caption="../report/energy_sampling_jitter.rst",
                category="Energy",
                subcategory=_energy_device,
                labels={"device": _energy_device, "figure": "sampling jitter"},
            ),
            provenance=f"results/energy/{_energy_device}/provenance.json",
        params:
            device=_energy_device,
        localrule: True
        log:
            f"logs/energy/{_energy_device}.log",
        benchmark:
            f"benchmarks/energy/{_energy_device}.tsv"
        conda:
            "../envs/perfzoo.yaml"
        script:
            "../workflow/scripts/energy.py"
