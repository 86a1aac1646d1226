rule profile:
    """Measure every config of one shard on one device, each in an isolated worker process."""
    input:
        pkg("profiling", "builders.py", "hardware.py", "stats.py", "zoo.py"),
        manifest="results/zoo/manifest.parquet",
    output:
        traces="results/traces/{device}/{shard}.parquet",
        sensors="results/traces/{device}/{shard}.sensors.parquet",
        meta="results/traces/{device}/{shard}.meta.json",
    params:
        device=device_config,
        profiling=config["profiling"],
        num_classes=config["zoo"]["num_classes"],
        journal="results/traces/{device}/{shard}.journal.jsonl",
    threads: device_threads
    resources:
        attempt=attempt_number,
    log:
        "logs/profile/{device}/{shard}.log",
    benchmark:
        "benchmarks/profile/{device}/{shard}.tsv"
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/profile.py"
