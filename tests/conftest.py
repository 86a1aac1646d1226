"""Shared fixtures: the repository root and small configs."""

from __future__ import annotations

import copy
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# No warm featuriser server outlives a test: `perfzoo predict` featurises in a child process, unless a
# test (test_featuriser_server.py) turns the server on for itself.
os.environ["PERFZOO_FEATURISER"] = "local"

FAULTY = ROOT / "tests" / "fixtures" / "faulty_models.py"


def snakemake_command(*args: str, snakefile: Path = ROOT / "Snakefile", cores: int | None = 2) -> list[str]:
    """The command line of a Snakemake run of ``snakefile`` (``cores`` None: no ``--cores``, as for a dry run)."""
    return [sys.executable, "-m", "snakemake", "-s", str(snakefile), *(["--cores", str(cores)] if cores else []),
            *args]


def code_env(src: Path = ROOT / "src") -> dict[str, str]:
    """The environment in which the rule scripts import perfzoo from ``src``."""
    return {**os.environ, "PYTHONPATH": str(src)}


def snakemake(workdir: Path, *args: str, snakefile: Path = ROOT / "Snakefile", src: Path = ROOT / "src",
              cores: int | None = 2, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """A real Snakemake run in ``workdir`` of ``snakefile``, its rule scripts importing perfzoo from ``src`` (both
    the checkout's unless given; :func:`own_code` for a folder's own); ``check``: a failed run fails the test with
    the end of its stderr."""
    proc = subprocess.run(snakemake_command(*args, snakefile=snakefile, cores=cores), cwd=workdir,
                          capture_output=True, text=True, timeout=timeout, env=code_env(src))
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed in {workdir}:\n{proc.stderr[-4000:]}")
    return proc


def own_code(folder: Path) -> dict[str, Path]:
    """:func:`snakemake`'s code arguments for the workflow a folder holds (its Snakefile, its ``src``)."""
    return {"snakefile": folder / "Snakefile", "src": folder / "src"}


def tiny_config() -> dict[str, Any]:
    """Six configs: two MLPs x inference/training on one batch, and a 2-layer transformer."""
    return {
        "devices": {"cpu": {"kind": "cpu", "threads": 1}},
        "zoo": {
            "num_classes": 10,
            "families": {
                "mlp": {"builder": "mlp", "input_shape": [64], "batch_sizes": [4],
                        "models": [{"name": "mlp_small", "kwargs": {"in_features": 64, "hidden": [32, 32]}},
                                   {"name": "mlp", "variant": "wide", "kwargs": {"in_features": 64, "hidden": [256]}}]},
                "transformer": {"builder": "transformer", "sequence_lengths": [8], "batch_sizes": [2],
                                "models": [{"name": "encoder", "kwargs": {"d_model": 32, "heads": 2, "layers": 1}}]},
            },
        },
        "shards": {"size": 4},
        # Interference flags are tested on their own (test_interference.py); here a loaded test machine must
        # not drop the tiny zoo's rows from fitting, so the tolerances are out of reach.
        "profiling": {"warmup_iters": 1, "min_iters": 3, "max_iters": 8, "max_time_s": 0.2, "timeout_s": 60,
                      "repeat_every": 2,
                      "interference": {"tolerance": 1000.0, "load_tolerance": 1000.0, "steal_tolerance": 1.0}},
        "fit": {"targets": ["latency_ms", "peak_mem_mb"], "regressors": ["linear", "random_forest"]},
    }


def _weight(item: pytest.Item) -> int:
    """Heaviest first: the SLURM cluster's runs, the tests of the session's finished run, other real Snakemake
    runs, the rest."""
    if item.get_closest_marker("slurm"):
        return 0
    if "finished_workflow" in getattr(item, "fixturenames", ()):
        return 1
    return 2 if item.get_closest_marker("e2e") else 3


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the test files heaviest first, each file's tests together and in their own order. With
    ``--dist loadfile --no-loadscope-reorder`` the workers take the files in this order, so the many quick tests
    fill in the end, and the files of the finished run follow one another on the worker that made it while the
    other runs the SLURM tests."""
    weight: dict[Path, int] = {}
    for item in items:
        weight[item.path] = min(weight.get(item.path, 3), _weight(item))
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (weight[item.path], order[id(item)]))


@pytest.fixture
def config() -> dict[str, Any]:
    return copy.deepcopy(tiny_config())


WORKFLOW_PARTS = ("Snakefile", "rules", "workflow", "src", "envs", "report", "examples")


def copy_workflow(destination: Path, config: dict[str, Any]) -> Path:
    """A clone-like copy of the workflow's code in ``destination``, with ``config`` as its config.yaml."""
    destination.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for part in WORKFLOW_PARTS:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, destination / part, ignore=ignore)
        else:
            shutil.copy2(source, destination / part)
    (destination / "config.yaml").write_text(yaml.safe_dump(config))
    return destination


def finished_config() -> dict[str, Any]:
    """The tiny zoo, a model whose builder fails (one config of seven ends with status error), and the
    prediction the README audits (``results/predictions/resnet50_b8.json``)."""
    config = tiny_config()
    config["zoo"]["families"]["broken"] = {"builder": "python", "input_shape": [4], "modes": ["inference"],
                                           "models": [f"{FAULTY}:build_broken"]}
    config["predict"] = {
        "resnet50_b8": {"model": "torchvision:resnet50", "batch": 8, "input": "3,64,64", "mode": "inference"}
    }
    return config


def _run_to_the_end(folder: Path) -> Path:
    """Run the whole workflow in ``folder`` (a :func:`copy_workflow`) with Snakemake; the folder."""
    old = os.umask(0o022)  # a shared project folder: outputs must be readable by the group (tests/test_e2e.py)
    try:
        snakemake(folder, **own_code(folder), timeout=900)
    finally:
        os.umask(old)
    return folder


@pytest.fixture(scope="session")
def finished_workflow(tmp_path_factory, worker_id) -> Path:
    """A workflow folder (code, config, results, .snakemake metadata) after a complete real run.

    Under pytest-xdist the run is made once for all workers (by the first to ask, under a file lock; the others
    wait for it rather than run it beside it on the same cores) and each worker gets its own copy: a copied
    folder has nothing left to do (tests/test_relocatable.py), and the tests change their folder."""
    if worker_id == "master":
        return _run_to_the_end(copy_workflow(tmp_path_factory.mktemp("finished") / "perfzoo", finished_config()))
    shared = tmp_path_factory.getbasetemp().parent / "finished-workflow"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (shared / "done").exists():
            shutil.rmtree(shared, ignore_errors=True)  # what a failed run of another worker left
            _run_to_the_end(copy_workflow(shared / "perfzoo", finished_config()))
            (shared / "done").touch()
    folder = tmp_path_factory.mktemp("finished") / "perfzoo"
    shutil.copytree(shared / "perfzoo", folder, symlinks=True)  # keeps mtimes, as `cp -a` does
    return folder
