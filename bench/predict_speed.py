"""End-to-end wall time of ``perfzoo predict`` (imports + featurisation + predictors + provenance).

Runs ``python -m perfzoo predict timm:resnet50 --batch 8 --input 3,224,224`` as a subprocess in a
workflow directory (one that holds ``results/`` with fitted predictors and ``config.yaml``), once to warm
the caches (file cache, model-name cache), then ``--repeats`` times, and prints the median wall time.
The runs are pinned to ``--cpus`` CPUs (default 2) where the machine has more.

    python bench/predict_speed.py                     # in a workflow directory, after `snakemake --cores all`
    python bench/predict_speed.py --workdir /tmp/run    # elsewhere
    python bench/predict_speed.py --tiny                # on a tiny synthetic run built by the test fixture

The target is 5 s on 2 cores; ``--check`` makes the exit status 1 when the median exceeds ``--target``.
Other load on the machine inflates the figure: the load average at the start is printed with it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pin(cpus: int):
    available = sorted(os.sched_getaffinity(0))
    chosen = set(available[:cpus])

    def pin() -> None:
        if len(available) > cpus:
            os.sched_setaffinity(0, chosen)

    return pin, min(cpus, len(available))


def _tiny_workdir() -> Path:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]
    from test_predict import build_workflow_outputs

    return build_workflow_outputs(Path(tempfile.mkdtemp(prefix="perfzoo-bench-")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=".", help="workflow directory with results/ and config.yaml")
    parser.add_argument("--tiny", action="store_true", help="build a tiny synthetic workflow run and use it")
    parser.add_argument("--model", default="timm:resnet50")
    parser.add_argument("--batch", default="8")
    parser.add_argument("--input", default="3,224,224")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--target", type=float, default=5.0, help="seconds")
    parser.add_argument("--check", action="store_true", help="exit 1 if the median exceeds --target")
    args = parser.parse_args(argv)

    workdir = _tiny_workdir() if args.tiny else Path(args.workdir).resolve()
    if not (workdir / "results/evaluate/metrics.parquet").is_file():
        print(
            f"{workdir}/results/evaluate/metrics.parquet not found: run `snakemake --cores all` there first, "
            "or pass --tiny",
            file=sys.stderr,
        )
        return 2
    cmd = [
        sys.executable,
        "-m",
        "perfzoo",
        "predict",
        args.model,
        "--batch",
        args.batch,
        "--input",
        args.input,
        "--results",
        "results",
        "--config",
        "config.yaml",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p),
        "PERFZOO_TIMING": "1",  # phase timings on stderr: CPU of the main process and of the child
    }
    pin, ncpu = _pin(args.cpus)
    load = os.getloadavg()[0]
    cpu: list[tuple[float, float]] = []

    def once() -> float:
        start = time.perf_counter()
        proc = subprocess.run(
            cmd, cwd=workdir, capture_output=True, text=True, env=env, preexec_fn=pin, check=False
        )
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"perfzoo predict failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        main_cpu = re.findall(r"([\d.]+) s CPU  predictions", proc.stderr)
        child_cpu = re.findall(r"\(([\d.]+) s CPU in the child\)", proc.stderr)
        cpu.append(
            (float(main_cpu[-1]) if main_cpu else math.nan, float(child_cpu[-1]) if child_cpu else 0.0)
        )
        return elapsed

    warm = once()
    cpu.clear()
    runs = [once() for _ in range(args.repeats)]
    median = statistics.median(runs)
    verdict = "within" if median <= args.target else "ABOVE"
    print(
        f"perfzoo predict {args.model} --batch {args.batch} --input {args.input}: median {median:.2f} s over "
        f"{len(runs)} runs ({', '.join(f'{r:.2f}' for r in runs)}; first run {warm:.2f} s) on {ncpu} CPUs, "
        f"load average {load:.2f} at start; {verdict} the {args.target:g} s target"
    )
    print(
        f"CPU per run (median): {statistics.median(c[0] for c in cpu):.2f} s in the main process, "
        f"{statistics.median(c[1] for c in cpu):.2f} s in the featurising child process; on two otherwise "
        "idle cores the wall time approaches the larger of the two"
    )
    return 1 if args.check and median > args.target else 0


if __name__ == "__main__":
    sys.exit(main())
