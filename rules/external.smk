rule import_external:
    """Turn a table of external measurements into dataset rows of kind `external` (source sha256 kept)."""
    input:
        pkg("external.py", "hardware_specs.py", "features.py", "builders.py"),
        table=external_table,
    output:
        "results/external/{name}.parquet",
    localrule: True
    log:
        "logs/external/{name}.log",
    benchmark:
        "benchmarks/external/{name}.tsv"
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/external.py"
