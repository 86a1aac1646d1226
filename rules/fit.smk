rule fit:
    """Fit one regressor on one target for every fold of one split; predict the held-out rows."""
    input:
        pkg("fit.py"),
        dataset="results/dataset/dataset.parquet",
        split="results/splits/{split}.parquet",
        extra=regressor_input_files,
    output:
        predictions="results/fit/{target}/{regressor}/{split}.predictions.parquet",
        models="results/fit/{target}/{regressor}/{split}.models.json",
    log:
        "logs/fit/{target}/{regressor}/{split}.log",
    benchmark:
        "benchmarks/fit/{target}/{regressor}/{split}.tsv"
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    threads: 1
    params:
        grid_search_splits=config["fit"]["grid_search_splits"],
        regressor=regressor_params,
    script:
        "../workflow/scripts/fit.py"
