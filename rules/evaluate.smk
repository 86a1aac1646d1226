rule evaluate:
    """Accuracy metrics per target x regressor x split (and per family) on held-out rows."""
    input:
        pkg("evaluate.py"),
        predictions=prediction_files,
        noise="results/dataset/noise_floor.parquet",
        dataset="results/dataset/dataset.parquet",
        splits=split_files,
    output:
        metrics="results/evaluate/metrics.parquet",
        per_family="results/evaluate/per_family.parquet",
        best="results/evaluate/best.parquet",
        predictions="results/evaluate/predictions.parquet",
    log:
        "logs/evaluate/metrics.log",
    benchmark:
        "benchmarks/evaluate/metrics.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    params:
        targets=TARGETS,
    script:
        "../workflow/scripts/evaluate.py"


rule ablation:
    """Accuracy with model features only vs model + hardware features (Panner Selvam, Table 6.6)."""
    input:
        pkg("ablation.py"),
        dataset="results/dataset/dataset.parquet",
        splits=ablation_split_files,
    output:
        "results/evaluate/ablation.parquet",
    log:
        "logs/evaluate/ablation.log",
    benchmark:
        "benchmarks/evaluate/ablation.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    params:
        targets=TARGETS,
        regressors=config["fit"]["ablation_regressors"],
    script:
        "../workflow/scripts/ablation.py"
