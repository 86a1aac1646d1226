"""A rule's package inputs follow its script's imports, so editing any module it uses reruns it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest

from conftest import ROOT, code_env, own_code, snakemake
from perfzoo.depends import package_files_of

SRC = ROOT / "src"
SCRIPTS = sorted((ROOT / "workflow" / "scripts").glob("*.py"))


PRELOADED = ("torch", "torchvision", "pandas", "sklearn", "scipy", "matplotlib.pyplot")
"""Libraries imported once before each script's imports are run in a fork of that process: speed only, the check
reads perfzoo's own modules, and a library loaded beforehand does not change which of them a script loads."""

IMPORTER = ROOT / "tests" / "script_imports.py"


@cache
def loaded_modules_of_every_script() -> dict[Path, frozenset[Path]]:
    """Per rule script, the perfzoo files Python really loads when it runs the script's import statements (all of
    them), each script in a fresh fork of one process that has only :data:`PRELOADED` loaded."""
    proc = subprocess.run([sys.executable, str(IMPORTER), ",".join(PRELOADED), *map(str, SCRIPTS)],
                          capture_output=True, text=True, timeout=600, env=code_env(SRC))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {Path(script): frozenset(Path(p).resolve() for p in files)
            for script, files in json.loads(proc.stdout).items()}


def loaded_modules(script: Path) -> frozenset[Path]:
    """The perfzoo files Python really loads when it runs ``script``'s import statements (all of them)."""
    return loaded_modules_of_every_script()[script]


def rule_scripts() -> dict[str, tuple[str, str]]:
    """Rule name (a regex for rules named per device) -> (script named by pkg(), script run), from rules/."""
    found = {}
    for smk in sorted((ROOT / "rules").glob("*.smk")):
        for block in re.split(r"\n\s*rule\b", "\n" + smk.read_text())[1:]:
            name = re.match(r"\s*(\w+)\s*:", block)
            if name is None:
                name = re.search(r"name:\s*\n\s*f\"([^\"]+)\"", block)
            script = re.search(r"script:\s*\n\s*\"\.\./workflow/scripts/([\w.]+)\"", block)
            if name and script:
                declared = re.search(r"pkg\(\"([\w.]+)\"\)", block)
                pattern = re.sub(r"\{[^}]+\}", ".+", name.group(1))
                found[pattern] = (declared.group(1) if declared else "", script.group(1))
    return found


def test_every_rule_depends_on_the_package_files_of_the_script_it_runs() -> None:
    scripts = rule_scripts()
    assert len(scripts) >= 14, scripts
    for rule, (declared, runs) in scripts.items():
        assert declared == runs, f"rule {rule} runs {runs} but its inputs follow pkg({declared!r})"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_computed_inputs_hold_every_module_the_script_loads(script: Path) -> None:
    computed = set(package_files_of(script, SRC))
    missing = sorted(str(p.relative_to(SRC)) for p in loaded_modules(script) - computed)
    assert not missing, f"{script.name} loads modules its rule does not depend on: {missing}"


def test_declared_package_data_is_a_rule_input() -> None:
    files = {p.relative_to(SRC).as_posix() for p in package_files_of(ROOT / "workflow/scripts/report.py", SRC)}
    assert "perfzoo/report/captions/best.rst" in files
    files = {p.relative_to(SRC).as_posix() for p in package_files_of(ROOT / "workflow/scripts/external.py", SRC)}
    assert "perfzoo/data/gpu_specs.csv" in files


def scheduled_rules(folder: Path, *args: str) -> set[str]:
    """Rules a dry run in ``folder`` would run."""
    proc = snakemake(folder, "-n", "--quiet", "rules", *args, **own_code(folder))
    table = proc.stdout.split("job", 1)[-1]
    return {m.group(1) for m in re.finditer(r"^(\w+)\s+\d+\s*$", table, flags=re.M)} - {"total"}


@pytest.mark.e2e
@pytest.mark.parametrize("module", ["perfzoo/stats.py", "perfzoo/models/builders.py"])
def test_editing_a_module_reruns_every_rule_whose_script_loads_it(finished_workflow, tmp_path, module) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(finished_workflow, folder, symlinks=True)
    assert scheduled_rules(folder) == set(), "the finished run has work left before any edit"
    in_this_run = scheduled_rules(folder, "--forceall")
    edited = folder / "src" / module
    edited.write_text(edited.read_text() + "\n# edited\n")
    os.utime(edited, (time.time() + 5, time.time() + 5))
    scheduled = scheduled_rules(folder)
    users = {rule for rule, (_, script) in rule_scripts().items()
             if (SRC / module).resolve() in package_files_of(ROOT / "workflow" / "scripts" / script, SRC)
             and any(re.fullmatch(rule, r) for r in in_this_run)}
    assert users, f"no rule script loads {module}"
    for rule in users:
        assert any(re.fullmatch(rule, s) for s in scheduled), f"editing {module} does not rerun {rule}: {scheduled}"
