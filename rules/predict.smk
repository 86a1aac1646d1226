rule predict:
    """Predict a model listed under `predict:` on every device with the fitted predictors."""
    input:
        pkg("predict.py"),
        dataset="results/dataset/dataset.parquet",
        metrics="results/evaluate/metrics.parquet",
        models=model_files,
        fits=prediction_files,
        hardware=hardware_files,
        model_files=prediction_model_files,
    output:
        "results/predictions/{name}.json",
    log:
        "logs/predictions/{name}.log",
    benchmark:
        "benchmarks/predictions/{name}.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    params:
        spec=prediction_spec,
        config=config,
    script:
        "../workflow/scripts/predict.py"
