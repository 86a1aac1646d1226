"""Start-up timing of ``perfzoo predict``: with ``PERFZOO_TIMING=1``, wall and CPU seconds since the
interpreter started, printed on stderr at each stage."""

from __future__ import annotations

import os
import resource
import sys
import time

try:  # interpreter start, for PERFZOO_TIMING
    import psutil

    START = psutil.Process().create_time()
except Exception:  # noqa: BLE001 - psutil missing or restricted: time from this import on
    START = time.time()


def timing(label: str) -> None:
    """With ``PERFZOO_TIMING=1``: wall and CPU seconds since interpreter start, on stderr."""
    if os.environ.get("PERFZOO_TIMING"):
        wall = time.time() - START
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"perfzoo timing: {wall:6.2f} s wall {cpu.ru_utime + cpu.ru_stime:6.2f} s CPU  {label}",
            file=sys.stderr,
        )
