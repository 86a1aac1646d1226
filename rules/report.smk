rule report:
    """Every table and figure of the report, regenerated from the pipeline's outputs."""
    input:
        pkg("report.py", "evaluate.py"),
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
    output:
        index="results/report/index.html",
        provenance="results/report/provenance.json",
        metrics=report(
            "results/report/tables/metrics.csv",
            caption="../report/metrics.rst",
            category="Accuracy",
            labels={"table": "metrics"},
        ),
        best=report(
            "results/report/tables/best.csv",
            caption="../report/best.rst",
            category="Accuracy",
            labels={"table": "best regressor"},
        ),
        comparison=report(
            "results/report/tables/comparison.csv",
            caption="../report/comparison.rst",
            category="Accuracy",
            labels={"table": "regressor comparison"},
        ),
        family_mape=report(
            "results/report/tables/family_mape.csv",
            caption="../report/family_mape.rst",
            category="Accuracy",
            labels={"table": "family MAPE"},
        ),
        family_rmse=report(
            "results/report/tables/family_rmse.csv",
            caption="../report/family_rmse.rst",
            category="Accuracy",
            labels={"table": "family RMSE"},
        ),
        ablation=report(
            "results/report/tables/ablation.csv",
            caption="../report/ablation.rst",
            category="Accuracy",
            labels={"table": "feature ablation"},
        ),
        feature_importance=report(
            "results/report/tables/feature_importance.csv",
            caption="../report/feature_importance.rst",
            category="Accuracy",
            labels={"table": "feature importance"},
        ),
        hidden_family=report(
            "results/report/tables/hidden_family.csv",
            caption="../report/hidden_family.rst",
            category="Accuracy",
            labels={"table": "hidden family check"},
        ),
        predictions=report(
            "results/report/tables/predictions.csv",
            caption="../report/predictions.rst",
            category="Predictions",
            labels={"table": "predicted models"},
        ),
        gianniti_coefficients=report(
            "results/report/tables/gianniti_coefficients.csv",
            caption="../report/gianniti_coefficients.rst",
            category="Gianniti per-layer models",
            labels={"table": "layer coefficients (report copy)"},
        ),
        per_family=report(
            "results/report/tables/per_family.csv",
            caption="../report/per_family.rst",
            category="Accuracy",
            labels={"table": "per family"},
        ),
        noise_floor=report(
            "results/report/tables/noise_floor.csv",
            caption="../report/noise_floor.rst",
            category="Measurements",
            labels={"table": "noise floor"},
        ),
        status_counts=report(
            "results/report/tables/status_counts.csv",
            caption="../report/status_counts.rst",
            category="Measurements",
            labels={"table": "status counts"},
        ),
        per_family_mape=report(
            "results/report/figures/per_family_mape.png",
            caption="../report/per_family_mape.rst",
            category="Accuracy",
            labels={"figure": "per-family MAPE"},
        ),
        actual_vs_predicted=report(
            "results/report/figures/actual_vs_predicted.png",
            caption="../report/actual_vs_predicted.rst",
            category="Accuracy",
            labels={"figure": "actual vs predicted"},
        ),
        error_cdf=report(
            "results/report/figures/error_cdf.png",
            caption="../report/error_cdf.rst",
            category="Accuracy",
            labels={"figure": "error CDF"},
        ),
        feature_importance_fig=report(
            "results/report/figures/feature_importance.png",
            caption="../report/feature_importance_figure.rst",
            category="Accuracy",
            labels={"figure": "feature importance"},
        ),
        batch_extrapolation=report(
            "results/report/figures/batch_extrapolation.png",
            caption="../report/batch_extrapolation.rst",
            category="Accuracy",
            labels={"figure": "batch extrapolation"},
        ),
        latency_vs_batch=report(
            "results/report/figures/latency_vs_batch.png",
            caption="../report/latency_vs_batch.rst",
            category="Measurements",
            labels={"figure": "latency vs batch"},
        ),
        cv_distribution=report(
            "results/report/figures/cv_distribution.png",
            caption="../report/cv_distribution.rst",
            category="Measurements",
            labels={"figure": "CV distribution"},
        ),
    params:
        config_subset={
            "devices": config["devices"],
            "splits": config["splits"],
            "fit": config["fit"],
        },
    localrule: True
    log:
        "logs/report/report.log",
    benchmark:
        "benchmarks/report/report.tsv"
    conda:
        "../envs/perfzoo.yaml"
    script:
        "../workflow/scripts/report.py"
