rule zoo:
    """Expand the configured families into the model-config manifest with stable ids and shards."""
    input:
        pkg("zoo.py", "builders.py", "config.py"),
    output:
        "results/zoo/manifest.parquet",
    params:
        zoo=config["zoo"],
        shards=config["shards"],
    localrule: True
    log:
        "logs/zoo/manifest.log",
    benchmark:
        "benchmarks/zoo/manifest.tsv"
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/zoo.py"
