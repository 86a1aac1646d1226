rule split:
    """Assign dataset rows to train/val/test per fold of one named, seeded split scheme."""
    input:
        pkg("splits.py"),
        dataset="results/dataset/dataset.parquet",
    output:
        "results/splits/{split}.parquet",
    params:
        splits=config["splits"],
    localrule: True
    log:
        "logs/splits/{split}.log",
    benchmark:
        "benchmarks/splits/{split}.tsv"
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/split.py"
