rule split:
    """Assign dataset rows to train/val/test per fold of one named, seeded split scheme."""
    input:
        pkg("split.py"),
        dataset="results/dataset/dataset.parquet",
    output:
        "results/splits/{split}.parquet",
    log:
        "logs/splits/{split}.log",
    benchmark:
        "benchmarks/splits/{split}.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    params:
        splits=config["splits"],
    script:
        "../workflow/scripts/split.py"
