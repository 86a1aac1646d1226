"""Provenance of every numeric output: input hashes, config subset, code and package versions."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from perfzoo.io import InputError, atomic_path

PACKAGES = ("perfzoo", "torch", "torchvision", "timm", "numpy", "pandas", "pyarrow", "scikit-learn",
            "xgboost", "snakemake", "nvidia-ml-py")
METADATA_KEY = b"perfzoo.provenance"


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.cache
def code_version() -> str:
    """``git describe --always --dirty`` of the checkout the package runs from, else the package version."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], cwd=root,
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"perfzoo {importlib.metadata.version('perfzoo')}" if _installed("perfzoo") else "unknown"


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@functools.cache
def package_versions() -> dict[str, str]:
    return {p: importlib.metadata.version(p) for p in PACKAGES if _installed(p)}


CONFIG_FILE = "config.yaml"


def config_section(config: Any, dotted: str) -> Any:
    """The value at a dotted key of a config (``devices.cpu0``); None where absent."""
    node = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def config_subset_sha(config: Any, sections: list[str]) -> str:
    """sha256 of the canonical JSON of the named (dotted) sections of a config."""
    subset = {s: config_section(config, s) for s in sections}
    return hashlib.sha256(json.dumps(subset, sort_keys=True, default=str).encode()).hexdigest()


def config_link(config: Any, sections: list[str], name: str = CONFIG_FILE) -> dict[str, str]:
    """``{"config.yaml#a,b.c": sha256}``: the provenance link of the config subset a rule reads."""
    return {f"{name}#{','.join(sections)}": config_subset_sha(config, sections)}


def provenance(
    inputs: list[str | Path], config: dict[str, Any] | None = None, links: dict[str, str] | None = None
) -> dict[str, Any]:
    """The provenance record of an output made from ``inputs`` with ``config``; ``links`` adds
    already-hashed links (the config subset, see :func:`config_link`)."""
    return {
        "inputs": {**{str(p): sha256_file(p) for p in sorted(map(str, inputs))}, **(links or {})},
        "config": config or {},
        "code_version": code_version(),
        "packages": package_versions(),
    }


def write_table(path: str | Path, df: pd.DataFrame, prov: dict[str, Any]) -> None:
    """Write Parquet atomically with the provenance record in the file's schema metadata."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[METADATA_KEY] = json.dumps(prov, sort_keys=True, default=str).encode()
    with atomic_path(path) as tmp:
        pq.write_table(table.replace_schema_metadata(meta), tmp)


def read_provenance(path: str | Path) -> dict[str, Any]:
    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception as exc:
        raise InputError(f"{path}: unreadable Parquet file ({exc})") from None
    return json.loads(meta[METADATA_KEY]) if METADATA_KEY in meta else {}
