rule dataset:
    """Aggregate raw traces into labels (median latency with CI, memory, ...) joined with features."""
    input:
        pkg("dataset.py"),
        unpack(zoo_files),
        traces=trace_files,
        hardware=hardware_files,
        external=external_rows,
    output:
        dataset="results/dataset/dataset.parquet",
        noise="results/dataset/noise_floor.parquet",
        statuses="results/dataset/status_counts.parquet",
    log:
        "logs/dataset/dataset.log",
    benchmark:
        "benchmarks/dataset/dataset.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/dataset.py"
