"""Every example command of the README runs, as written, against a finished run of the workflow.

The commands are read from the README's ``bash`` blocks and run verbatim in a copy of the workflow
(code + a small config with the README's ``predict:`` entry) after a real Snakemake run (the
session's ``finished_workflow``, shared with tests/test_relocatable.py); the
activated environment of the README (``source .venv/bin/activate``) is this interpreter's ``bin/``
on PATH. A command is skipped only when it is listed in NOT_RUN with the reason. With
``PERFZOO_README_RESULTS=<folder of a finished default run>`` the ``perfzoo`` examples also run there
and must not warn that they lie outside the profiled range (the default zoo takes ~10 minutes).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
NOT_RUN = {
    "make run": "the first command itself: installs the environment and runs the default zoo (~10 min)",
    "make test": "the test suite itself",
    "python3 -m venv .venv": "installs the environment (minutes, 6.6 GB)",
    ".venv/bin/snakemake --cores all": "the default run (~10 min); its tiny equivalent runs in the fixture",
    "source .venv/bin/activate": "emulated: the interpreter's bin/ is put first on PATH",
    "snakemake --profile slurm": "needs a SLURM cluster (tests/test_slurm.py)",
    "snakemake --configfile config/gpu-local.yaml": "needs an NVIDIA GPU (its recorded traces: tests/test_gpu_traces.py)",
    "python bench/user_model.py": "measures a model with the profiler (minutes; tests/test_user_model.py "
    "runs its prediction)",
}
OUT_OF_RANGE = re.compile(
    r"outside the profiled range|beyond the largest profiled batch|below the smallest profiled batch"
    r"|mode '\w+' was never profiled"
)


def readme_commands(text: str) -> list[str]:
    """The command lines of the README's ``bash`` blocks, without trailing comments."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def skip_reason(command: str) -> str | None:
    return next((why for prefix, why in NOT_RUN.items() if command.startswith(prefix)), None)


def activated_env(src: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(src)}


def run_command(command: str, folder: Path, src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, shell=True, cwd=folder, env=activated_env(src), capture_output=True, text=True, timeout=600
    )


def test_readme_commands_are_found_and_each_is_run_or_skipped_with_a_reason() -> None:
    commands = readme_commands(README.read_text())
    run = [c for c in commands if skip_reason(c) is None]
    assert sum(c.startswith("perfzoo ") for c in run) >= 5, run
    assert sum(c.startswith("snakemake ") for c in run) >= 4, run
    assert all(c.startswith(("perfzoo ", "snakemake ")) for c in run), run


@pytest.mark.parametrize(
    "command", [c for c in readme_commands(README.read_text()) if skip_reason(c) is None]
)
def test_readme_example_exits_zero(finished_workflow, command) -> None:
    proc = run_command(command, finished_workflow, finished_workflow / "src")
    print(f"$ {command}\nexit {proc.returncode}\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{proc.stderr[-3000:]}"


DEFAULT_RESULTS = os.environ.get("PERFZOO_README_RESULTS")


@pytest.mark.skipif(not DEFAULT_RESULTS, reason="PERFZOO_README_RESULTS (a finished default run) not set")
@pytest.mark.parametrize(
    "command", [c for c in readme_commands(README.read_text()) if c.startswith("perfzoo predict")]
)
def test_predict_examples_stay_inside_the_default_zoo(command) -> None:
    folder = Path(DEFAULT_RESULTS)
    proc = run_command(command, folder, ROOT / "src")
    print(f"$ {command}\nexit {proc.returncode}\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not OUT_OF_RANGE.search(proc.stdout + proc.stderr), proc.stdout + proc.stderr
