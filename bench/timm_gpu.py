"""Measure timm models on a GPU with the protocol of timm's own ``benchmark.py`` (AMP inference, NCHW).

The result is a CSV in the columns of timm's ``results/benchmark-infer-amp-*.csv`` files, so a GPU measured
here joins the timm development data (``bench/device_transfer.py``, ``config/timm-benchmark.yaml``) as one
more device: a GPU none of those files covers, e.g. a data-centre part.

Three steps:

* ``select SOURCE OUT``: the models to measure, from one of timm's files (its model, image size and batch),
  in a seeded random order so that a run cut short by its time budget still measures a random sample.
  Models whose step took longer than ``--max-step-ms`` in SOURCE are left out (the budget), counted.
* ``measure MODELS OUT``: per model, in that order, until ``--budget-s`` is spent: the model built by timm
  with random weights on the GPU, ``eval()``, ``torch.no_grad()``, fp16 autocast, a ``randn`` float32 batch
  at the listed image size and batch; ``--warmup`` steps, then ``--steps`` steps each timed as timm times
  them (``perf_counter`` before the call, ``synchronize`` and ``perf_counter`` after). ``infer_step_time``
  is their mean (timm's definition), ``infer_step_time_median`` their median; ``build_s``, ``first_step_s``
  (the first warm-up step, with cuDNN's autotuning) and ``total_s`` say where the model's time went. A model that fails (unknown
  to this timm, out of memory, an error in its forward, longer than ``--model-limit-s``) gets a row with its
  error and no times. Each row is appended and flushed as it is measured, so a run stopped by a time limit
  keeps what it measured. (The limit came after the H200 run of ``tests/fixtures/gpu-h200``, where one model
  held the GPU past both runs' limits.)
* ``fixture COUNTS OUT MEASURED ...``: one timm benchmark CSV from several ``measure`` runs, with timm's own
  FLOP and activation counts copied from the timm file COUNTS (what ``tests/fixtures/gpu-h100/timm/`` is).

Differences from timm's protocol, kept on purpose: fewer steps (``--steps 10`` after 3 warm-ups against
40 after 10: the budget of a lent GPU); the batch is not lowered on an error (the error is recorded instead).
As in timm's script, ``torch.backends.cudnn.benchmark`` is on and the model's own global pool is kept.

Usage: ``python bench/timm_gpu.py select ../shared/data/timm-benchmark/benchmark-infer-amp-nchw-pt291-cu128-4090.csv
bench/timm_gpu_models.csv`` here; on the GPU ``python bench/timm_gpu.py measure bench/timm_gpu_models.csv
$OUT/timm.csv --budget-s 360``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

COLUMNS = ["model", "infer_img_size", "infer_samples_per_sec", "infer_step_time", "infer_batch_size", "param_count",
           "infer_step_time_median", "infer_step_time_min", "infer_step_time_max", "steps", "build_s", "first_step_s",
           "total_s", "error"]


def select(source: Path, out: Path, max_step_ms: float, seed: int) -> None:
    """The models of ``source`` whose step took at most ``max_step_ms`` there, in a seeded random order."""
    import pandas as pd

    table = pd.read_csv(source)
    kept = table[table["infer_step_time"] <= max_step_ms]
    order = kept.sample(frac=1.0, random_state=seed)
    order[["model", "infer_img_size", "infer_batch_size", "infer_step_time"]].rename(
        columns={"infer_step_time": "source_step_ms"}).to_csv(out, index=False)
    print(f"{len(order)} of {len(table)} models of {source.name} (step <= {max_step_ms:g} ms there), "
          f"seed {seed}: {out}")


def environment(device: str) -> dict[str, object]:
    """GPU, driver-visible name, torch, CUDA and timm versions of this run."""
    import timm
    import torch

    info: dict[str, object] = {"python": platform.python_version(), "torch": torch.__version__,
                               "cuda": torch.version.cuda, "timm": timm.__version__, "device": device}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, sm_count=props.multi_processor_count, memory_gib=props.total_memory / 2**30,
                    cudnn=torch.backends.cudnn.version())
    return info


def build(name: str, device: str):  # noqa: ANN201 - a torch module
    """The timm model ``name`` with random weights on ``device`` (built there; on the CPU first if that fails)."""
    import timm
    import torch

    try:
        with torch.device(device):
            model = timm.create_model(name, pretrained=False)
    except Exception:  # some models build CPU tensors explicitly: build there, then move
        model = timm.create_model(name, pretrained=False).to(device)
    return model.eval()


def time_model(name: str, img_size: int, batch: int, device: str, warmup: int, steps: int) -> dict[str, object]:
    """One row of the output: timm's step timing of ``name`` at ``img_size`` and ``batch``."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    t0 = time.perf_counter()
    model = build(name, device)
    params = sum(p.numel() for p in model.parameters())
    x = torch.randn((batch, 3, img_size, img_size), device=device)
    build_s = time.perf_counter() - t0
    dtype = torch.float16 if device.startswith("cuda") else torch.bfloat16
    times, first_s = [], math.nan
    with torch.no_grad():
        for i in range(warmup + steps):
            start = time.perf_counter()
            with torch.autocast(device.split(":")[0], dtype=dtype):
                model(x)
            sync()
            if i == 0:
                first_s = time.perf_counter() - start  # with cuDNN's autotuning of every new shape
            if i >= warmup:
                times.append(1e3 * (time.perf_counter() - start))
    mean = statistics.fmean(times)
    return {"model": name, "infer_img_size": img_size, "infer_samples_per_sec": round(1e3 * batch / mean, 2),
            "infer_step_time": round(mean, 3), "infer_batch_size": batch, "param_count": round(params / 1e6, 2),
            "infer_step_time_median": round(statistics.median(times), 3), "infer_step_time_min": round(min(times), 3),
            "infer_step_time_max": round(max(times), 3), "steps": steps, "build_s": round(build_s, 2),
            "first_step_s": round(first_s, 2), "total_s": round(time.perf_counter() - t0, 2), "error": ""}


class ModelTimeLimit(BaseException):
    """Raised by the alarm when one model has taken longer than its limit (a BaseException, so that no
    ``except Exception`` on the way, e.g. :func:`build`'s retry on the CPU, swallows it)."""


def _alarm(signum: int, frame: object) -> None:
    raise ModelTimeLimit


def measure(models: Path, out: Path, device: str, budget_s: float, warmup: int, steps: int,
            model_limit_s: int) -> int:
    """Measure the models of ``models`` in order until ``budget_s`` is spent; one flushed row each. A model
    still building or stepping after ``model_limit_s`` is stopped (an alarm between Python calls) and gets
    a row with that reason instead of a time."""
    import torch

    torch.backends.cudnn.benchmark = True  # as timm's benchmark.py sets it
    todo = list(csv.DictReader(models.open()))
    env = environment(device)
    env.update(budget_s=budget_s, warmup=warmup, steps=steps, models_listed=len(todo), started=time.time())
    out.with_suffix(".env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env), flush=True)
    deadline = time.monotonic() + budget_s
    done = failed = 0
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in todo:
            if time.monotonic() > deadline:
                break
            name, size, batch = row["model"], int(row["infer_img_size"]), int(row["infer_batch_size"])
            signal.signal(signal.SIGALRM, _alarm)
            signal.alarm(model_limit_s)
            try:
                result = time_model(name, size, batch, device, warmup, steps)
                done += 1
            except ModelTimeLimit:
                result = {"model": name, "infer_img_size": size, "infer_batch_size": batch,
                          "error": f"no time: stopped after {model_limit_s} s on this model (the per-model limit)"}
                failed += 1
            except Exception as error:  # recorded with its reason, never a time
                message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
                result = {"model": name, "infer_img_size": size, "infer_batch_size": batch, "error": message}
                failed += 1
                traceback.print_exc(limit=1)
            finally:
                signal.alarm(0)
            writer.writerow(result)
            handle.flush()
            print(f"{done + failed:4d} {name}@{size} b{batch}: {result.get('infer_step_time', result['error'])}",
                  flush=True)
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    left = len(todo) - done - failed
    summary = {"measured": done, "failed": failed, "not_reached": left, "finished": time.time()}
    out.with_suffix(".summary.json").write_text(json.dumps(summary))
    print(json.dumps(summary), flush=True)
    return 0


def fixture(measured: list[Path], counts: Path, out: Path) -> None:
    """One timm benchmark CSV from the ``measure`` outputs of several runs (in order, a model's first row
    kept), with timm's own ``infer_gmacs``/``infer_macts`` copied from ``counts`` (a timm file that ran the
    same model at the same image size: ``bench/device_transfer.py`` reads them as workload features; they
    are timm's counts, not measured here). A model ``counts`` lacks keeps empty counts, named."""
    import pandas as pd

    rows = pd.concat([pd.read_csv(path) for path in measured], ignore_index=True)
    rows = rows.drop_duplicates(["model", "infer_img_size"], keep="first")
    timm_counts = pd.read_csv(counts)[["model", "infer_img_size", "infer_gmacs", "infer_macts"]]
    merged = rows.merge(timm_counts.drop_duplicates(["model", "infer_img_size"]), how="left",
                        on=["model", "infer_img_size"], validate="one_to_one")
    for name in merged.loc[merged["infer_gmacs"].isna(), "model"]:
        print(f"{name}: not in {counts.name}, no timm counts")
    order = COLUMNS[:COLUMNS.index("param_count") + 1] + ["infer_gmacs", "infer_macts"]
    order += [c for c in COLUMNS if c not in order]
    merged["steps"] = merged["steps"].astype("Int64")
    tmp = out.with_suffix(".tmp")
    merged[order].to_csv(tmp, index=False)
    tmp.replace(out)
    print(f"{len(merged)} rows ({merged['error'].notna().sum()} without a time) from {len(measured)} runs: {out}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("select")
    s.add_argument("source", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--max-step-ms", type=float, default=1000.0)
    s.add_argument("--seed", type=int, default=20261126)
    m = sub.add_parser("measure")
    m.add_argument("models", type=Path)
    m.add_argument("out", type=Path)
    m.add_argument("--device", default="cuda:0")
    m.add_argument("--budget-s", type=float, default=360.0)
    m.add_argument("--warmup", type=int, default=3)
    m.add_argument("--steps", type=int, default=10)
    m.add_argument("--model-limit-s", type=int, default=60, help="stop a model after this long (its row says so)")
    f = sub.add_parser("fixture")
    f.add_argument("counts", type=Path, help="the timm file whose infer_gmacs/infer_macts are copied")
    f.add_argument("out", type=Path)
    f.add_argument("measured", type=Path, nargs="+", help="measure's CSVs, in the order they ran")
    args = parser.parse_args(argv)
    if args.command == "fixture":
        fixture(args.measured, args.counts, args.out)
        return 0
    if args.command == "select":
        select(args.source, args.out, args.max_step_ms, args.seed)
        return 0
    return measure(args.models, args.out, args.device, args.budget_s, args.warmup, args.steps, args.model_limit_s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
