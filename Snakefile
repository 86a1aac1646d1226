# perfzoo: profile a model zoo on every device, fit predictors, regenerate the report from raw traces.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/zoo.smk"
include: "rules/profile.smk"
include: "rules/layers.smk"
include: "rules/energy.smk"
include: "rules/sensors.smk"
include: "rules/features.smk"
include: "rules/op_times.smk"
include: "rules/external.smk"
include: "rules/dataset.smk"
include: "rules/split.smk"
include: "rules/fit.smk"
include: "rules/evaluate.smk"
include: "rules/predict.smk"
include: "rules/report.smk"


onstart:
    check_slurm_requests()


rule all:
    default_target: True
    input:
        all_targets,
