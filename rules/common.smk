# Helper and input functions shared by every rule file (no rules here).
import os
import sys
from pathlib import Path

SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, SRC)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)

from perfzoo.config import check_model_names
from perfzoo.io import InputError
from perfzoo.zoo import expand_zoo, shard_names

try:
    check_model_names(config)
except InputError as exc:
    raise WorkflowError(str(exc)) from None

DEVICES = sorted(config["devices"])
ZOO = expand_zoo(config)
SHARDS = shard_names(len(ZOO), config["shards"]["size"])
SPLITS = config["splits"]["schemes"]
TARGETS = config["fit"]["targets"]
REGRESSORS = config["fit"]["regressors"]


wildcard_constraints:
    device="|".join(DEVICES),
    shard="s[0-9]+",
    split="|".join(SPLITS),
    target="|".join(TARGETS),
    regressor="|".join(REGRESSORS),


def pkg(*modules):
    """Package source files a rule depends on, so editing them reruns the rule."""
    files = []
    for module in ("__init__.py", "io.py", "provenance.py", *modules):
        path = Path(SRC) / "perfzoo" / module
        files += sorted(map(str, path.rglob("*.py"))) if path.is_dir() else [str(path)]
    return files


def device_config(wildcards):
    return config["devices"][wildcards.device]


def device_threads(wildcards):
    return config["devices"][wildcards.device].get("threads", 1)


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


def report_tables():
    from perfzoo.report import TABLES

    return {name: f"results/report/tables/{name}.csv" for name in TABLES}


def report_figures():
    from perfzoo.report import FIGURES

    return {name: f"results/report/figures/{name}.png" for name in FIGURES}


def all_targets(wildcards):
    return ["results/report/index.html"]
