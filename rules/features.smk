rule features:
    """Static model features computed on PyTorch's meta device (no weights allocated), in `threads` processes (the
    tables are the same with one)."""
    input:
        pkg("features.py"),
        manifest="results/zoo/manifest.parquet",
        model_files=MODEL_FILES,
    output:
        models="results/features/models.parquet",
        layers="results/features/layers.parquet",
        ops="results/features/ops.parquet",
    log:
        "logs/features/models.log",
    benchmark:
        "benchmarks/features/models.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    threads: 2
    params:
        num_classes=config["zoo"]["num_classes"],
        optimizer=config["profiling"]["optimizer"],
    script:
        "../workflow/scripts/features.py"
