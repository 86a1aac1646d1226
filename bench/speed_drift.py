"""Where a CPU latency label's run-to-run shift comes from: the worker server or the moment, and whether a probe
measured beside the window follows it.

    python bench/speed_drift.py servers RESULTS --configs ID,ID,... [--processes A,B,norandC,norandD] [--rounds 4]
    python bench/speed_drift.py probes [--config config.yaml] [--every 2]

``servers``: the given configs of ``RESULTS/zoo/manifest.parquet`` are measured by the profiler's own isolated
workers (:func:`perfzoo.profiling.worker.run_isolated`, the run's worker settings) from several parent processes,
each with its own worker server; the parents take turns, all configs each turn, for ``--rounds`` rounds. A parent
whose name starts with ``norand`` runs under ``setarch -R`` (no address-space randomisation, inherited by its server
and workers). Printed: the effect of each parent (its mean log deviation from each config's mean) and of each
(parent, round), the spread left after each, and the latency MAPE between parents. A shift that belongs to the
server shows as a parent effect; one that belongs to the moment as a round effect shared by all parents.

``probes``: every ``--every``-th config of the zoo is measured twice (all of them, then all again), and around
each measurement this process times four probes (one intra-op thread): the best of 5 and the median of 25 runs of
a 256 x 256 GEMM, the median of 5 runs of a 512 x 512 GEMM and the median of 5 inference steps of ResNet-18 at
64 px, batch 1; the worker's own calibration probe (:mod:`perfzoo.profiling.interference`) is read from the
measurement. Printed: the latency noise floor (MAPE of the second measurement against the first) of the raw
labels and of the labels divided by each probe (geometric mean of its times before and after).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from this_checkout import use_this_checkout  # noqa: E402

ROOT = use_this_checkout()

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def median_latency(outcome: Any) -> float | None:
    return statistics.median(outcome.measurement["times_ms"]) if outcome.status == "ok" else None


# --------------------------------------------------------------------------- servers


def serve(results: Path, ids: list[str]) -> None:
    """A parent: on each line of stdin, measure every config once (JSON lines), then print DONE."""
    from worker_servers import run_settings

    from perfzoo.profiling.worker import run_isolated

    manifest = pd.read_parquet(results / "zoo" / "manifest.parquet").drop_duplicates("config_id")
    rows = manifest.set_index("config_id").loc[ids].reset_index().to_dict("records")
    settings = run_settings(results)
    for _ in sys.stdin:
        for row in rows:
            latency = median_latency(run_isolated("cpu", row, settings))
            print(json.dumps({"config_id": row["config_id"], "lat": latency, "t": time.time()}), flush=True)
        print("DONE", flush=True)


def servers(results: Path, ids: list[str], parents: list[str], rounds: int) -> pd.DataFrame:
    procs = []
    for name in parents:
        cmd = [sys.executable, __file__, "_serve", str(results), "--configs", ",".join(ids)]
        procs.append((name, subprocess.Popen((["setarch", "-R"] if name.startswith("norand") else []) + cmd,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)))
    rows = []
    for r in range(rounds):
        for name, proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            for line in proc.stdout:
                if line.startswith("DONE"):
                    break
                if line.startswith("{"):
                    rows.append({**json.loads(line), "parent": name, "round": r})
    for _, proc in procs:
        proc.stdin.close()
        proc.wait()
    return pd.DataFrame(rows)


def servers_table(d: pd.DataFrame) -> None:
    d = d.dropna(subset=["lat"]).assign(ll=lambda x: np.log(x["lat"]))
    d["dev"] = d["ll"] - d.groupby("config_id")["ll"].transform("mean")
    print("mean log deviation % per parent:", (100 * d.groupby("parent")["dev"].mean()).round(2).to_dict())
    print("per (round, parent), %:")
    print((100 * d.pivot_table(index="round", columns="parent", values="dev")).round(2).to_markdown())
    cell = d.groupby(["parent", "round"])["dev"].transform("mean")
    parent = d.groupby("parent")["dev"].transform("mean")
    print(f"sd of the deviations %: {100 * d['dev'].std():.2f}; after the parent effect "
          f"{100 * (d['dev'] - parent).std():.2f}; after the (parent, round) effect {100 * (d['dev'] - cell).std():.2f}")
    means = d.pivot_table(index="config_id", columns="parent", values="ll")
    names = list(means.columns)
    pairs = {f"{a} vs {b}": round(100 * float((np.exp((means[a] - means[b]).abs()) - 1).mean()), 2)
             for i, a in enumerate(names) for b in names[i + 1:]}
    print("latency MAPE between parents (each config's mean over rounds), %:", pairs)


# --------------------------------------------------------------------------- probes


def probes(config_path: Path, every: int) -> pd.DataFrame:
    import torch
    import torchvision

    from perfzoo.config import load_config
    from perfzoo.models.zoo import expand_zoo, manifest_frame
    from perfzoo.profiling.interference import probe_times_ms
    from perfzoo.profiling.runner import worker_settings
    from perfzoo.profiling.worker import run_isolated

    torch.set_num_threads(1)
    config = load_config(config_path)
    picked = manifest_frame(expand_zoo(config)).iloc[::every]
    settings = worker_settings(config["profiling"], config["devices"]["cpu"], config["zoo"]["num_classes"])
    a256, a512 = torch.randn(256, 256), torch.randn(512, 512)
    net, x = torchvision.models.resnet18(num_classes=10).eval(), torch.randn(1, 3, 64, 64)

    def times(fn: Any, n: int) -> list[float]:
        fn()
        out = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    def probe() -> dict[str, float]:
        gemm = times(lambda: torch.mm(a256, a256), 25)
        with torch.no_grad():
            step = times(lambda: net(x), 5)
        return {"gemm256_best5": min(gemm[:5]), "gemm256_median25": statistics.median(gemm),
                "gemm512_median5": statistics.median(times(lambda: torch.mm(a512, a512), 5)),
                "resnet18_median5": statistics.median(step)}

    run_isolated("cpu", picked.iloc[0].to_dict(), settings)  # start the worker server first
    rows = []
    for repeat in (0, 1):
        for row in picked.to_dict("records"):
            before = probe()
            outcome = run_isolated("cpu", row, settings)
            after = probe()
            if outcome.status != "ok":
                continue
            worker_gemm, _ = probe_times_ms(outcome.measurement["extra"]["interference"]["probes"])
            rows.append({"config_id": row["config_id"], "repeat": repeat, "lat": median_latency(outcome),
                         **{k: float(np.sqrt(before[k] * after[k])) for k in before},
                         "worker_gemm": worker_gemm})
    return pd.DataFrame(rows)


def probes_table(d: pd.DataFrame) -> None:
    variants = ["gemm256_best5", "gemm256_median25", "gemm512_median5", "resnet18_median5", "worker_gemm"]
    print("| label | noise floor % | median abs. pair difference % |\n|---|---|---|")
    for name in ["raw", *variants]:
        label = d["lat"] if name == "raw" else d["lat"] / d[name]
        pairs = d.assign(v=label).pivot(index="config_id", columns="repeat", values="v").dropna()
        diff = (pairs[1] / pairs[0] - 1).abs()
        print(f"| {name if name == 'raw' else 'latency / ' + name} | {100 * diff.mean():.2f} | {100 * diff.median():.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["servers", "probes", "_serve"])
    parser.add_argument("results", nargs="?", type=Path, help="servers: a finished run's results folder")
    parser.add_argument("--configs", default="", help="servers: comma-separated config ids")
    parser.add_argument("--processes", default="A,B,norandC,norandD")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--config", type=Path, default=ROOT / "config.yaml")
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--out", help="CSV of every measurement")
    args = parser.parse_args()
    if args.what == "_serve":
        serve(args.results, args.configs.split(","))
        return
    started = time.perf_counter()
    if args.what == "servers":
        if not args.results or not args.configs:
            parser.error("servers needs RESULTS and --configs")
        data = servers(args.results, args.configs.split(","), args.processes.split(","), args.rounds)
        servers_table(data)
    else:
        data = probes(args.config, args.every)
        probes_table(data)
    print(f"\n{len(data)} measurements, {time.perf_counter() - started:.0f} s")
    if args.out:
        data.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
