"""Audit: re-hash the provenance chain of any workflow output or prediction, and explain predictions.

Every perfzoo output records the sha256 of the files it was made from: Parquet files in their schema
metadata (:func:`perfzoo.provenance.read_provenance`), JSON files under ``provenance`` (hardware,
trace metadata, predictions) or ``meta`` (fitted models), the report in ``provenance.json``. The
recorded paths are relative to the workflow directory (``results/...``). :func:`audit` follows those
records recursively from one file down to the raw traces, re-hashes every file it reaches and gives each
link a status:

``OK``
    the file exists and its sha256 is the one every referring file recorded;
``CHANGED``
    the file exists but its sha256 differs from a recorded one (edited, regenerated or tampered);
``MISSING``
    the file is gone.

A prediction record also carries the flattened chain (``provenance.chain``), so the raw traces behind
it are checked even when an intermediate file (the dataset) has been deleted.

:func:`explain` lists, for a prediction, the profiled configurations nearest to the predicted one in
standardised log-feature space: the measurements the fitted predictors mostly interpolate from.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from snakemake.utils import validate

from perfzoo.config import SCHEMA
from perfzoo.io import InputError, read_parquet
from perfzoo.lineage import (
    chain_pairs,
    file_inputs,
    has_record,
    read_record,
    recorded_hashes,
    resolve,
    sidecar_record,
    workdir_hint,
)
from perfzoo.provenance import config_subset_sha, sha256_file

OK, CHANGED, MISSING = "OK", "CHANGED", "MISSING"
EXPLAIN_LABELS = ("latency_ms", "throughput", "peak_mem_mb", "mean_power_w", "energy_per_sample_j")


# --------------------------------------------------------------------------- audit


@dataclass
class Link:
    """One file of the chain: what the files referring to it recorded, and what it hashes to now."""

    key: str
    path: Path
    depth: int
    actual: str | None
    recorded: dict[str, list[str]] = field(default_factory=dict)  # sha256 -> referring files
    note: str = ""

    @property
    def status(self) -> str:
        if self.actual is None:
            return MISSING
        return OK if set(self.recorded) == {self.actual} else CHANGED

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.key,
            "resolved": str(self.path),
            "status": self.status,
            "sha256": self.actual,
            "recorded": self.recorded,
            "note": self.note,
        }


@dataclass
class AuditResult:
    """The audited file and every link of its provenance chain (first-seen order)."""

    root: Path
    links: list[Link]

    @property
    def broken(self) -> list[Link]:
        return [link for link in self.links if link.status != OK]

    @property
    def ok(self) -> bool:
        return not self.broken

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        return {"file": str(self.root), "ok": self.ok, "links": [link.to_dict() for link in self.links]}

    def to_text(self) -> str:
        lines = [f"audit of {self.root}"]
        for link in self.links:
            indent = "  " * link.depth
            line = f"{link.status:<8} {indent}{link.key}"
            by = sorted({ref for refs in link.recorded.values() for ref in refs})
            if link.status == CHANGED:
                bad = {sha: refs for sha, refs in link.recorded.items() if sha != link.actual}
                recorded = "; ".join(f"{sha[:12]}… by {', '.join(refs)}" for sha, refs in bad.items())
                line += f"  (recorded {recorded}; now {link.actual[:12] if link.actual else '-'}…)"
            elif link.status == MISSING:
                line += f"  (not found at {link.path}; recorded by {', '.join(by)})"
            if link.note:
                line += f"  [{link.note}]"
            lines.append(line)
        counts = {s: sum(link.status == s for link in self.links) for s in (OK, CHANGED, MISSING)}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        if not self.links:
            lines.append("no recorded inputs (a source file of the workflow): nothing to check")
        else:
            verdict = "chain intact" if self.ok else "chain BROKEN"
            lines.append(f"{verdict}: {len(self.links)} links ({summary})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def _sha(path: Path, cache: dict[Path, str | None]) -> str | None:
    if path not in cache:
        try:
            cache[path] = sha256_file(path) if path.is_file() else None
        except OSError:
            cache[path] = None
    return cache[path]


def _config_sha(path: Path, sections: list[str]) -> str | None:
    """sha256 of the named sections of a config file, after the schema's defaults are filled in (as
    the workflow sees it); None when the file is gone or unreadable."""
    try:
        config = yaml.safe_load(path.read_text())
        validate(config, str(SCHEMA))  # fills defaults in place
    except Exception:  # gone, not YAML or no longer valid: nothing to compare with
        return None
    return config_subset_sha(config, sections)


def _locate(
    key: str, referrer: Path, hints: list[Path], hashes: dict[Path, str | None]
) -> tuple[str, Path, str | None]:
    """(identity, resolved file, current sha256) of a recorded link; ``config.yaml#a,b.c`` links hash
    the named sections of the config file rather than the whole file."""
    file_key, _, sections = key.partition("#")
    path = Path(os.path.abspath(resolve(file_key, referrer, hints)))
    if not sections or not file_key.endswith((".yaml", ".yml")):
        return str(path), path, _sha(path, hashes)
    return f"{path}#{sections}", path, _config_sha(path, sections.split(","))


def _walk(
    root: Path, pairs: list[tuple[str, str]], hints: list[Path], root_name: str
) -> tuple[dict[str, Link], dict[Path, str | None]]:
    """Breadth-first walk of the recorded inputs, merging links that resolve to the same file."""
    links: dict[str, Link] = {}
    hashes: dict[Path, str | None] = {}
    expanded = {Path(os.path.abspath(root))}
    queue: deque[tuple[Path, list[tuple[str, str]], int, str]] = deque([(root, pairs, 0, root_name)])
    while queue:
        parent, parent_pairs, depth, parent_name = queue.popleft()
        for key, sha in parent_pairs:
            ident, path, actual = _locate(key, parent, hints, hashes)
            link = links.get(ident)
            if link is None:
                link = links[ident] = Link(key, path, depth, actual)
            refs = link.recorded.setdefault(sha, [])
            if parent_name not in refs:
                refs.append(parent_name)
            if link.actual is None or path in expanded:
                continue
            expanded.add(path)
            try:
                child = file_inputs(path)
            except InputError as exc:
                link.note = f"unreadable, its own inputs not checked: {str(exc).split(': ', 1)[-1][:120]}"
                continue
            if child:
                queue.append((path, child, depth + 1, key))
    return links, hashes


def audit(path: str | Path, workdir: str | Path | None = None) -> AuditResult:
    """Re-hash the whole provenance chain of ``path`` (a prediction JSON or any workflow output)."""
    root = Path(path)
    if not root.is_file():
        raise InputError(f"{path}: file not found")
    record = read_record(root)
    if record is None:  # a table, figure or page: its record sits next to it (report/provenance.json)
        record = sidecar_record(root)
    pairs = recorded_hashes(record) if record is not None else []
    if not pairs and not has_record(record):
        raise InputError(
            f"{path}: carries no provenance record (expected a perfzoo output: a Parquet file "
            "with provenance metadata, a JSON file with 'provenance' or 'meta', or a report file "
            "next to a provenance.json)"
        )
    hints = [Path(workdir)] if workdir is not None else workdir_hint(record)
    chain = chain_pairs(record)
    direct = recorded_hashes({"inputs": record["provenance"].get("inputs", {})}) if chain else pairs
    links, hashes = _walk(root, direct, hints, str(path))
    for key, sha in chain:  # the flattened chain a prediction carries: reaches files behind a missing one
        ident, file, actual = _locate(key, root, hints, hashes)
        link = links.get(ident)
        if link is None:
            link = links[ident] = Link(key, file, 1, actual, note="checked through the recorded chain")
        refs = link.recorded.setdefault(sha, [])
        if f"{path} (chain)" not in refs and not refs:
            refs.append(f"{path} (chain)")
    return AuditResult(root, sorted(links.values(), key=lambda link: link.depth))


# --------------------------------------------------------------------------- explain


def _prediction_record(path: Path) -> dict[str, Any]:
    record = read_record(path) if path.suffix == ".json" else None
    if not isinstance(record, Mapping) or "feature_rows" not in record or "dataset" not in record:
        raise InputError(
            f"{path}: --explain needs a prediction record (written by `perfzoo predict --output`, "
            "`perfzoo predict --json` or the workflow's results/predictions/*.json)"
        )
    return dict(record)


def _log_standardised(train: Any, query: Any) -> tuple[Any, Any]:
    """Signed log1p of both matrices, NaN imputed with the training median, standardised by training."""
    a = np.sign(train) * np.log1p(np.abs(train))
    q = np.sign(query) * np.log1p(np.abs(query))
    with np.errstate(all="ignore"):
        med = np.nanmedian(np.where(np.isfinite(a), a, np.nan), axis=0)
    med = np.where(np.isfinite(med), med, 0.0)
    a = np.where(np.isfinite(a), a, med)
    q = np.where(np.isfinite(q), q, med)
    mean, std = a.mean(axis=0), a.std(axis=0)
    std[~(std > 0)] = 1.0
    return (a - mean) / std, (q - mean) / std


def explain(path: str | Path, k: int = 5) -> Any:
    """The ``k`` profiled configurations nearest to each device row of a prediction record.

    Distance: Euclidean in the predictors' numeric feature space after signed log1p and standardisation
    by the dataset (divided by the square root of the number of features). Candidates are the dataset
    rows of the same device where it has any, else all rows. Returns a DataFrame: device, rank,
    distance, the row's identity and its measured labels.
    """
    from perfzoo.dataset.build import feature_columns  # lazy: scipy (~1 s CPU), needed by --explain only

    if int(k) < 1:
        raise InputError(f"--explain: k must be >= 1, got {k}")
    path = Path(path)
    record = _prediction_record(path)
    dataset_key = record["dataset"]["path"]
    dataset_path = resolve(dataset_key, path, workdir_hint(record))
    if not dataset_path.is_file():
        raise InputError(f"{dataset_key}: dataset of the prediction not found (looked at {dataset_path})")
    data = read_parquet(dataset_path)
    rows = pd.DataFrame.from_dict(record["feature_rows"], orient="index")
    cols = [c for c in feature_columns(data) if c in rows.columns]
    if not cols:
        raise InputError(f"{path}: no feature column in common with {dataset_key}")
    train = data[cols].apply(pd.to_numeric, errors="coerce").to_numpy(float)
    query = rows[cols].apply(pd.to_numeric, errors="coerce").to_numpy(float)
    ztrain, zquery = _log_standardised(train, query)
    out = []
    for i, device in enumerate(rows.index):
        same = (data["device"] == device).to_numpy()
        candidates = np.flatnonzero(same) if same.any() else np.arange(len(data))
        dist = np.sqrt(((ztrain[candidates] - zquery[i]) ** 2).mean(axis=1))
        order = candidates[np.argsort(dist, kind="stable")][: int(k)]
        for rank, j in enumerate(order, start=1):
            row = data.iloc[j]
            entry = {
                "device": device,
                "rank": rank,
                "distance": float(np.sqrt(((ztrain[j] - zquery[i]) ** 2).mean())),
                "row_id": row["row_id"],
                "label": row.get("label"),
                "family": row.get("family"),
                "mode": row["mode"],
                "batch": int(row["batch"]),
                "same_device": bool(same.any()),
            }
            entry.update(
                {label: float(row[label]) if label in row.index else np.nan for label in EXPLAIN_LABELS}
            )
            out.append(entry)
    table = pd.DataFrame(out)
    table.attrs.update(
        dataset=str(dataset_path),
        features=cols,
        dataset_changed=_dataset_changed(dataset_path, record["dataset"].get("sha256")),
    )
    return table


def _dataset_changed(path: Path, recorded: str | None) -> bool:
    return recorded is not None and sha256_file(path) != recorded


def format_explain(table: Any) -> str:
    """Text rendering of :func:`explain`'s table, one block per device."""
    n_features = len(table.attrs.get("features", []))
    title = f"nearest profiled configurations (standardised log-feature distance over {n_features} features"
    lines = [f"{title} of {table.attrs.get('dataset')})"]
    if table.attrs.get("dataset_changed"):
        lines.append(
            "note: the dataset changed since the prediction was made; distances use the current file"
        )
    for device, group in table.groupby("device", sort=False):
        scope = "rows of this device" if group["same_device"].iloc[0] else "all rows (device never profiled)"
        lines.append(f"device {device} ({scope}):")
        lines.append(
            f"  {'#':>2} {'distance':>8}  {'label':<28} {'mode':<9} {'batch':>5} "
            f"{'latency ms':>11} {'peak MB':>9} {'J/sample':>9}"
        )
        for r in group.itertuples():
            lines.append(
                f"  {r.rank:>2} {r.distance:>8.3f}  {str(r.label)[:28]:<28} {r.mode:<9} {r.batch:>5} "
                f"{_num(r.latency_ms):>11} {_num(r.peak_mem_mb):>9} {_num(r.energy_per_sample_j):>9}"
            )
    return "\n".join(lines)


def _num(value: float) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.4g}"
