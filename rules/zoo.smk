rule zoo:
    """Expand the configured families into the model-config manifest with stable ids and shards."""
    input:
        pkg("zoo.py"),
    output:
        "results/zoo/manifest.parquet",
    log:
        "logs/zoo/manifest.log",
    benchmark:
        "benchmarks/zoo/manifest.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    params:
        zoo=config["zoo"],
        shards=config["shards"],
    script:
        "../workflow/scripts/zoo.py"
