"""What the CPU's peak-memory label is made of: the memory reference step measured by the profiler's own
worker, with its resident set's growth split by part and by mapping.

    python bench/resident_parts.py [--repeats 3] [--top 8]

The memory reference (:mod:`perfzoo.profiling.reference`: ResNet-18 at 64 px, inference, batch 1, fixed
settings) is measured ``--repeats`` times, each in a fresh worker of the profiler's forkserver
(:func:`perfzoo.profiling.core.worker_context`) by :func:`perfzoo.profiling.measure.measure_on_cpu`, as a profile
shard measures it. The worker reads ``/proc/self/smaps`` twice (when the label's baseline is taken and when the
parts' growth is taken, right after the timed steps' phase) and sums the resident kB per mapping (a file's path, ``[heap]``, ``[anon]``
for other anonymous memory). Printed per measurement: the label (peak without file-backed pages), the whole
resident set's peak (the former label), each part's growth (anonymous, file-backed, shared) and the ``--top``
mappings that grew most. Run it at two moments (for example during a workflow's run and minutes after it) to see
which part moves. A shard also runs the calibration probes in the worker before the reference
(:mod:`perfzoo.profiling.interference`); they are not run here, so the anonymous part reads about 0.5-1.5 MB
below a shard's record of the reference.
"""

from __future__ import annotations

import argparse
import collections
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

NO_FILE = "[anon]"


def smaps_rss_kib() -> collections.Counter[str]:
    """Resident kB per mapping of this process (mappings of one file, or of one kind, summed)."""
    resident: collections.Counter[str] = collections.Counter()
    name = NO_FILE
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header: range perms offset dev inode [path]
            name = fields[5] if len(fields) >= 6 else NO_FILE
        elif fields and fields[0] == "Rss:":
            resident[name] += int(fields[1])
    return resident


def measure_in_worker(conn: Connection) -> None:
    """The worker: measure the reference as a shard does; send the measurement and the growth per mapping
    between the label's baseline and the end of the timed steps (before the step's tensors are freed)."""
    import perfzoo.profiling.measure as measure
    from perfzoo.profiling.reference import REFERENCE_SETTINGS, reference_config

    watch = measure.ResidentPeak
    snapshots: list[collections.Counter[str]] = []
    start, growth = watch.start, watch.growth_mb

    def start_and_read() -> Any:
        snapshots.append(smaps_rss_kib())
        return start()

    def growth_and_read(self: Any) -> dict[str, float]:
        snapshots.append(smaps_rss_kib())
        return growth(self)

    watch.start, watch.growth_mb = staticmethod(start_and_read), growth_and_read  # type: ignore[method-assign]
    result = measure.measure_on_cpu(reference_config(), {**REFERENCE_SETTINGS, "threads": 1, "time_ops": False})
    before, after = snapshots
    mappings = {name: (after[name] - before[name]) / 1024 for name in set(after) | set(before)}
    conn.send({"label": result.peak_mem_mb, "total": result.extra["peak_rss_total_mb"],
               "parts": result.extra["rss_growth_mb"], "mappings": mappings})
    conn.close()


def measure_once(module: Any) -> dict[str, Any]:
    from perfzoo.profiling.core import main_module_hidden, worker_context

    context = worker_context()
    receive, send = context.Pipe(duplex=False)
    with main_module_hidden():
        process = context.Process(target=module.measure_in_worker, args=(send,))
        process.start()
    send.close()
    result = receive.recv()
    process.join()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=8, help="mappings printed per measurement")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import resident_parts as module  # the worker imports its function by this name, not as __main__

    for repeat in range(args.repeats):
        r = measure_once(module)
        parts = ", ".join(f"{part} {mb:+.1f}" for part, mb in r["parts"].items())
        print(f"measurement {repeat + 1}: label {r['label']:.1f} MB (peak without file-backed pages), whole "
              f"resident set {r['total']:.1f} MB; growth by part (MB): {parts}")
        for name, mb in sorted(r["mappings"].items(), key=lambda item: -abs(item[1]))[:args.top]:
            print(f"  {mb:+8.2f} MB  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
