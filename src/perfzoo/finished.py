"""Finished outputs survive their rerun until the replacement is complete.

Snakemake deletes a job's outputs before the job starts, so a forced rerun of a profiling shard that
is killed midway would lose a complete shard's measurements. After each successful job the finished
files are therefore also kept, as hard links (a copy where links are impossible), in a ``.finished/``
folder beside them; they are replaced only once the new outputs are complete. A killed rerun leaves the
previous complete shard there (and its own finished rows in the journal, from which the next run
resumes).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from perfzoo.io import atomic_path

FOLDER = ".finished"


def kept_path(output: str | os.PathLike[str]) -> Path:
    """Where the last complete version of ``output`` is kept."""
    path = Path(output)
    return path.parent / FOLDER / path.name


def keep_finished(outputs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Keep the just-completed ``outputs`` (each replacing its previous kept version atomically)."""
    kept = []
    for output in outputs:
        target = kept_path(output)
        with atomic_path(target) as tmp:
            tmp.unlink()
            try:
                os.link(output, tmp)
            except OSError:  # another file system, or links not allowed: a copy
                shutil.copy2(output, tmp)
        kept.append(target)
    return kept


def remove_stale_temporaries(outputs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Delete temporary files a killed earlier run of the same job left beside its outputs
    (``.<name>.<random>.tmp``, see :func:`perfzoo.io.atomic_path`); only this job writes those names."""
    removed = []
    for output in outputs:
        path = Path(output)
        if not path.parent.is_dir():
            continue
        for stale in path.parent.glob(f".{path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
            removed.append(stale)
    return removed
