"""Reading the provenance a file records (Parquet metadata, JSON documents, ``provenance.json`` sidecars)
and following it back to the raw traces: which ``(path, sha256)`` inputs a file names, where a recorded
path lies now, and the whole chain behind a set of inputs. :mod:`perfzoo.auditing` re-hashes what this
module reads; :mod:`perfzoo.prediction.provenance` stores the chain in every prediction.
"""

from __future__ import annotations

import json
import os
import re
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from perfzoo.io import InputError
from perfzoo.provenance import read_provenance

HEX64 = re.compile(r"^[0-9a-f]{64}$")
_PATH_SUFFIXES = (".parquet", ".json", ".jsonl", ".csv", ".py", ".yaml", ".yml", ".png", ".html", ".tsv")
#: keys of big or unrelated sections that never hold provenance records
_SKIP_KEYS = frozenset({"folds", "payload", "features", "feature_rows", "table", "devices", "warnings"})

def _looks_like_path(key: str) -> bool:
    key = key.partition("#")[0]  # ``config.yaml#zoo``: a section of a file
    return "/" in key or key.endswith(_PATH_SUFFIXES)


def recorded_hashes(obj: Any) -> list[tuple[str, str]]:
    """Every ``(path, sha256)`` pair recorded in a provenance structure, in document order."""
    pairs: list[tuple[str, str]] = []

    def walk(node: Any, depth: int) -> None:
        if depth > 8:
            return
        if isinstance(node, Mapping):
            for key, value in node.items():
                if isinstance(value, str) and HEX64.match(value) and _looks_like_path(str(key)):
                    pairs.append((str(key), value))
                elif key not in _SKIP_KEYS:
                    walk(value, depth + 1)
        elif isinstance(node, list):
            for value in node:
                walk(value, depth + 1)

    if isinstance(obj, Mapping) and isinstance(obj.get("provenance"), Mapping):
        walk(obj["provenance"], 0)
    elif isinstance(obj, Mapping) and isinstance(obj.get("meta"), Mapping):
        walk(obj["meta"], 0)
    else:
        walk(obj, 0)
    return pairs


def read_record(path: str | Path) -> Any:
    """The provenance-bearing document of ``path``: Parquet schema metadata or the JSON document."""
    path = Path(path)
    if path.suffix == ".parquet":
        return read_provenance(path)
    if path.suffix == ".json":
        try:
            return json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: unreadable JSON ({type(exc).__name__}: {exc})") from None
    return None


def file_inputs(path: str | Path) -> list[tuple[str, str]] | None:
    """Recorded ``(path, sha256)`` inputs of a file; None for a file type that carries none."""
    record = read_record(path)
    return None if record is None else recorded_hashes(record)


def has_record(record: Any) -> bool:
    """Whether a document carries a provenance record at all (possibly with no inputs)."""
    if not isinstance(record, Mapping) or not record:
        return False
    return any(key in record for key in ("provenance", "meta", "inputs"))


def workdir_hint(record: Any) -> list[Path]:
    if isinstance(record, Mapping):
        prov = record.get("provenance")
        if isinstance(prov, Mapping) and isinstance(prov.get("workdir"), str):
            return [Path(prov["workdir"])]
    return []


def resolve(key: str, referrer: Path, hints: Iterable[Path] = ()) -> Path:
    """Where the recorded path ``key`` lies: relative paths are tried against every ancestor folder of
    the referring file, then the hints (the recorded workflow directory) and the current directory."""
    p = Path(key)
    if p.is_absolute():
        return p
    # the referring file's own tree first: the nearest ancestor holding the file, or its top folder
    # (``results/``) when the file is gone; then the recorded workflow folder and the current one
    for bases in (Path(os.path.abspath(referrer)).parents, [*(Path(h) for h in hints), Path.cwd()]):
        for base in bases:
            if (base / p).exists() or (len(p.parts) > 1 and (base / p.parts[0]).is_dir()):
                return base / p
    return Path.cwd() / p


def sidecar_record(path: Path) -> Any:
    """The part of the nearest ``provenance.json`` (this folder or up to two above) that describes
    ``path``: its ``tables``/``figures`` entry named like the file, else the whole record."""
    for folder in [path.parent, *path.parents][:3]:
        sidecar = folder / "provenance.json"
        if sidecar.is_file():
            record = read_record(sidecar)
            for section in ("tables", "figures"):
                entry = record.get(section, {}).get(path.stem) if isinstance(record, Mapping) else None
                if isinstance(entry, Mapping):
                    return {"inputs": entry}
            return record
    return None


def chain_pairs(record: Any) -> list[tuple[str, str]]:
    """The ``provenance.chain`` (and ``traces``) pairs of a prediction record."""
    prov = record.get("provenance") if isinstance(record, Mapping) else None
    if not isinstance(prov, Mapping):
        return []
    return [
        (k, v)
        for part in ("chain", "traces")
        if isinstance(prov.get(part), Mapping)
        for k, v in prov[part].items()
        if isinstance(v, str) and HEX64.match(v)
    ]


def provenance_chain(inputs: Mapping[str, Path | str], workdir: str | Path) -> dict[str, str]:
    """``{path: sha256}`` of every file behind ``inputs``, as recorded in provenance metadata (recursive).

    Used by :mod:`perfzoo.prediction.provenance` so that a prediction carries the hashes of the raw traces
    behind it.
    Files are not re-hashed here, only their records read.
    """
    chain: dict[str, str] = {}
    seen: set[Path] = set()
    queue: deque[Path] = deque(Path(p) for p in inputs.values())
    while queue:
        path = Path(os.path.abspath(queue.popleft()))
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            pairs = file_inputs(path) or []
        except InputError:
            continue
        for key, sha in pairs:
            chain.setdefault(key, sha)
            queue.append(resolve(key, path, [Path(workdir)]))
    return dict(sorted(chain.items()))
