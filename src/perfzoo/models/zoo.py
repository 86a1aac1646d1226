"""Zoo stage: expand the configured families into model configs with stable ids, and shard them."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from perfzoo.io import InputError
from perfzoo.models.builders import TOKEN_BUILDERS, accepted_kwargs
from perfzoo.models.variants import expand_entry, family_variants, has_variants

MANIFEST_COLUMNS = [
    "config_id", "model_id", "family", "builder", "name", "variant", "label", "builder_kwargs",
    "input_shape", "dtype", "batch", "mode", "shard", "precision",
]


@dataclass(frozen=True)
class ModelConfig:
    """One profiled configuration: a model with its input shape, batch size and mode."""

    config_id: str
    model_id: str
    family: str
    builder: str
    name: str
    variant: str
    label: str
    builder_kwargs: str  # canonical JSON
    input_shape: str  # JSON list, per sample (without batch)
    dtype: str
    batch: int
    mode: str
    shard: str
    precision: str = "fp32"  # fp32, tf32, fp16, bf16 or amp (perfzoo.hardware.precision)


def stable_id(payload: dict[str, Any]) -> str:
    """First 12 hex digits of the sha256 of the canonical JSON of ``payload``."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def model_entries(family: dict[str, Any]) -> list[dict[str, Any]]:
    """Normalise a family's ``models`` list into ``{name, variant, kwargs}`` dicts."""
    entries = []
    for model in family["models"]:
        if isinstance(model, str):
            model = {"name": model}
        entries.append({"name": model["name"], "variant": model.get("variant", ""), "kwargs": model.get("kwargs", {})})
    return entries


def expanded_entries(family_name: str, family: dict[str, Any]) -> list[dict[str, Any]]:
    """The family's model entries, each expanded into its ``grid:`` / ``sample:`` variants (if any);
    see :mod:`perfzoo.models.variants`. A bad grid or sample raises InputError naming family and key."""
    entries = model_entries(family)
    if not has_variants(family):
        return entries
    where = f"zoo.families.{family_name}"
    variants = family_variants(family, where)
    generated = {**dict.fromkeys(family.get("grid", {}), "grid"),
                 **dict.fromkeys(family.get("sample", {}).get("kwargs", {}), "sample.kwargs")}
    expanded = []
    for i, entry in enumerate(entries):
        accepted = accepted_kwargs(family["builder"], entry["name"])
        for key, section in generated.items():
            if accepted is not None and key not in accepted:
                raise InputError(f"{where}.{section}.{key}: {family['builder']} model {entry['name']!r} "
                                 f"takes no argument {key!r} (it takes {', '.join(accepted) or 'none'})")
        expanded += expand_entry(entry, variants, f"{where}.models[{i}]")
    return expanded


def _inputs(family: dict[str, Any]) -> Iterator[tuple[list[int], str, str]]:
    """(per-sample input shape, dtype, label suffix) for each input size of the family."""
    builder = family["builder"]
    if builder in ("torchvision", "timm"):
        for side in family.get("resolutions", [224]):
            yield [3, side, side], "float32", f"{side}px"
    elif builder in TOKEN_BUILDERS:
        for length in family.get("sequence_lengths", [128]):
            yield [length], "int64", f"seq{length}"
    else:
        shape = family.get("input_shape", [784])
        yield list(shape), "float32", "x".join(map(str, shape))


def _precisions(family: dict[str, Any]) -> list[str]:
    """The family's precisions (``precisions:``; fp32 when not given)."""
    return list(family.get("precisions", ["fp32"]))


def iter_configs(config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """All (model, input, batch, mode) configs in config order (before sharding)."""
    num_classes = config["zoo"].get("num_classes", 100)
    for family_name, family in config["zoo"]["families"].items():
        for entry in expanded_entries(family_name, family):
            kwargs = json.dumps(entry["kwargs"], sort_keys=True)
            for (shape, dtype, suffix), precision in itertools.product(_inputs(family), _precisions(family)):
                model = {
                    "family": family_name, "builder": family["builder"], "name": entry["name"],
                    "builder_kwargs": kwargs, "input_shape": json.dumps(shape), "dtype": dtype,
                    "num_classes": num_classes,
                }
                # fp32 configs keep the ids they had before precision was a dimension
                model_id = stable_id(model if precision == "fp32" else {**model, "precision": precision})
                variant = entry["variant"]
                label = f"{entry['name']}{'-' + variant if variant else ''}@{suffix}"
                label += "" if precision == "fp32" else f"/{precision}"
                for batch in family.get("batch_sizes", [1]):
                    for mode in family.get("modes", ["inference", "training"]):
                        config_id = stable_id({"model_id": model_id, "batch": batch, "mode": mode})
                        yield {**model, "model_id": model_id, "config_id": config_id, "variant": variant,
                               "label": label, "batch": int(batch), "mode": mode, "precision": precision}


def shard_name(index: int) -> str:
    return f"s{index:04d}"


def shard_names(n_configs: int, shard_size: int) -> list[str]:
    return [shard_name(i) for i in range(math.ceil(n_configs / shard_size))]


def shard_size(config: dict[str, Any], n_configs: int) -> int:
    """Configs per shard: ``shards.size``, or what gives each device ``shards.jobs_per_device`` jobs."""
    shards = config.get("shards", {})
    if shards.get("jobs_per_device"):
        return max(math.ceil(n_configs / shards["jobs_per_device"]), 1)
    return shards.get("size", 16)


def expand_zoo(config: dict[str, Any]) -> list[ModelConfig]:
    """The full manifest: configs in order, consecutive groups of the shard size form a shard."""
    configs = list(iter_configs(config))
    size = shard_size(config, len({c["config_id"] for c in configs}))
    rows = []
    seen: set[str] = set()
    for cfg in configs:
        if cfg["config_id"] in seen:
            continue
        seen.add(cfg["config_id"])
        cfg.pop("num_classes")
        rows.append(ModelConfig(shard=shard_name(len(rows) // size), **cfg))
    return rows


def manifest_frame(configs: list[ModelConfig]) -> pd.DataFrame:
    return pd.DataFrame([asdict(c) for c in configs], columns=MANIFEST_COLUMNS)


def shard_configs(manifest: pd.DataFrame, shard: str) -> pd.DataFrame:
    return manifest[manifest["shard"] == shard].reset_index(drop=True)
