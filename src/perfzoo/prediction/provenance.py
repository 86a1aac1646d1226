"""The provenance of a prediction: the sha256 of every file it read, the chain recorded behind them (down
to the raw traces, see :func:`perfzoo.lineage.provenance_chain`), and what each predictor was fitted on."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfzoo.lineage import provenance_chain
from perfzoo.prediction.predictors import RUN_WORKFLOW, Predictor
from perfzoo.prediction.spec import ModelSpec
from perfzoo.provenance import sha256_file


@dataclass
class Sources:
    """What a prediction's numbers come from."""

    hashes: dict[str, str]  # sha256 of every file read, by its recorded path
    chain: dict[str, str]  # recorded sha256 of every file behind them
    predictors: dict[str, Any]  # target -> the predictor's record
    warnings: list[str]  # predictors fitted on another dataset than the current one


def record_key(path: Path, workdir: Path) -> str:
    """A path as the workflow records it: relative to the workflow directory when inside it."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(workdir).as_posix()
    except ValueError:
        return str(absolute)


def _inputs(
    results: Path,
    workdir: Path,
    predictors: Mapping[str, Predictor],
    fallbacks: Mapping[str, Sequence[Predictor]],
    hw_files: Mapping[str, Path],
    devices: Sequence[str],
    spec: ModelSpec,
) -> dict[str, Path]:
    """Every file a prediction reads, by its recorded path."""
    metrics, dataset = results / "evaluate" / "metrics.parquet", results / "dataset" / "dataset.parquet"
    inputs = {record_key(metrics, workdir): metrics, record_key(dataset, workdir): dataset}
    for p in (*predictors.values(), *(p for used in fallbacks.values() for p in used)):
        inputs[record_key(p.path, workdir)] = p.path
        held = p.path.with_name(f"{p.split}.predictions.parquet")
        if held.is_file():
            inputs[record_key(held, workdir)] = held
    inputs.update({record_key(hw_files[d], workdir): hw_files[d] for d in devices if d in hw_files})
    if spec.file:
        inputs[record_key(Path(spec.file), workdir)] = Path(spec.file)
    return inputs


def _predictor_record(
    p: Predictor, key: str, sha: str, fitted_on: dict[str, Any], dataset_sha: str | None
) -> dict[str, Any]:
    return {
        "path": key,
        "sha256": sha,
        "regressor": p.regressor,
        "split": p.split,
        "folds": sorted(p.folds),
        "validation_mape": p.mape,
        "validation_n": p.n_scored,
        "validation_splits": p.score_text,
        "interval": p.interval_source,
        "fitted_on": fitted_on,
        "dataset_sha256": dataset_sha,
        "code_version": p.meta.get("code_version"),
    }


def prediction_provenance(
    results: Path,
    workdir: Path,
    predictors: Mapping[str, Predictor],
    fallbacks: Mapping[str, Sequence[Predictor]],
    hw_files: Mapping[str, Path],
    devices: Sequence[str],
    spec: ModelSpec,
) -> Sources:
    """The sha256 of every file read, the recorded chain behind them, the predictor records (with, per target, the
    ``fallbacks`` some rows were predicted by), and a warning for each predictor fitted on another dataset."""
    inputs = _inputs(results, workdir, predictors, fallbacks, hw_files, devices, spec)
    hashes = {k: sha256_file(p) for k, p in sorted(inputs.items())}
    chain = provenance_chain(inputs, workdir)
    dataset_key = record_key(results / "dataset" / "dataset.parquet", workdir)
    records, warnings = {}, []
    def record(p: Predictor) -> dict[str, Any]:
        key = record_key(p.path, workdir)
        fitted_on = dict(p.meta.get("inputs", {}))
        dataset_sha = next((v for k, v in fitted_on.items() if k.endswith("dataset.parquet")), None)
        if dataset_sha is not None and dataset_sha != hashes[dataset_key]:
            warnings.append(
                f"{key} was fitted on a different {dataset_key} than the current one; "
                f"{RUN_WORKFLOW.replace('first', 'to refit')}"
            )
        return _predictor_record(p, key, hashes[key], fitted_on, dataset_sha)

    for target, p in predictors.items():
        records[target] = record(p)
        if fallbacks.get(target):  # predicted rows its own features could not: named, hashed, audited alike
            records[target]["fallbacks"] = [record(a) for a in fallbacks[target]]
    return Sources(hashes, chain, records, warnings)
