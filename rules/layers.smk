# Per-layer forward/backward timings on the CPU devices, for the per-layer models of Gianniti et al.:
#   snakemake layers_<device>          time the layers of a sample of the zoo on that CPU device
#   snakemake gianniti_coefficients    Gianniti et al.'s coefficient table, per timed device
LAYER_DEVICES = CPU_DEVICES


for _device in LAYER_DEVICES:

    rule:
        name:
            f"layers_{_device}"
        input:
            pkg("layers.py"),
            manifest="results/zoo/manifest.parquet",
        output:
            timings=f"results/layers/{_device}.parquet",
        log:
            f"logs/layers/{_device}.log",
        benchmark:
            f"benchmarks/layers/{_device}.tsv"
        conda:
            "../envs/perfzoo.yaml"
        threads: quiet_threads(_device)
        resources:
            **device_resources(_device),
            runtime=runtime_for_attempt(_device),
        params:
            name=_device,
            device=config["devices"][_device],
            profiling=config["profiling"],
            num_classes=config["zoo"]["num_classes"],
            families=config["fit"].get("gianniti_families", []),
            max_configs=config["fit"].get("gianniti_max_configs", 24),
            layer_iters=config["fit"].get("gianniti_layer_iters", 10),
        script:
            "../workflow/scripts/layers.py"


# File, caption and category from the registry perfzoo.report_outputs.
from perfzoo.report.registry import by_name as report_output, snakemake_report_args

GIANNITI_TABLE = report_output("gianniti_coefficients_fit")


rule gianniti_coefficients:
    """Per-category linear models t = b0 + b1 * c of layer time on Gianniti et al.'s complexity."""
    input:
        pkg("layers.py"),
        timings=expand("results/layers/{device}.parquet", device=LAYER_DEVICES),
        layers="results/features/layers.parquet",
    output:
        table="results/gianniti/coefficients.parquet",
        csv=report(
            GIANNITI_TABLE.file,
            **snakemake_report_args(GIANNITI_TABLE),
        ),
    log:
        "logs/gianniti/coefficients.log",
    benchmark:
        "benchmarks/gianniti/coefficients.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/layers.py"
