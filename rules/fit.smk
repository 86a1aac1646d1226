rule fit:
    """Fit one regressor on one target for every fold of every split; predict the held-out rows.

    One job per target and regressor, for all splits: a job's fixed cost (a Python process importing pandas,
    scikit-learn and the regressors) is paid once, not once per split. A blend takes the saved models of its
    members that are regressors of their own (reuse), and those are fitted first (priority)."""
    input:
        pkg("fit.py"),
        dataset="results/dataset/dataset.parquet",
        splits=split_files,
        extra=regressor_input_files,
        reuse=reused_member_files,
    output:
        predictions=expand(
            "results/fit/{{target}}/{{regressor}}/{split}.predictions.parquet",
            split=SPLITS,
        ),
        models=expand("results/fit/{{target}}/{{regressor}}/{split}.models.json", split=SPLITS),
    log:
        "logs/fit/{target}/{regressor}.log",
    benchmark:
        "benchmarks/fit/{target}/{regressor}.tsv"
    priority: fit_priority
    localrule: True
    conda:
        "../envs/perfzoo.yaml"
    threads: 1
    params:
        grid_search_splits=config["fit"]["grid_search_splits"],
        regressor=regressor_params,
    script:
        "../workflow/scripts/fit.py"
