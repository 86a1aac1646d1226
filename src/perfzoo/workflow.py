"""Glue for the thin rule scripts: log redirection and one-line errors for bad input."""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable
from typing import Any

from perfzoo.finished import remove_stale_temporaries
from perfzoo.io import InputError


def run_step(snakemake: Any, step: Callable[[], None]) -> None:
    """Run ``step`` with stderr in the rule's log; bad input ends the job with one clear line."""
    real_stderr = sys.stderr
    remove_stale_temporaries(getattr(snakemake, "output", []))  # left by a killed earlier attempt
    with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):
        try:
            step()
        except InputError as exc:
            print(f"perfzoo: error: {exc}", file=log)
            print(f"perfzoo: error: {exc}", file=real_stderr)
            sys.exit(1)
        except Exception:  # a bug or an unforeseen failure: the full traceback goes to the rule's log too
            traceback.print_exc(file=log)
            raise
