"""Does a disturbed window's re-measurement need the wait before it? Back-to-back windows of the same step.

    python bench/retry_wait.py                      # every 4th config of the default zoo, 16 windows each
    python bench/retry_wait.py --every 8 --windows 6   # a quick check that it runs
    python bench/retry_wait.py --journals run/results/traces/cpu/*.journal.jsonl.kept   # offline: idle seconds

The profile rule re-measures a window the interference policy finds disturbed after ``wait_s`` (10 s in the
default config) and holds every core meanwhile, so each re-measurement idles the machine for ``wait_s``. The wait
helps only if a disturbance lasts: then a window right after a disturbed one is disturbed more often than any
window. Here each picked config's worker is started and kept (as the profile rule's held workers are,
:func:`perfzoo.profiling.worker.start_held`), and times the same step in ``--windows`` windows back to back,
each judged by the config's interference policy (:func:`perfzoo.profiling.interference.assess`: the spread of
its iterations, other processes' CPU time, steal time, the worker's own CPU share). Printed, pooled over the
configs:

* how often any window is disturbed, and how often one is when the window before it (no wait) was, and when
  the last window at least ``wait_s`` earlier was (the window the profile rule would take after its wait);
* the same, left out the configs disturbed in more than half their windows (a step whose iterations are
  spread by itself, which no wait changes).

``--out`` writes every window (config, index, start and end time, reasons) as CSV.

``--journals`` measures nothing: for each kept profile journal (``results/traces/<device>/<shard>.journal.jsonl``,
copied before the profile rule deletes it) it prints the attempts, the re-measurements, the seconds spent
measuring (every attempt's start to its end, worker start and model build included), the span from the first
attempt's start to the last one's end, and the idle seconds between attempts (the waits the shard slept
through).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from this_checkout import use_this_checkout  # noqa: E402

ROOT = use_this_checkout()

import pandas as pd  # noqa: E402

from perfzoo.config import load_config  # noqa: E402
from perfzoo.models.zoo import expand_zoo, manifest_frame  # noqa: E402
from perfzoo.profiling.interference import Policy, assess, probe_baseline  # noqa: E402
from perfzoo.profiling.runner import per_window, worker_settings  # noqa: E402
from perfzoo.profiling.worker import start_held  # noqa: E402


def back_to_back_windows(config: dict[str, Any], settings: dict[str, Any], n: int,
                         baseline: dict[str, Any] | None, policy: Policy) -> list[dict[str, Any]]:
    """``n`` windows of one config's step in one held worker, back to back, each with its verdict."""
    rows: list[dict[str, Any]] = []
    started = time.time()
    outcome, worker = start_held("cpu", config, per_window(settings))
    for index in range(n):
        if index:
            started = time.time()
            outcome = worker.again()
        if outcome.status != "ok":
            rows.append({"config_id": config["config_id"], "window": index, "status": outcome.status})
            return rows
        verdict = assess(outcome.measurement, baseline, policy)
        rows.append({"config_id": config["config_id"], "label": config.get("label", ""), "window": index,
                     "status": "ok", "started": started, "finished": time.time(),
                     "disturbed": bool(verdict.interference), "reasons": verdict.interference})
    worker.close()
    return rows


def conditional_rates(windows: pd.DataFrame, wait_s: float) -> dict[str, float]:
    """Share of disturbed windows: all; after a disturbed one (no wait); at least ``wait_s`` after a disturbed one
    (the first window that starts ``wait_s`` or more after it ends), with the pairs counted."""
    right_after, after_wait = [], []
    for _, group in windows[windows["status"] == "ok"].groupby("config_id"):
        group = group.sort_values("window").reset_index(drop=True)
        for i in group.index[group["disturbed"]]:
            if i + 1 < len(group):
                right_after.append(bool(group.at[i + 1, "disturbed"]))
            later = group[group["started"] >= group.at[i, "finished"] + wait_s]
            if len(later):
                after_wait.append(bool(later["disturbed"].iloc[0]))
    ok = windows[windows["status"] == "ok"]
    return {"windows": len(ok), "disturbed %": 100 * ok["disturbed"].mean(),
            "pairs right after": len(right_after),
            "disturbed right after a disturbed one %": 100 * sum(right_after) / max(len(right_after), 1),
            "pairs after the wait": len(after_wait),
            "disturbed after the wait %": 100 * sum(after_wait) / max(len(after_wait), 1)}


def journal_idle(path: Path) -> dict[str, Any]:
    """Attempts, re-measurements, measuring, span and idle seconds of one kept profile journal."""
    entries = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    attempts = sorted((a for e in entries for chain in [e.get("attempts") or []]
                       + [w.get("attempts") or [] for w in e.get("later_windows") or []] for a in chain),
                      key=lambda a: a["started"])
    windows = sum(1 + len(e.get("later_windows") or []) for e in entries)
    return {"journal": str(path), "windows": windows, "re-measurements": len(attempts) - windows,
            "measuring s": sum(a["finished"] - a["started"] for a in attempts),
            "span s": max(a["finished"] for a in attempts) - attempts[0]["started"],
            "idle s": sum(max(0.0, b["started"] - a["finished"]) for a, b in zip(attempts, attempts[1:]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    parser.add_argument("--device", default="cpu", help="a cpu device of the config (its threads are used)")
    parser.add_argument("--every", type=int, default=4, help="every N-th config of the zoo")
    parser.add_argument("--windows", type=int, default=16, help="back-to-back windows per config")
    parser.add_argument("--out", help="CSV of every window")
    parser.add_argument("--journals", nargs="+", type=Path, help="offline: kept profile journals")
    args = parser.parse_args()
    if args.journals:
        print(pd.DataFrame([journal_idle(path) for path in args.journals]).to_markdown(index=False, floatfmt=".1f"))
        return
    config = load_config(args.config)
    device = config["devices"][args.device]
    settings = worker_settings(config["profiling"], device, config["zoo"]["num_classes"])
    policy = Policy.from_settings(settings)
    baseline = probe_baseline("cpu", int(device["threads"]))
    picked = manifest_frame(expand_zoo(config)).iloc[::args.every]
    started = time.perf_counter()
    windows = pd.DataFrame([row for spec in picked.to_dict("records")
                            for row in back_to_back_windows(spec, settings, args.windows, baseline, policy)])
    print(f"{len(picked)} configs x {args.windows} back-to-back windows, wait_s {policy.wait_s:g}; "
          f"{time.perf_counter() - started:.0f} s in all\n")
    ok = windows[windows["status"] == "ok"]
    share = ok.groupby("config_id")["disturbed"].mean()
    steady = windows[windows["config_id"].isin(share.index[share <= 0.5])]
    table = pd.DataFrame({"all configs": conditional_rates(windows, policy.wait_s),
                          "configs disturbed in <= half their windows": conditional_rates(steady, policy.wait_s)})
    print(table.to_markdown(floatfmt=".1f"))
    reasons = ok.loc[ok["disturbed"], "reasons"].str.replace(r"[\d.]+x", "Nx", regex=True).value_counts()
    print("\nreasons of the disturbed windows:\n" + reasons.to_string())
    if args.out:
        windows.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
