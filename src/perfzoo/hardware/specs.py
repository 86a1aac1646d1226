"""GPU spec-sheet table (``data/gpu_specs.csv``) and lookup by table name or NVML device name.

Columns: ``name``; ``match`` (case-insensitive regular expression searched in the NVML name);
``arch`` (Volta, Turing, Ampere, Ada, Hopper, Blackwell: TF32 and BF16 tensor cores need Ampere or
newer); ``peak_fp32_tflops`` (non-tensor FP32); ``peak_tf32_tflops``, ``peak_fp16_tflops`` and
``peak_bf16_tflops`` (dense tensor-core peaks, i.e. without structured sparsity; FP16/BF16 with FP32
accumulate, which is what PyTorch uses, so GeForce cards show half their FP16-accumulate figure; empty
where the GPU has no such unit, or where the source does not state the figure);
``mem_gb``; ``mem_bw_gbs``; ``sm_count``; ``tdp_w`` (maximum board power); ``min_power_w`` (lowest
settable power limit where documented, else empty: NVML's limit constraints, read at run time, are the
authority); ``source`` (the NVIDIA datasheet or whitepaper the row comes from); ``note`` (how a figure
was read, or why one is missing).
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache
from importlib import resources
from typing import Any

import pandas as pd

from perfzoo.io import InputError

SPEC_COLUMNS: tuple[str, ...] = (
    "name",
    "match",
    "arch",
    "peak_fp32_tflops",
    "peak_tf32_tflops",
    "peak_fp16_tflops",
    "peak_bf16_tflops",
    "mem_gb",
    "mem_bw_gbs",
    "sm_count",
    "tdp_w",
    "min_power_w",
    "source",
    "note",
)
NUMERIC_COLUMNS: tuple[str, ...] = SPEC_COLUMNS[3:-2]
TEXT_COLUMNS: dict[str, type] = {"name": str, "match": str, "arch": str, "source": str, "note": str}
PACKAGE_DATA = ("data/gpu_specs.csv",)  # a literal: perfzoo.depends reads it without importing
SPEC_FILE = PACKAGE_DATA[0]


@lru_cache(maxsize=1)
def _load() -> pd.DataFrame:
    path = resources.files("perfzoo").joinpath(SPEC_FILE)
    with resources.as_file(path) as csv_path:
        table = pd.read_csv(csv_path, dtype=TEXT_COLUMNS, keep_default_na=False, na_values={
            c: [""] for c in NUMERIC_COLUMNS})
    missing = [c for c in SPEC_COLUMNS if c not in table.columns]
    if missing:
        raise InputError(f"{SPEC_FILE}: missing columns {missing}")
    for column in NUMERIC_COLUMNS:
        table[column] = pd.to_numeric(table[column], errors="raise").astype("float64")
    return table[list(SPEC_COLUMNS)]


def load_gpu_specs() -> pd.DataFrame:
    """The spec table, one row per GPU model (a fresh copy)."""
    return _load().copy()


def _row_dict(row: pd.Series) -> dict[str, Any]:
    return {k: (None if pd.isna(v) else v) for k, v in row.items()}


def _normalise(name: str) -> str:
    """Lower case, vendor and brand words dropped, separators as spaces (for close-name hints)."""
    words = re.split(r"[\s_-]+", name.lower())
    return " ".join(w for w in words if w and w not in {"nvidia", "tesla", "geforce", "quadro"})


def lookup_gpu(name: str) -> dict[str, Any]:
    """Spec row for a table name (e.g. 'A100 SXM4 40GB') or an NVML name (e.g. 'NVIDIA A100-SXM4-40GB').

    Missing values are None. A name that matches no row raises InputError listing close table names;
    one that matches several rows raises InputError naming them.
    """
    table = _load()
    exact = table[table["name"].str.lower() == name.strip().lower()]
    if len(exact) == 1:
        return _row_dict(exact.iloc[0])
    hits = table[[re.search(p, name, flags=re.IGNORECASE) is not None for p in table["match"]]]
    if len(hits) == 1:
        return _row_dict(hits.iloc[0])
    if len(hits) > 1:
        raise InputError(f"GPU '{name}' matches several rows of {SPEC_FILE}: {list(hits['name'])}")
    hint = close_names(name)
    close = "; close names: " + ", ".join(hint) if hint else ""
    raise InputError(f"GPU '{name}' is not in {SPEC_FILE}{close}")


def close_names(name: str, n: int = 3) -> list[str]:
    """Spec-table names close to ``name``: rows sharing a model number first ('3090 Ti' → 'RTX 3090'),
    then by string similarity of the names without vendor words."""
    names = list(_load()["name"])
    query = _normalise(name)
    numbers = set(re.findall(r"[a-z]*\d+[a-z]*", query))
    shared = [t for t in names if numbers & set(re.findall(r"[a-z]*\d+[a-z]*", _normalise(t)))]
    shared.sort(key=lambda t: -difflib.SequenceMatcher(None, query, _normalise(t)).ratio())
    normalised = {_normalise(t): t for t in names}
    similar = [normalised[c] for c in difflib.get_close_matches(query, list(normalised), n=n, cutoff=0.3)]
    return list(dict.fromkeys([*shared, *similar]))[:n]
