"""Reader of timm's benchmark CSV files (``results/benchmark-*.csv`` of pytorch-image-models).

timm's ``benchmark.py`` writes one row per model (columns documented in timm's ``results/README``):

* inference: ``model, infer_img_size, infer_samples_per_sec, infer_step_time`` (ms per batch),
  ``infer_batch_size, param_count, infer_gmacs, infer_macts``;
* training: ``model, train_samples_per_sec, train_step_time, train_batch_size, train_img_size,
  param_count``.

Each row becomes long-format measurements for ``perfzoo.dataset.external`` (latency in ms per batch and
throughput in samples/s, both as measured; timm's own parameter and MAC counts are not used). A model that
timm's script could not measure has its reason in an ``error`` column and no times: it becomes no
measurement, only a :class:`NotMeasured` record (named, with that reason), never a number. The model is
named ``timm:<name>`` so the import builds it with timm (torchvision has different models of the same
names), and its family is the timm module that defines it (``timm.models.resnet`` → ``resnet``,
``vision_transformer``), read from timm's model registry. The device, precision and software stack are
not in the file; they are given by the caller (the file name, e.g.
``benchmark-infer-amp-nchw-pt291-cu130-5090.csv``, suggests them: :func:`describe_file`).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from perfzoo.io import InputError
from perfzoo.models.builders import timm_renamed_models

MODES = {"infer": "inference", "train": "training"}
REQUIRED = {
    "inference": ("model", "infer_img_size", "infer_samples_per_sec", "infer_step_time", "infer_batch_size"),
    "training": ("model", "train_img_size", "train_samples_per_sec", "train_step_time", "train_batch_size"),
}
FILE_NAME = re.compile(r"benchmark-(?P<mode>infer|train)-(?P<precision>[a-z0-9]+)-(?P<layout>nchw|nhwc)-"
                       r"(?P<torch>pt\d+)-(?P<backend>cu\d+|cpu)-(?P<device>.+?)(-dynamo)?$")


@dataclass(frozen=True)
class TimmFile:
    """What a timm benchmark file's name says: mode, precision, device token and software stack."""

    mode: str
    precision: str
    device: str
    software: str


@dataclass(frozen=True)
class NotMeasured:
    """A row of a timm file without times: its ``error`` column says why."""

    model: str
    resolution: str
    batch: str
    reason: str


def describe_file(path: str | Path) -> TimmFile | None:
    """Mode, precision, device token and ``pt<ver>-<backend>`` of a timm benchmark file name, or None."""
    match = FILE_NAME.search(Path(path).stem)
    if match is None:
        return None
    return TimmFile(MODES[match["mode"]], match["precision"], match["device"],
                    f"{match['torch']}-{match['backend']}")


def timm_family(name: str) -> str:
    """The timm module that defines the model (its architecture family), or '' for an unknown name."""
    import timm.models  # lazy: seconds to import; only names of never-featurised models need it

    base = timm_renamed_models().get(name, name).split(".", 1)[0]  # a former name: the architecture's now
    if not timm.models.is_model(base):  # e.g. a name timm removed (the training file's convnext_nano_hnf)
        return ""
    return timm.models.model_entrypoint(base).__module__.rsplit(".", 1)[-1]


def _mode_of(header: list[str], path: Path) -> str:
    for mode, columns in REQUIRED.items():
        if all(c in header for c in columns):
            return mode
    raise InputError(f"{path}: not a timm benchmark file (needs the columns {', '.join(REQUIRED['inference'])} "
                     f"or {', '.join(REQUIRED['training'])})")


def read_timm_rows(path: str | Path, device: str, precision: str, software: str = ""
                   ) -> tuple[list[tuple[int, int, dict[str, str]]], list[NotMeasured]]:
    """(1-based data row, file line, long-format row) for the latency and throughput of every measured
    model, and the models the file records as not measured (``error`` set, no step time)."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            records = list(csv.DictReader(handle))
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    if not records:
        raise InputError(f"{path}: no data rows")
    mode = _mode_of(list(records[0]), path)
    prefix = "infer" if mode == "inference" else "train"
    rows, not_measured = [], []
    for n, record in enumerate(records, start=1):
        name = record["model"].strip()
        reason = (record.get("error") or "").strip()
        if reason and not (record[f"{prefix}_step_time"] or "").strip():
            not_measured.append(NotMeasured(name, record[f"{prefix}_img_size"], record[f"{prefix}_batch_size"], reason))
            continue
        common = {"model": f"timm:{name}", "device": device, "batch": record[f"{prefix}_batch_size"],
                  "mode": mode, "precision": precision, "n_gpus": "1", "family": timm_family(name),
                  "resolution": record[f"{prefix}_img_size"], "software": software}
        rows.append((n, n + 1, {**common, "metric": "latency", "value": record[f"{prefix}_step_time"],
                                "unit": "ms"}))
        rows.append((n, n + 1, {**common, "metric": "throughput", "value": record[f"{prefix}_samples_per_sec"],
                                "unit": "samples/s"}))
    return rows, not_measured
