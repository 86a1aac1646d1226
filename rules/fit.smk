rule fit:
    """Fit one regressor on one target for every fold of one split; predict the held-out rows."""
    input:
        pkg("fitting.py", "regressors.py", "dataset.py", "gianniti.py"),
        dataset="results/dataset/dataset.parquet",
        split="results/splits/{split}.parquet",
        layers=layer_inputs,
    output:
        predictions="results/fit/{target}/{regressor}/{split}.predictions.parquet",
        models="results/fit/{target}/{regressor}/{split}.models.json",
    params:
        grid_search_splits=config["fit"]["grid_search_splits"],
        regressor=regressor_params,
    threads: 1
    localrule: True
    log:
        "logs/fit/{target}/{regressor}/{split}.log",
    benchmark:
        "benchmarks/fit/{target}/{regressor}/{split}.tsv"
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/fit.py"
