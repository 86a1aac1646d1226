"""Imported last by the worker server (:data:`perfzoo.profiling.core.PRELOAD`), for its side effect only: every
object the server's imports made (torch's, timm's, ...) goes into the garbage collector's permanent generation.

A worker is a fork of the server. Without this, the worker's first full collection (the measurement's own
``gc.collect()`` before its memory baseline) walks all of them and writes to each object's header, which copies
every page holding one (copy on write): a few tenths of a second per worker, spent before anything is measured.
Frozen, they are skipped; a worker's collections walk only its own objects. The standard library's advice for a
process that forks without exec (:func:`gc.freeze`). Measured side by side: ``bench/RESULTS.md``, "The worker
server's imports frozen for the garbage collector".

Last, the server says that its imports are made, by creating the file :data:`perfzoo.profiling.core.READY_ENV`
names, where its starter asked for one (:func:`perfzoo.profiling.core.start_worker_servers`; a starter that stopped
waiting has removed the file's folder, and the server goes on without saying it)."""

import contextlib
import gc
import os

from perfzoo.profiling.core import READY_ENV

gc.collect()
gc.freeze()
if ready := os.environ.pop(READY_ENV, None):  # popped: the server's workers inherit its environment
    with contextlib.suppress(FileNotFoundError):
        open(ready, "x").close()
