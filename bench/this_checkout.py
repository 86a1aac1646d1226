"""Run a benchmark on its own checkout's perfzoo, in its process and in every interpreter it starts.

The profiler's worker server is a new interpreter: without ``PYTHONPATH`` it imports the installed perfzoo, which may
be another checkout's, so a benchmark run from a second worktree would measure the main checkout's code. A benchmark
that starts workers calls :func:`use_this_checkout` before importing perfzoo (``bench/`` is the script's own folder,
first on the module search path, so ``from this_checkout import use_this_checkout`` needs no set-up)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def use_this_checkout() -> Path:
    """Put this checkout's ``src`` first on the module search path and on ``PYTHONPATH``; return the checkout."""
    src = str(ROOT / "src")
    sys.path.insert(0, src)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    return ROOT
