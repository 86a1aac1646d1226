# Helper and input functions shared by every rule file (no rules here).
import os
import sys
from pathlib import Path

from snakemake.sourcecache import LocalSourceFile


def local_workflow_root():
    """This workflow's repository folder (the parent of rules/) on the local disk, or None.

    ``workflow.basedir`` is the folder of the *main* Snakefile, which is the user's when perfzoo is
    used as a Snakemake ``module``; ``workflow.current_basedir`` is the folder of the file being
    parsed (this one). A module loaded from a remote source (``github(...)``) has no local folder:
    its rules then use the installed perfzoo package.
    """
    basedir = workflow.current_basedir
    if not isinstance(basedir, LocalSourceFile):
        return None
    return Path(basedir.get_path_or_uri(secret_free=True)).parent


WORKFLOW_ROOT = local_workflow_root()
SRC = None if WORKFLOW_ROOT is None else str(WORKFLOW_ROOT / "src")
if SRC is not None and SRC not in sys.path:
    sys.path.insert(0, SRC)  # the rule scripts import the installed package (pip install -e .)

from perfzoo.config import BLEND_MEMBERS, validate_config
from perfzoo.depends import package_files_of
from perfzoo.io import InputError
from perfzoo.models.files import predict_model_files, zoo_model_files
from perfzoo.models.zoo import expand_zoo, shard_names, shard_size

try:  # the schema (defaults filled in) and every check that can fail before a job runs, in one line
    validate_config(config)
except InputError as exc:
    raise WorkflowError(str(exc)) from None

DEVICES = sorted(config["devices"])
ZOO = expand_zoo(config)
MODEL_FILES = zoo_model_files(config)  # python-builder files and the local modules they import
SHARDS = shard_names(len(ZOO), shard_size(config, len(ZOO)))
SPLITS = config["splits"]["schemes"]
TARGETS = config["fit"]["targets"]
REGRESSORS = config["fit"]["regressors"]


wildcard_constraints:
    shard="s[0-9]+",
    split="|".join(SPLITS),
    target="|".join(TARGETS),
    regressor="|".join(REGRESSORS),


def relative_to_workdir(path):
    """``path`` relative to the working directory (with ``..`` where it lies outside), flagged local.

    Rule inputs that name package files must not be absolute: Snakemake records each job's input
    paths, so an absolute path makes a moved or copied workflow folder read as "input files changed"
    and rerun everything. Relative paths stay the same when the folder moves as a whole. ``local``
    keeps a module's ``prefix:`` and a default storage provider from rewriting them.
    """
    return local(os.path.relpath(path, os.getcwd()))


def pkg(script):
    """The package files ``workflow/scripts/<script>`` imports, transitively, so editing one reruns the rule.

    Computed from the script's imports by :func:`perfzoo.depends.package_files_of`, never listed by hand.
    Empty for a module loaded from a remote source, whose package files are not on the local disk.
    """
    if SRC is None:
        return []
    script_path = WORKFLOW_ROOT / "workflow" / "scripts" / script
    return [relative_to_workdir(path) for path in package_files_of(script_path, SRC)]


def device_threads(device):
    return config["devices"][device]["threads"]


SLURM_RESOURCES = {
    "partition": "slurm_partition",
    "account": "slurm_account",
    "qos": "qos",
    "constraint": "constraint",
    "gres": "gres",
    "gpu": "gpu",
    "gpu_model": "gpu_model",
    "mem_mb": "mem_mb",
}


def device_resources(device):
    """The scheduler request of a device's jobs, from its ``slurm:`` entry in the config."""
    request = config["devices"][device].get("slurm", {})
    resources = {SLURM_RESOURCES[k]: v for k, v in request.items() if k in SLURM_RESOURCES}
    resources["cpus_per_task"] = request.get("cpus_per_task", device_threads(device))
    if request.get("exclusive"):
        resources["slurm_extra"] = "'--exclusive'"
    return resources


def runtime_for_attempt(device):
    """Minutes requested: the device's runtime, grown by ``runtime_growth`` per retry."""
    request = config["devices"][device].get("slurm", {})
    base, growth = request.get("runtime", 60), request.get("runtime_growth", 2)

    def runtime(wildcards, attempt):
        return int(base * growth ** (attempt - 1))

    return runtime


def check_slurm_requests():
    """With the slurm executor every device must name its partition."""
    plugin = getattr(workflow, "executor_plugin", None)
    if plugin is None or plugin.name != "slurm":
        return
    for device in DEVICES:
        if not config["devices"][device].get("slurm", {}).get("partition"):
            raise WorkflowError(
                f"devices.{device}.slurm.partition: device {device!r} has no partition, "
                "which the slurm profile needs to submit its profiling jobs"
            )


def requested_device_names():
    """Device names mentioned by the command line's targets (profile_<d>, trace_<d>, results/traces/<d>/...)."""
    settings = workflow.dag_settings
    words = list(settings.targets) if settings is not None and settings.targets else sys.argv[1:]
    for word in words:
        rule_name = word.split(":")[0]
        for prefix in ("profile_", "trace_", "hardware_"):
            if rule_name.startswith(prefix):
                yield word, rule_name[len(prefix) :]
        parts = Path(word).parts
        if len(parts) > 2 and parts[:2] in (("results", "traces"), ("results", "hardware")):
            yield word, parts[2].removesuffix(".json")


def check_requested_devices():
    """Targets naming a device that is not configured get the list of configured devices."""
    for target, name in requested_device_names():
        if name not in DEVICES:
            raise WorkflowError(
                f"unknown device {name!r} in target {target!r}; configured devices: {', '.join(DEVICES)}"
            )


check_requested_devices()


def attempt_number(wildcards, attempt):
    """Snakemake's attempt counter (grows with --retries), recorded in each shard's metadata."""
    return attempt


def trace_files(wildcards=None):
    return expand("results/traces/{device}/{shard}.parquet", device=DEVICES, shard=SHARDS)


def hardware_files(wildcards=None):
    return expand("results/hardware/{device}.json", device=DEVICES)


def prediction_files(wildcards=None):
    return expand(
        "results/fit/{target}/{regressor}/{split}.predictions.parquet",
        target=TARGETS,
        regressor=REGRESSORS,
        split=SPLITS,
    )


def ablation_split_files(wildcards=None):
    """The splits the feature ablation is run on (those configured among random and leave-one-out)."""
    wanted = [s for s in SPLITS if s in ("random", "leave_one_device_out", "leave_one_family_out")]
    return expand("results/splits/{split}.parquet", split=wanted or SPLITS[:1])


def split_files(wildcards=None):
    return expand("results/splits/{split}.parquet", split=SPLITS)


def model_files(wildcards=None):
    return expand(
        "results/fit/{target}/{regressor}/{split}.models.json",
        target=TARGETS,
        regressor=REGRESSORS,
        split=SPLITS,
    )


CPU_DEVICES = [d for d in DEVICES if config["devices"][d]["kind"] == "cpu"]


def layer_timing_files():
    return expand("results/layers/{device}.parquet", device=CPU_DEVICES)


OP_TIMES = "results/features/op_times.parquet"


def op_trace_files(wildcards=None):
    return expand("results/traces/{device}/{shard}.ops.parquet", device=DEVICES, shard=SHARDS)


def op_time_targets(wildcards=None):
    """Outputs of the op_times rules for ``rule all`` (coverage only with leave_one_family_out)."""
    coverage = ["results/evaluate/op_coverage.parquet"] if "leave_one_family_out" in SPLITS else []
    return [OP_TIMES, *coverage]


def regressor_files(regressor):
    """Files a regressor reads besides the dataset and the split, by its parameter name (one table for the
    fit rule's inputs and the regressor's parameters): per-layer timings and complexities for the per-layer
    (Gianniti) regressor, measured per-kind operator times for composed (its per-byte priors) and composed_optime
    (its per-kind fits). composed_blend's composed member keeps the pooled priors: with the measured ones the
    blend was worse on the selection splits (bench/RESULTS.md)."""
    return {
        "gianniti_layer": {
            "layers_path": "results/features/layers.parquet",
            "timings_path": layer_timing_files(),
        },
        "composed": {"op_times_path": OP_TIMES},
        "composed_optime": {"op_times_path": OP_TIMES},
    }.get(regressor, {})


def regressor_input_files(wildcards):
    return [
        path
        for value in regressor_files(wildcards.regressor).values()
        for path in ([value] if isinstance(value, str) else value)
    ]


def regressor_params(wildcards):
    return regressor_files(wildcards.regressor)


def reused_members(regressor):
    """The members of a blend whose own fit jobs' models the blend reuses: those configured as regressors of their
    own that read no files (so they have the parameters they have in the blend). A member fitted on the same rows
    is taken from its saved models instead of being fitted again (perfzoo.regressors.base.FittedModels)."""
    members = BLEND_MEMBERS.get(regressor, ())
    return [m for m in members if m in REGRESSORS and not regressor_files(m)]


def reused_member_files(wildcards):
    return expand(
        "results/fit/{target}/{member}/{split}.models.json",
        target=wildcards.target,
        member=reused_members(wildcards.regressor),
        split=SPLITS,
    )


def fit_priority(wildcards):
    """1 for a regressor whose models a blend reuses (it is waited for: started first), else 0."""
    return int(any(wildcards.regressor in reused_members(blend) for blend in REGRESSORS))


EXTERNAL = sorted(config.get("external", {}))


def external_entry(name):
    """One `external:` entry as a dict (a bare string is the path of a long-format table)."""
    entry = config["external"][name]
    return {"path": entry} if isinstance(entry, str) else dict(entry)


def external_table_of(name):
    """The entry's table; a relative path is read from `external_dir` (default: the working directory)."""
    return str(Path(config.get("external_dir") or ".") / os.path.expandvars(external_entry(name)["path"]))


def external_table(wildcards):
    return external_table_of(wildcards.name)


def external_device_map_of(name):
    """The entry's device-map file, as an input (an inline mapping needs no file)."""
    device_map = external_entry(name).get("device_map")
    return [os.path.expandvars(device_map)] if isinstance(device_map, str) else []


def external_device_map(wildcards):
    return external_device_map_of(wildcards.name)


def external_options_of(name):
    """How to read the entry's table (format, device, precision, software, inline device map, strict)."""
    entry = external_entry(name)
    entry.pop("path")
    return entry


def external_options(wildcards):
    return external_options_of(wildcards.name)


EXTERNAL_FEATURE_CACHE = "results/external/feature_cache.jsonl"
"""Model features of the imported tables, shared by the import jobs (keyed by model, resolution, precision, mode
and the featuriser's code and library versions: :mod:`perfzoo.features.pool`)."""


def external_tables_ahead(wildcards=None):
    """[table, options, device-map file] of every `external:` entry, whose models an import job featurises ahead."""
    return [
        [external_table_of(name), external_options_of(name), (external_device_map_of(name) or [None])[0]]
        for name in EXTERNAL
    ]


def zoo_files(wildcards=None):
    """The zoo manifest and model features, when the config profiles a zoo (import-only configs do not)."""
    if not ZOO:
        return {}
    return {"manifest": "results/zoo/manifest.parquet", "features": "results/features/models.parquet"}


def external_rows(wildcards=None):
    return expand("results/external/{name}.parquet", name=EXTERNAL)


PREDICTIONS = sorted(config.get("predict", {}))


def prediction_spec(wildcards):
    """The `predict:` entry of one name, in the form perfzoo.prediction.predict_to_file expects."""
    entry = dict(config["predict"][wildcards.name])
    model = entry.pop("model")
    return {**entry, "name": model}


def prediction_model_files(wildcards):
    """User files behind one `predict:` entry (a python-builder model)."""
    return predict_model_files(config["predict"][wildcards.name])


def prediction_records(wildcards=None):
    return expand("results/predictions/{name}.json", name=PREDICTIONS)


def gianniti_tables(wildcards=None):
    return ["results/gianniti/coefficients.csv"] if CPU_DEVICES else []


def all_targets(wildcards):
    # the hardware descriptions are targets themselves: one deleted is measured again (as an input only,
    # Snakemake would not regenerate it for outputs that already exist)
    return [
        "results/report/index.html",
        *prediction_records(),
        *energy_targets(),
        *hardware_files(),
        *sensors_targets(),
        *op_time_targets(),
    ]


# Sensor runs recorded with an external power meter (rules/sensors.smk; none by default).
SENSOR_RUNS = config.get("sensor_logs", [])


def sensor_log_files(wildcards=None):
    """Every file of every configured sensor run (so a changed log reruns the rule)."""
    from perfzoo.sensors.fidelity import (
        run_files,
    )  # here: it loads matplotlib, which a run without sensor logs never needs

    try:
        return [str(f) for entry in SENSOR_RUNS for f in run_files(entry["path"])]
    except InputError as exc:
        raise WorkflowError(f"sensor_logs: {exc}") from None


def sensors_targets(wildcards=None):
    """Outputs of the sensors rule, for ``rule all`` (empty when no sensor log is configured)."""
    if not SENSOR_RUNS:
        return []
    return [
        f"results/sensors/{name}"
        for name in ("energy_fidelity.csv", "meter_vs_nvml.png", "meter_vs_nvml.pdf", "provenance.json")
    ]
