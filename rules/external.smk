rule import_external:
    """Turn a table of external measurements into dataset rows of kind `external` (source sha256 kept)."""
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
    script:
        "../workflow/scripts/external.py"
