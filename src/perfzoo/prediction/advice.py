"""Advice from the predicted quantities: the recommended device for an objective, the smallest MIG profile
that fits a GPU model (tables in :mod:`perfzoo.hardware.mig`), and the power cap with the lowest predicted energy
that meets the latency target."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from perfzoo.hardware.specs import lookup_gpu
from perfzoo.io import InputError
from perfzoo.hardware.mig import recommend_mig, resolve_mig_gpu
from perfzoo.prediction.bounds import RangeCheck
from perfzoo.prediction.devices import DeviceSettings
from perfzoo.prediction.predictors import Predictor
from perfzoo.prediction.quantities import (
    UNITS,
    Quantities,
    present,
    row_quantities,
    target_predictions,
    with_roofline,
)

OBJECTIVES = {
    "time": "latency_ms",
    "energy": "energy_per_sample_j",
    "edp": "edp",
    "cost": "cost_per_1k_samples",
}


@dataclass
class PredictionContext:
    """What every device's quantities and advice of one prediction share."""

    predictors: Mapping[str, Predictor]
    missing: Mapping[str, str]  # target -> why it has no predictor
    gaps: Mapping[tuple[str, str], str]  # (device, target) -> why the dataset has no label there
    batch: int
    objective: str
    latency_target_ms: float | None
    out_of_range: RangeCheck | None = None


def _gpu_names(settings: DeviceSettings, hw: Mapping[str, Any] | None) -> list[Any]:
    """Names the device's GPU may go by, most specific first."""
    spec_row = (hw or {}).get("spec")
    names = [
        (hw or {}).get("name"),
        spec_row.get("name") if isinstance(spec_row, Mapping) else None,
        settings.spec,
        settings.gpu_name,
    ]
    if settings.spec:
        try:
            names.insert(2, lookup_gpu(settings.spec)["name"])
        except InputError:
            pass
    return names


def mig_advice(
    settings: DeviceSettings,
    hw: Mapping[str, Any] | None,
    q: Quantities,
    latency_target_ms: float | None,
) -> dict[str, Any] | None:
    """recommend_mig for a cuda device whose GPU has MIG profile tables; None for other devices."""
    if settings.kind != "cuda":
        return None
    names = _gpu_names(settings, hw)
    gpu = None
    for name in filter(None, names):
        try:
            gpu = resolve_mig_gpu(str(name))
            break
        except InputError:
            continue
    if gpu is None:
        return {"profile": None, "reason": f"no MIG profile table for GPU {next(filter(None, names), '?')!r}"}
    mem, lat = q["peak_mem_mb"], q["latency_ms"]
    if not present(mem):
        return {"gpu": gpu, "profile": None, "reason": f"no peak memory prediction: {mem.get('missing')}",
                **mig_state(hw)}
    target = latency_target_ms if present(lat) else None
    return {**recommend_mig(gpu, mem["value"], lat["value"] if present(lat) else None, target), **mig_state(hw)}


def mig_state(hw: Mapping[str, Any] | None) -> dict[str, Any]:
    """Whether the profiled GPU has MIG on (``mig_mode`` of its hardware record: enabled, disabled, or None with
    ``mig_state`` saying why it is not known), so that advice to run in a MIG profile says what it takes."""
    mode = (hw or {}).get("mig_mode")
    if mode == "enabled":
        return {"mig_mode": mode, "mig_state": "MIG is enabled on the profiled GPU"}
    if mode == "disabled":
        return {"mig_mode": mode, "mig_state": "MIG is disabled on the profiled GPU: enabling it "
                                               "(nvidia-smi -i <index> -mig 1) needs an idle GPU and may need a reset"}
    identity = (hw or {}).get("identity") or {}
    why = (identity.get("missing") or {}).get("mig_mode")
    return {"mig_mode": None, "mig_state": f"MIG mode not read: {why}" if why else
            "MIG mode not recorded in the hardware record (measured before perfzoo read it)"}


def _power_limit_columns(predictors: Mapping[str, Predictor]) -> list[str]:
    """The power-limit features of the energy predictors."""
    energy = [predictors[t] for t in ("energy_per_sample_j", "energy_j", "mean_power_w") if t in predictors]
    return sorted({c for p in energy for c in p.feature_names if "power_limit" in c})


def power_cap(
    device: str,
    row: dict[str, Any],
    settings: DeviceSettings,
    q: Quantities,
    ctx: PredictionContext,
) -> dict[str, Any] | None:
    """Power limit of ``devices.<d>.power_limits_w`` with the lowest predicted energy (EDP for objective
    edp) that meets the latency target; needs energy predictors with a power-limit feature."""
    limits = [float(x) for x in settings.power_limits_w]
    if not limits:
        return None
    if not present(q["energy_per_sample_j"]):
        return {
            "power_cap_w": None,
            "reason": f"no energy prediction: {q['energy_per_sample_j'].get('missing')}",
        }
    cols = _power_limit_columns(ctx.predictors)
    if not cols:
        return {
            "power_cap_w": None,
            "reason": "the energy predictors have no power-limit feature (the dataset holds "
            "no power-limit sweep), so energy cannot be predicted per cap",
        }
    X = pd.DataFrame([{**row, **{c: limit for c in cols}} for limit in limits])
    tp = target_predictions(with_roofline(X), ctx.predictors)
    metric = "edp" if ctx.objective == "edp" else "energy_per_sample_j"
    options = []
    for i, limit in enumerate(limits):
        qi = row_quantities(i, device, tp, ctx.predictors, ctx.missing, ctx.gaps, ctx.batch, settings, None)
        ok_latency = ctx.latency_target_ms is None or (
            present(qi["latency_ms"]) and qi["latency_ms"]["value"] <= ctx.latency_target_ms
        )
        options.append(
            {
                "power_limit_w": limit,
                metric: qi[metric]["value"],
                "latency_ms": qi["latency_ms"]["value"],
                "meets_latency_target": ok_latency,
            }
        )
    usable = [o for o in options if o["meets_latency_target"] and math.isfinite(o[metric])]
    if not usable:
        return {"power_cap_w": None, "reason": "no power limit meets the latency target", "options": options}
    best = min(usable, key=lambda o: o[metric])
    return {
        "power_cap_w": best["power_limit_w"],
        "metric": metric,
        "reason": f"lowest predicted {metric}",
        "options": options,
    }


def _exclusion(
    q: Quantities | None, metric: str, latency_target_ms: float | None, memory_mb: float | None
) -> str | None:
    """Why a device cannot be recommended, or None."""
    if q is None:
        return "no prediction for this device"
    m = q[metric]
    if not present(m):
        return f"{metric} missing: {m.get('missing')}"
    mem = q["peak_mem_mb"]
    if present(mem) and memory_mb is not None and mem["value"] > memory_mb:
        return f"predicted peak memory {mem['value']:.0f} MB exceeds the device's {memory_mb:.0f} MB"
    if (
        latency_target_ms is not None
        and present(q["latency_ms"])
        and q["latency_ms"]["value"] > latency_target_ms
    ):
        return (
            f"predicted latency {q['latency_ms']['value']:.4g} ms exceeds the target "
            f"{latency_target_ms:g} ms"
        )
    return None


def recommend(
    devices: Sequence[str],
    quantities: Mapping[str, Quantities],
    objective: str,
    latency_target_ms: float | None,
    memory_mb: Mapping[str, float],
) -> dict[str, Any]:
    """The device with the lowest predicted metric of ``objective`` among those that fit in memory and
    meet the latency target; the ranking, the excluded devices with why, and whether it is uncertain."""
    metric = OBJECTIVES[objective]
    excluded: dict[str, str] = {}
    ranked = []
    for d in devices:
        why = _exclusion(quantities.get(d), metric, latency_target_ms, memory_mb.get(d))
        if why is not None:
            excluded[d] = why
        else:
            ranked.append((quantities[d][metric]["value"], d))
    ranked.sort()
    result: dict[str, Any] = {
        "objective": objective,
        "metric": metric,
        "device": None,
        "ranking": [d for _, d in ranked],
        "excluded": excluded,
        "latency_target_ms": latency_target_ms,
    }
    if not ranked:
        result["reason"] = "no device qualifies (see 'excluded' for why each device was left out)"
        return result
    best = ranked[0][1]
    b = quantities[best][metric]
    result.update(
        device=best,
        value=b["value"],
        lo=b["lo"],
        hi=b["hi"],
        unit=UNITS[metric],
        reason=f"lowest predicted {metric} among {len(ranked)} device(s)",
    )
    if len(ranked) > 1:
        second = quantities[ranked[1][1]][metric]
        overlap = math.isfinite(b["hi"]) and math.isfinite(second["lo"]) and b["hi"] >= second["lo"]
        result["runner_up"] = ranked[1][1]
        result["intervals_overlap"] = bool(overlap)
        if overlap:
            result["reason"] += f"; its interval overlaps {ranked[1][1]}'s, so the ranking is uncertain"
    return result
