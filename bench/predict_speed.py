"""End-to-end wall time of ``perfzoo predict`` (imports + featurisation + predictors + provenance).

Runs ``python -m perfzoo predict timm:resnet50 --batch 8 --input 3,224,224`` as a subprocess in a
workflow directory (one that holds ``results/`` with fitted predictors and ``config.yaml``): a first run
(no warm featuriser server yet: it featurises in a child process and starts the server), then
``--repeats`` runs as users meet them after the first (through the server), then ``--repeats`` runs with
``--no-server`` (a child process imports torch and timm each time), and prints each series' median wall
time. The server lives in a temporary folder of its own and is stopped at the end. The runs are pinned
to ``--cpus`` CPUs (default 2) where the machine has more.

    python bench/predict_speed.py                     # in a workflow directory, after `snakemake --cores all`
    python bench/predict_speed.py --workdir /tmp/run    # elsewhere
    python bench/predict_speed.py --tiny                # on a tiny synthetic run built by the test fixture

The target is 5 s on 2 cores; ``--check`` makes the exit status 1 when the median after the first run
exceeds ``--target``.
Other load on the machine inflates the figure: the load average at the start is printed with it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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
    folder = tempfile.mkdtemp(prefix="pz-bench-")  # a private server folder: this benchmark's own server
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p),
        "PERFZOO_TIMING": "1",  # phase timings on stderr: CPU of the main process and of the featuriser
        "PERFZOO_FEATURISER": "auto",
        "XDG_RUNTIME_DIR": folder,
    }
    pin, ncpu = _pin(args.cpus)
    load = os.getloadavg()[0]

    def once(extra: list[str]) -> tuple[float, float, float, str]:
        """(wall s, main-process CPU s, featuriser CPU s, how it was featurised)."""
        start = time.perf_counter()
        proc = subprocess.run(
            [*cmd, *extra], cwd=workdir, capture_output=True, text=True, env=env, preexec_fn=pin, check=False
        )
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"perfzoo predict failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        main_cpu = re.findall(r"([\d.]+) s CPU  predictions", proc.stderr)
        feat_cpu = re.findall(r"\(([\d.]+) s CPU in (?:the child|its fork)\)", proc.stderr)
        how = "server" if "server done" in proc.stderr else "child"
        return (elapsed, float(main_cpu[-1]) if main_cpu else math.nan,
                float(feat_cpu[-1]) if feat_cpu else math.nan, how)

    def series(label: str, extra: list[str], before: Callable[[], None]) -> float:
        runs = []
        for _ in range(args.repeats):
            before()
            runs.append(once(extra))
        walls = [r[0] for r in runs]
        median = statistics.median(walls)
        verdict = "within" if median <= args.target else "ABOVE"
        print(
            f"{label}: median {median:.2f} s over {len(runs)} runs ({', '.join(f'{w:.2f}' for w in walls)}), "
            f"featurised by {'/'.join(sorted({r[3] for r in runs}))}; CPU per run (median) "
            f"{statistics.median(r[1] for r in runs):.2f} s main process, "
            f"{statistics.median(r[2] for r in runs):.2f} s featurising; {verdict} the {args.target:g} s target"
        )
        return median

    sock = subprocess.run(
        [sys.executable, "-c", "from perfzoo.prediction import server as f; print(f.socket_path())"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()

    def server_ready() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not Path(sock).with_suffix(".pid").exists():
            time.sleep(0.2)
        time.sleep(0.5)

    print(
        f"perfzoo predict {args.model} --batch {args.batch} --input {args.input} on {ncpu} CPUs, "
        f"load average {load:.2f} at start"
    )
    try:
        cold = once([])  # the first run: no server yet; it featurises in a child and starts one
        print(f"first run: {cold[0]:.2f} s (featurised by {cold[3]}; starts the warm featuriser server)")
        warm = series("after the first run (warm featuriser server)", [], server_ready)
        series("--no-server (a child process imports torch and timm each time)", ["--no-server"], lambda: None)
    finally:
        subprocess.run([*cmd[:3], "server", "stop"], env=env, capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if args.check and warm > args.target else 0


if __name__ == "__main__":
    sys.exit(main())
