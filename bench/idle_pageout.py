"""Does a pause change a CPU measurement? The memory reference's sister config measured back to back and after idling.

    python bench/idle_pageout.py RESULTS

ResNet-18 at 64 px, inference, batch 4 (the config of ``RESULTS/zoo/manifest.parquet``), measured by the profiler's
own isolated worker (the run's settings) once from a new worker server, three times back to back, then
after 90 s and after 150 s of idling, each followed by one more measurement at once. Printed per measurement: the
median and first timed iteration, the memory label and the file-backed pages the step mapped (``rss_growth_mb``).
The question is whether the kernel's reclaim of pages not accessed for a while (this VM runs DAMON's ``pageout``
scheme, ``/sys/kernel/mm/damon/admin/kdamonds/0/contexts/0/schemes/0``) shows in what a measurement after a pause
maps or how fast it runs.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import pandas as pd  # noqa: E402

from perfzoo.profiling.worker import run_isolated  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from worker_servers import run_settings  # noqa: E402



def main() -> None:
    results = Path(sys.argv[1])
    settings = run_settings(results)
    manifest = pd.read_parquet(results / "zoo" / "manifest.parquet")
    row = manifest[(manifest["name"] == "resnet18") & (manifest["mode"] == "inference")
                   & (manifest["batch"] == 4)].iloc[0].to_dict()

    def measure(what: str) -> None:
        m = run_isolated("cpu", row, settings).measurement
        print(f"| {what} | {statistics.median(m['times_ms']):.2f} | {m['times_ms'][0]:.2f} | {m['peak_mem_mb']:.2f} | "
              f"{m['extra']['rss_growth_mb']['file']:.1f} |", flush=True)

    print("| measurement | median ms | first timed ms | label MB | file-backed growth MB |")
    print("|---|---|---|---|---|")
    measure("first from a new server")
    for i in range(3):
        measure(f"back to back {i + 1}")
    for pause in (90, 150):
        time.sleep(pause)
        measure(f"after {pause} s idle")
        measure("at once after it")


if __name__ == "__main__":
    main()
