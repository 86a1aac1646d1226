rule import_external:
    """Turn a table of external measurements into dataset rows of kind `external` (source sha256 kept). The models
    of every entry's table are featurised first, together, into a cache the other entries' jobs read (their tables
    are read ahead, not inputs: this table's rows do not depend on them)."""
    input:
        pkg("external.py"),
        table=external_table,
        device_map=external_device_map,
    output:
        "results/external/{name}.parquet",
    log:
        "logs/external/{name}.log",
    benchmark:
        "benchmarks/external/{name}.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    threads: 2
    params:
        options=external_options,
        tables=external_tables_ahead,
        feature_cache=EXTERNAL_FEATURE_CACHE,
    script:
        "../workflow/scripts/external.py"
