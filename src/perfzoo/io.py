"""Atomic file output (temp file in the same folder + rename), checked input and one-line error text."""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import yaml


class InputError(ValueError):
    """Bad input: the message names the file, key or model at fault."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first non-empty line of the message``, cut to ``limit`` characters, for one-line errors."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:limit]


def suggest(name: str, choices: Iterable[str], n: int = 3) -> str:
    """A ' (did you mean: a, b?)' hint with the closest names, or '' when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=n, cutoff=0.6)
    return f" (did you mean: {', '.join(close)}?)" if close else ""


def umask_file_mode() -> int:
    """The mode a plain ``open(path, "w")`` would give a new file: 0o666 less the process umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    The file gets the mode the umask allows (0644 under umask 022), so a shared project folder can read it.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, umask_file_mode())  # mkstemp creates 0600; outputs follow the umask like any tool's
    finally:
        os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_parquet(path: str | os.PathLike[str], df: pd.DataFrame) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def read_parquet(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a Parquet file; a truncated or corrupt file raises InputError naming it."""
    try:
        return pd.read_parquet(path)
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise InputError(f"{path}: unreadable or corrupted Parquet file ({type(exc).__name__}: {exc})") from None


def read_json(path: str | os.PathLike[str]) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: corrupted JSON ({exc})") from None


def read_yaml(path: str | os.PathLike[str], what: str = "YAML file") -> Any:
    """Parse a YAML file; a missing or malformed file is an InputError naming it (``what`` says what it is)."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
