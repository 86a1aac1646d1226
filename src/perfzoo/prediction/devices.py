"""The devices of a prediction: the workflow config and hardware files they come from, their settings
(kind, price, carbon intensity, power limits) and the predictors' input row of each."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from perfzoo.hardware import hardware_calibration, hardware_features
from perfzoo.io import InputError, suggest
from perfzoo.prediction.predictors import RUN_WORKFLOW

DEFAULT_CARBON_INTENSITY = 400.0  # g CO2e / kWh, the config schema's default


@dataclass(frozen=True)
class DeviceSettings:
    """A device's config entry as prediction uses it (values as written in the config)."""

    kind: str = "unknown"
    spec: str | None = None  # row of the GPU spec table
    gpu_name: str | None = None
    price_per_hour: float | None = None
    carbon_intensity_g_per_kwh: float = DEFAULT_CARBON_INTENSITY
    power_limits_w: Sequence[float] = ()


def device_kind(device_cfg: Mapping[str, Any], hw: Mapping[str, Any] | None) -> str:
    """cuda, cpu, ... from the config entry, else the hardware JSON; ``unknown`` without either."""
    return str(device_cfg.get("kind") or (hw or {}).get("kind") or "unknown")


def device_settings(device_cfg: Mapping[str, Any], hw: Mapping[str, Any] | None) -> DeviceSettings:
    """The device's config entry, with price and carbon intensity falling back to its hardware JSON
    (which records them from the config of the run that measured it) and the schema default."""
    settings = {k: v for k, v in device_cfg.items() if v is not None}
    for key in ("price_per_hour", "carbon_intensity_g_per_kwh"):
        if settings.get(key) is None and (hw or {}).get(key) is not None:
            settings[key] = hw[key]  # type: ignore[index]
    return DeviceSettings(
        kind=device_kind(settings, hw),
        spec=settings.get("spec"),
        gpu_name=settings.get("gpu_name"),
        price_per_hour=settings.get("price_per_hour"),
        carbon_intensity_g_per_kwh=settings.get("carbon_intensity_g_per_kwh", DEFAULT_CARBON_INTENSITY),
        power_limits_w=tuple(settings.get("power_limits_w") or ()),
    )


def load_config(config: Any, results: Path) -> tuple[dict[str, Any], str | None]:
    """(config dict, its path); the default 'config.yaml' may be absent (devices then come from results)."""
    if isinstance(config, Mapping):
        return dict(config), None
    path = Path(config)
    if not path.is_file() and str(config) == "config.yaml":
        path = results.resolve().parent / "config.yaml"
        if not path.is_file():
            return {}, None
    try:
        loaded = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{config}: config file not found") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{config}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("devices", {}), dict):
        raise InputError(f"{config}: expected a mapping with a 'devices' mapping")
    return loaded, str(path)


def select_devices(requested: Any, configured: Mapping[str, Any], hardware: Mapping[str, Path]) -> list[str]:
    """The devices to predict: those requested (checked), else every configured one, else every one
    with a hardware file."""

    known = sorted(configured) if configured else sorted(hardware)
    if requested is None or requested == "" or requested == []:
        if not known:
            raise InputError(
                f"no devices: no config 'devices:' and no results/hardware/*.json; {RUN_WORKFLOW}"
            )
        return known
    names = [
        d.strip() for d in (requested.split(",") if isinstance(requested, str) else requested) if d.strip()
    ]
    if not names:
        raise InputError(
            f"--devices: no device named in {requested!r}; known devices: {', '.join(known) or 'none'}"
        )
    for name in names:
        if name not in configured and name not in hardware:
            raise InputError(
                f"--devices: unknown device {name!r}{suggest(name, [*configured, *hardware])}; "
                f"known devices: {', '.join(known) or 'none'}"
            )
    return list(dict.fromkeys(names))


def device_row(
    device: str, hw: dict[str, Any] | None, feats: dict[str, Any], batch: int, mode: str, model_id: str,
    precision: str = "fp32",
) -> dict[str, Any] | str:
    """The predictors' input row of ``device`` at ``precision``, or the reason it cannot be built.

    The precision's hardware features are the dataset's (:func:`perfzoo.dataset.build.precision_hardware`):
    ``hw_tensor_cores``, and the measured GEMM rate of that precision as ``hw_peak_gflops``."""
    # lazy: perfzoo.dataset.build imports scipy (~1 s CPU), which loads while the featurising child runs
    from perfzoo.dataset.build import MODEL_FEATURES, precision_hardware
    from perfzoo.features.op_kinds import OP_ERROR_COLUMN, OP_FEATURES

    FEATURE_ERROR_COLUMNS = ("graph_error", "sim_error", OP_ERROR_COLUMN)  # why a group of features is missing

    if hw is None:
        return (
            f"no results/hardware/{device}.json (run `snakemake --cores all results/hardware/{device}.json`)"
        )
    try:
        hw_cols = {**hardware_features(hw), **hardware_calibration(hw)}
    except (KeyError, TypeError, ValueError) as exc:
        return f"results/hardware/{device}.json lacks hardware feature {exc}"
    row = {k: feats[k] for k in (*MODEL_FEATURES, *OP_FEATURES, *FEATURE_ERROR_COLUMNS) if k in feats}
    row.update(batch=batch, is_training=float(mode == "training"), **hw_cols)
    at_precision = precision_hardware(hw, precision)
    peak = at_precision.get("hw_peak_gflops")  # absent at fp32: the device's fp32 rate above stands
    if peak is not None and math.isnan(peak):
        return f"results/hardware/{device}.json has no measured {precision} GEMM rate (precision {precision})"
    row.update(at_precision)
    # the power limit in force: a hardware feature of datasets with a power-limit sweep
    limit = hw.get("power_limit_w")
    row["hw_power_limit_w"] = float(limit) if isinstance(limit, int | float) else math.nan
    row.update(device=device, model_id=model_id, mode=mode)
    return row
