# Every output of the report rule comes from the one registry perfzoo.report.registry (file, caption, category).
REPORT_OUTPUTS_OF_REPORT = report_outputs(rule="report")


rule report:
    """Every table and figure of the report, regenerated from the pipeline's outputs."""
    input:
        pkg("report.py"),
        dataset="results/dataset/dataset.parquet",
        statuses="results/dataset/status_counts.parquet",
        noise="results/dataset/noise_floor.parquet",
        metrics="results/evaluate/metrics.parquet",
        per_family="results/evaluate/per_family.parquet",
        best="results/evaluate/best.parquet",
        predictions="results/evaluate/predictions.parquet",
        fits=prediction_files,
        models=model_files,
        splits=split_files,
        records=prediction_records,
        gianniti=gianniti_tables,
        ablation="results/evaluate/ablation.parquet",
        sensors=sensors_targets,
    output:
        **{o.name: report(o.file, **snakemake_report_args(o)) for o in REPORT_OUTPUTS_OF_REPORT},
        **{f"{o.name}_pdf": o.vector_file for o in REPORT_OUTPUTS_OF_REPORT if o.vector_file},
        index="results/report/index.html",
        provenance="results/report/provenance.json",
    log:
        "logs/report/report.log",
    benchmark:
        "benchmarks/report/report.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    threads: 2
    params:
        config_subset={
            "devices": config["devices"],
            "splits": config["splits"],
            "fit": config["fit"],
        },
    script:
        "../workflow/scripts/report.py"
