"""A user's own model file, predicted by ``perfzoo predict`` and then measured by perfzoo's own profiler.

    python bench/user_model.py --results results --config config.yaml --out user_model.csv
    python bench/user_model.py --results results --batches 1 --repeats 1     # a quick check that it runs

For every (mode, batch) of the model (default ``examples/sequence_model.py:build``, a Conv1d + GRU
classifier over 12 x 256 sequences, a family no zoo profiles):

1. **predicted** with the public API, as ``perfzoo predict MODEL --batch B --input SHAPE --mode M
   --devices DEVICE`` does (``perfzoo.predict``: featurised on the meta device, the fitted predictor of each
   target chosen from ``--results``); the latency and peak memory, their 90 % intervals, the predictor file
   (``regressor/split``) and the notes it gives (unseen operator kinds, widening outside the profiled
   range, warnings). Also the ``baseline:flops_nearest`` rule of thumb of the evaluate stage (the nearest
   config of the run's dataset, scaled by the FLOPs ratio), fitted on every row of the dataset.
2. **measured** by the profile rule's shard runner (``profile_shard_with_ops``) with the config's
   ``profiling:`` settings, the device's configured threads, the device's hardware record of ``--results``
   (probe baseline, same-setting check) and its interference detection (a disturbed measurement is re-measured
   after ``wait_s``, up to ``retries`` times). Every config is measured ``--repeats`` times, in rounds
   (round r measures every config once, odd rounds in reverse order), so a config's measurements are spread
   over the run, and each round after the first is forked from a new worker server, as the noise floor's repeats
   are (:func:`perfzoo.profiling.core.restart_worker_server`); the measured value is the median of its unflagged
   measurements (each one the median of its timed iterations, as in the dataset). ``repeat_every`` is 0 inside a
   round: the rounds are the repeats.

Printed (and written with ``--out`` as CSV): one row per config with the prediction, its interval, the
measurement, the error ``(predicted - measured) / measured`` in %, and the spread of the repeats
((max - min) / median), beside the run's own noise floor, and the memory reference step
(``perfzoo.profiling.reference``) measured now beside the run's record of it: the CPU's label leaves out the
library code a step maps (which moved by tens of MB between moments on one machine), and the two references
show whether anything else moved between the run and now. Nothing is tuned on these measurements.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from this_checkout import use_this_checkout  # noqa: E402

ROOT = use_this_checkout()

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from perfzoo.config import load_config  # noqa: E402
from perfzoo.features.op_kinds import COSTED_KINDS  # noqa: E402
from perfzoo.fitting import load_models  # noqa: E402
from perfzoo.dataset.build import aggregate_runs  # noqa: E402
from perfzoo.io import read_json, read_parquet  # noqa: E402
from perfzoo.models.zoo import expand_zoo, manifest_frame  # noqa: E402
from perfzoo.prediction import predict  # noqa: E402
from perfzoo.prediction.spec import parse_input  # noqa: E402
from perfzoo.profiling.core import restart_worker_server  # noqa: E402
from perfzoo.profiling.interference import drop_flagged_runs  # noqa: E402
from perfzoo.profiling.reference import memory_reference  # noqa: E402
from perfzoo.profiling.runner import profile_shard_with_ops, worker_settings  # noqa: E402
from perfzoo.regressors.baselines import flops_nearest  # noqa: E402

DEFAULT_MODEL = "examples/sequence_model.py:build"
TARGETS = {"latency_ms": "latency", "peak_mem_mb": "peak memory"}
UNSEEN_FAMILY_WARNING = "the family of "  # printed once above the table, not on every row


@dataclass(frozen=True)
class Case:
    """One configuration of the user's model."""

    mode: str
    batch: int

    @property
    def name(self) -> str:
        return f"{self.mode} b{self.batch}"


def predicted(ref: str, shape: tuple[int, ...], case: Case, results: Path, config: Path, device: str,
              dataset: pd.DataFrame) -> dict[str, Any]:
    """What ``perfzoo predict`` says for one case: value, interval, predictor and notes per target, and
    the flops_nearest baseline on the same feature row."""
    record = predict(ref, batch=case.batch, input_shape=shape, mode=case.mode, devices=[device],
                     results=results, config=config).record
    quantities = record["devices"][device]["quantities"]
    features = pd.DataFrame([record["feature_rows"][device]])
    row: dict[str, Any] = {"config": case.name, "mode": case.mode, "batch": case.batch}
    notes: list[str] = []
    for target, label in TARGETS.items():
        q = quantities[target]
        row.update({f"pred_{target}": q.get("value"), f"pred_{target}_lo": q.get("lo"),
                    f"pred_{target}_hi": q.get("hi"), f"predictor_{target}": q.get("source")})
        notes += [f"{label}: {n}" for n in top_level_parts(str(q.get("interval", "")))[1:]]
        row[f"baseline_{target}"] = float(flops_nearest(dataset, features, target)[0])
    row["breakdown"] = breakdown(record, results, features)
    warnings = record["warnings"]
    row["notes"] = "; ".join([*notes, *(w for w in warnings if not w.startswith(UNSEEN_FAMILY_WARNING))])
    row["family_warning"] = next((w for w in warnings if w.startswith(UNSEEN_FAMILY_WARNING)), "")
    row["predictor_choice"] = record["predictor_choice"]
    return row


def top_level_parts(text: str) -> list[str]:
    """``text`` split at its "; " separators outside parentheses (a range check lists its reasons inside)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith("; ", i):
            parts.append(text[start:i])
            start = i + 2
    return [*parts, text[start:]]


def breakdown(record: dict[str, Any], results: Path, features: pd.DataFrame) -> str:
    """Where the point predictions come from, mean over the predictor's folds: ``composed``'s cost per
    operator kind and its per-step terms (``per step``: the module calls), ``memory_sim``'s calibration terms, in the
    target's units. Reads the fitted terms through the regressors' own design (a diagnostic, not an API)."""
    parts = []
    for target, used in record["predictors"].items():
        if used.get("regressor") not in ("composed", "memory_sim"):
            continue
        folds, _ = load_models(results.parent / used["path"])
        if used["regressor"] == "composed":
            contributions = [m._contributions(features) for m in folds.values()]
            terms = np.mean([np.r_[overhead, costs[0]] for overhead, costs, *_ in contributions], axis=0)
            named = pd.Series(terms, index=["per step", *COSTED_KINDS])
        else:
            named = pd.Series(np.mean([m.contributions(features)[0] for m in folds.values()], axis=0),
                              index=list(folds.values())[0].TERMS)
        top = named[named.abs() > 0].sort_values(ascending=False).head(5)
        parts.append(f"{TARGETS.get(target, target)}: " + ", ".join(f"{k} {v:.1f}" for k, v in top.items()))
    return "; ".join(parts)


def user_manifest(ref: str, shape: tuple[int, ...], cases: list[Case], num_classes: int) -> pd.DataFrame:
    """The model's configs as the zoo stage writes them for a ``python``-builder family."""
    modes = list(dict.fromkeys(c.mode for c in cases))
    batches = list(dict.fromkeys(c.batch for c in cases))
    family = {"builder": "python", "models": [ref], "input_shape": list(shape), "batch_sizes": batches,
              "modes": modes}
    zoo = {"zoo": {"num_classes": num_classes, "families": {"user": family}}, "shards": {"size": 10**6}}
    return manifest_frame(expand_zoo(zoo))


def measure_rounds(configs: pd.DataFrame, device: str, device_cfg: dict[str, Any], settings: dict[str, Any],
                   hardware: dict[str, Any], repeats: int) -> tuple[pd.DataFrame, float]:
    """Trace rows of ``repeats`` rounds over every config (``repeat`` = round), and the wall time."""
    frames = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for r in range(repeats):
            if r:
                restart_worker_server()
            order = (configs if r % 2 == 0 else configs.iloc[::-1]).reset_index(drop=True)
            journal = Path(folder) / f"round{r}.jsonl"
            traces = profile_shard_with_ops(order, device, device_cfg, settings, journal, progress=False,
                                            hardware=hardware).traces
            frames.append(traces.assign(repeat=r, device=device, trace_file=f"round {r}"))
            elapsed = time.perf_counter() - started
            print(f"  round {r + 1}/{repeats} measured ({elapsed:.0f} s)", file=sys.stderr)
    return pd.concat(frames, ignore_index=True), time.perf_counter() - started


def measured(configs: pd.DataFrame, traces: pd.DataFrame) -> pd.DataFrame:
    """Per config and target: the median of the unflagged ok measurements (``basis`` clean); where every
    measurement was flagged as disturbed, the median of the flagged ones (``basis`` flagged, which the
    dataset would leave out); the counts, the spread of the values used, the flags' reasons, and why a
    config has no value at all."""
    runs = aggregate_runs(traces)
    clean_keys = set(zip(*drop_flagged_runs(runs, traces)[["config_id", "repeat"]].to_numpy().T))
    per_run = traces.drop_duplicates(["config_id", "repeat"]).set_index(["config_id", "repeat"])
    reasons = per_run["interference"]
    rows = []
    for c in configs.itertuples():
        mine = runs[runs["config_id"] == c.config_id]
        ok = mine[mine["status"] == "ok"]
        is_clean = np.array([(c.config_id, r) in clean_keys for r in ok["repeat"]], dtype=bool)
        used = ok[is_clean] if is_clean.any() else ok
        flags = sorted({reasons[(c.config_id, r)] for r in ok.loc[~is_clean, "repeat"]})
        row = {"mode": c.mode, "batch": int(c.batch), "measurements": len(mine), "clean": int(is_clean.sum()),
               "flagged": int((~is_clean).sum()), "flag_reasons": " | ".join(flags),
               "basis": "clean" if is_clean.any() else ("flagged" if len(ok) else "missing")}
        for target in TARGETS:
            values = used[target].to_numpy(float)
            median = float(np.median(values)) if len(values) else np.nan
            row[f"meas_{target}"] = median
            spread = 100 * (values.max() - values.min()) / median if len(values) > 1 else np.nan
            row[f"spread_{target}_pct"] = spread
        failed = mine[mine["status"] != "ok"]
        why = "; ".join(f"{s}: {m}" for s, m in zip(failed["status"], failed["message"], strict=True))
        row["measure_missing"] = why if not len(ok) else ""
        rows.append(row)
    return pd.DataFrame(rows)


def with_errors(table: pd.DataFrame) -> pd.DataFrame:
    """Signed errors (predicted - measured) / measured in %, of the prediction and of the baseline, and
    whether the measurement lies inside the 90 % interval."""
    for target in TARGETS:
        meas = table[f"meas_{target}"]
        table[f"err_{target}_pct"] = 100 * (table[f"pred_{target}"] - meas) / meas
        table[f"baseline_err_{target}_pct"] = 100 * (table[f"baseline_{target}"] - meas) / meas
        lo = pd.to_numeric(table[f"pred_{target}_lo"])  # missing: no interval
        hi = pd.to_numeric(table[f"pred_{target}_hi"]).where(lo.isna(), lambda h: h.fillna(np.inf))  # unbounded
        table[f"in_interval_{target}"] = (lo <= meas) & (meas <= hi)
    return table


def markdown(table: pd.DataFrame) -> str:
    """The README's table; † marks a config whose every measurement was flagged as disturbed."""
    def interval(row: pd.Series, target: str) -> str:
        value, lo, hi = (pd.to_numeric(row[f"pred_{target}{end}"]) for end in ("", "_lo", "_hi"))
        if not np.isfinite(value):
            return "missing"
        if not np.isfinite(lo):
            return f"{value:.1f} (no interval)"
        return f"{value:.1f} [{lo:.1f}, {f'{hi:.1f}' if np.isfinite(hi) else 'unbounded'}]"

    def error(value: float, mark: str) -> str:
        return "missing" if not np.isfinite(value) else f"{value:+.0f} %{mark}"

    lines = ["| config | latency predicted [90 %] ms | measured ms (spread) | error | baseline error "
             "| peak memory predicted [90 %] MB | measured MB (spread) | error | baseline error "
             "| measurements used |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        mark = " †" if r["basis"] == "flagged" else ""
        cells = [r["config"]]
        for target in TARGETS:
            spread = r[f"spread_{target}_pct"]
            spread_text = f"{spread:.0f} %" if np.isfinite(spread) else "one measurement"
            meas = (f"{r[f'meas_{target}']:.1f} ({spread_text}){mark}"
                    if np.isfinite(r[f"meas_{target}"]) else f"missing: {r['measure_missing']}")
            cells += [interval(r, target), meas, error(r[f"err_{target}_pct"], mark),
                      error(r[f"baseline_err_{target}_pct"], mark)]
        used = r["clean"] if r["basis"] == "clean" else r["flagged"]
        cells.append(f"{used} of {r['measurements']}{' flagged' if mark else ''}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(table: pd.DataFrame) -> list[str]:
    """Per target and basis (clean, flagged): MAPE of prediction and baseline, configs within 20 %, inside
    the interval, and the median spread of the repeats."""
    out = []
    for target, label in TARGETS.items():
        for basis, ok in table[np.isfinite(table[f"err_{target}_pct"])].groupby("basis", sort=True):
            within = int((ok[f"err_{target}_pct"].abs() <= 20).sum())
            mape, base = ok[f"err_{target}_pct"].abs().mean(), ok[f"baseline_err_{target}_pct"].abs().mean()
            out.append(f"{label}, {len(ok)} configs measured {basis}: MAPE {mape:.1f} % "
                       f"(baseline flops_nearest {base:.1f} %), {within} "
                       f"within 20 %, {int(ok[f'in_interval_{target}'].sum())} inside the 90 % interval, "
                       f"median spread of the repeats {ok[f'spread_{target}_pct'].median():.1f} %")
    flagged = table[table["flagged"] > 0]
    out.append(f"{int(table['flagged'].sum())} of {int(table['measurements'].sum())} measurements flagged as "
               f"disturbed (after re-measuring){': ' if len(flagged) else ''}"
               + "; ".join(f"{r.config}: {r.flag_reasons}" for r in flagged.itertuples()))
    return out


def run_noise_floor(results: Path, device: str) -> str:
    """The run's own noise floor (repeat pairs of the zoo) of each target on ``device``."""
    path = results / "dataset" / "noise_floor.parquet"
    if not path.is_file():
        return f"noise floor: missing ({path} not found)"
    floor = read_parquet(path)
    floor = floor[(floor["device"] == device) & floor["target"].isin(list(TARGETS))]
    return "run's noise floor (zoo repeat pairs): " + ", ".join(
        f"{TARGETS[r.target]} {r.noise_mape:.1f} % ({r.pairs} pairs)" for r in floor.itertuples())


def memory_reference_line(hardware: dict[str, Any], kind: str, threads: int) -> str:
    """The fixed reference step measured now beside the run's record of it (``perfzoo.profiling.reference``):
    peak-memory labels of two moments compare only when their references agree."""
    then, now = hardware.get("memory_reference") or {}, memory_reference(kind, threads)
    if "peak_mem_mb" not in then or "peak_mem_mb" not in now:
        why = then.get("missing") or now.get("missing") or "the run's hardware record has no memory reference"
        return f"memory reference: not compared ({why})"
    shift = now["peak_mem_mb"] - then["peak_mem_mb"]
    return (f"memory reference ({now['config']}): {now['peak_mem_mb']:.1f} MB now, {then['peak_mem_mb']:.1f} MB in "
            f"the run's hardware record ({shift:+.1f} MB; its latency {now['latency_ms']:.2f} vs "
            f"{then['latency_ms']:.2f} ms)")


def provenance_line(device: str, threads: int) -> str:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{when}, commit {commit}, {platform.machine()} {os.cpu_count()} CPUs, device {device} "
            f"({threads} threads), load average before measuring {load}")


def parse_cases(modes: str, batches: str) -> list[Case]:
    return [Case(m, int(b)) for m in modes.split(",") for b in batches.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results", help="a finished default run's results folder")
    parser.add_argument("--config", default=str(ROOT / "config.yaml"), help="that run's config")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="path/to/file.py:function")
    parser.add_argument("--input", default="12,256", help="per-sample input shape")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--device", default="cpu", help="a device of the config, measured here")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per config (rounds)")
    parser.add_argument("--out", help="CSV of the table")
    args = parser.parse_args()

    results, config_path = Path(args.results).resolve(), Path(args.config).resolve()
    config = load_config(config_path)
    device_cfg = dict(config["devices"][args.device])
    shape = parse_input(args.input)
    cases = parse_cases(args.modes, args.batches)
    num_classes = int(config["zoo"]["num_classes"])
    file, _, function = args.model.rpartition(":")
    measured_ref = f"{Path(file).resolve()}:{function}"  # the workers import the file wherever they run
    dataset = read_parquet(results / "dataset" / "dataset.parquet")

    header = provenance_line(args.device, int(device_cfg["threads"]))
    print(f"{args.model}, input {args.input}: predicting {len(cases)} configs", file=sys.stderr)
    predictions = pd.DataFrame([predicted(args.model, shape, c, results, config_path, args.device, dataset)
                                for c in cases])

    settings = {**worker_settings(config["profiling"], device_cfg, num_classes), "repeat_every": 0}
    configs = user_manifest(measured_ref, shape, cases, num_classes).assign(shard="user")
    hardware = read_json(results / "hardware" / f"{args.device}.json")
    print(f"measuring {len(configs)} configs x {args.repeats} rounds", file=sys.stderr)
    traces, wall = measure_rounds(configs, args.device, device_cfg, settings, hardware, args.repeats)
    table = with_errors(predictions.merge(measured(configs, traces), on=["mode", "batch"], how="left"))

    print(f"{args.model} (input {args.input}) on {args.device}: {header}; measuring took {wall:.0f} s")
    used = sorted(set(table["predictor_latency_ms"]) | set(table["predictor_peak_mem_mb"]))
    print(f"predictors: {'; '.join(used)} ({table['predictor_choice'].iloc[0]})")
    print(f"warning: {table['family_warning'].iloc[0]}" if table["family_warning"].iloc[0] else "")
    print(markdown(table))
    print()
    reference = memory_reference_line(hardware, device_cfg["kind"], int(device_cfg["threads"]))
    for line in [*summary(table), run_noise_floor(results, args.device), reference]:
        print(line)
    for _, r in table.iterrows():
        print(f"{r['config']}: {r['breakdown']}" + (f"; notes: {r['notes']}" if r["notes"] else ""))
    if args.out:
        table.drop(columns=["family_warning"]).assign(when=header).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
