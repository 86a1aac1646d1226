"""A workflow folder can be moved or copied without rerunning anything, and used as a Snakemake module."""

from __future__ import annotations

import shutil

import pytest
import yaml

from conftest import ROOT, own_code, snakemake, tiny_config

pytestmark = pytest.mark.e2e


def test_copied_folder_has_nothing_to_do(finished_workflow, tmp_path) -> None:
    copy = tmp_path / "deeper" / "elsewhere" / "perfzoo-copy"
    shutil.copytree(finished_workflow, copy, symlinks=True)  # keeps mtimes, like `cp -a` or `mv`
    proc = snakemake(copy, "-n", **own_code(copy))
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    changed = snakemake(copy, "--list-changes", "input", **own_code(copy))
    assert "results/" not in changed.stdout, changed.stdout[-3000:]


def test_moved_folder_has_nothing_to_do(finished_workflow, tmp_path) -> None:
    moved = tmp_path / "moved"
    shutil.move(finished_workflow, moved)
    try:
        proc = snakemake(moved, "-n", **own_code(moved))
        assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    finally:
        shutil.move(moved, finished_workflow)


MODULE_SNAKEFILE = """\
configfile: "config.yaml"


module perfzoo:
    snakefile:
        "{snakefile}"
    config:
        config


use rule * from perfzoo as perfzoo_*
"""


def module_config() -> dict:
    """The tiny zoo's MLPs, one target, one regressor, one split: every stage runs, each as few times as it can."""
    config = tiny_config()
    del config["zoo"]["families"]["transformer"]
    config["fit"] = {"targets": ["latency_ms"], "regressors": ["linear"]}
    config["splits"] = {"schemes": ["random"]}
    return config


def test_workflow_runs_as_a_module_of_another_workflow(tmp_path) -> None:
    user = tmp_path / "my-analysis"
    user.mkdir()
    (user / "config.yaml").write_text(yaml.safe_dump(module_config()))
    (user / "Snakefile").write_text(MODULE_SNAKEFILE.format(snakefile=ROOT / "Snakefile"))
    proc = snakemake(user, snakefile=user / "Snakefile", src=ROOT / "src")
    print(proc.stderr[-1500:])
    assert (user / "results/report/index.html").stat().st_size > 0
    assert "perfzoo_report" in proc.stderr
    assert not (user / "src").exists()  # package files were read from the module's folder
    again = snakemake(user, "-n", snakefile=user / "Snakefile", src=ROOT / "src")
    assert "Nothing to be done" in again.stdout + again.stderr
