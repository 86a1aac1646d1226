"""The quantities of one input row: each target predicted, derived from others, or missing with the reason.

Derived quantities. Throughput = batch / latency when no throughput predictor exists; energy per step =
power x latency when no energy predictor exists; energy per sample = energy / batch; EDP = energy x
latency (J·s, per step); cost per 1000 samples = price_per_hour x time for 1000 samples; carbon per 1000
samples = energy x carbon_intensity_g_per_kwh. A quantity whose inputs are missing is missing, with the
reason; it is never reported as 0.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.io import one_line
from perfzoo.prediction.devices import DeviceSettings
from perfzoo.prediction.predictors import TARGETS, Predictor, TargetPrediction

Quantities = dict[str, dict[str, Any]]  # quantity name -> {value, lo, hi, source, interval} or {..., missing}

QUANTITIES = (*TARGETS, "cost_per_1k_samples", "carbon_g_per_1k_samples")

UNITS = {
    "latency_ms": "ms", "throughput": "samples/s", "peak_mem_mb": "MB", "mean_power_w": "W", "energy_j": "J",
    "energy_per_sample_j": "J", "edp": "J·s", "cost_per_1k_samples": "price units",
    "carbon_g_per_1k_samples": "g CO2e",
}  # fmt: skip


def quantity(value: float, lo: float, hi: float, source: str, interval: str) -> dict[str, Any]:
    """A predicted or derived quantity with its interval and where it comes from."""
    return {"value": float(value), "lo": float(lo), "hi": float(hi), "source": source, "interval": interval}


def missing(reason: str) -> dict[str, Any]:
    """A quantity that cannot be given, with the reason (never 0)."""
    return {"value": math.nan, "lo": math.nan, "hi": math.nan, "missing": reason}


def present(q: dict[str, Any] | None) -> bool:
    """Whether ``q`` holds a finite value (not missing)."""
    return q is not None and "missing" not in q and math.isfinite(q["value"])


def target_predictions(X: pd.DataFrame, predictors: Mapping[str, Predictor]) -> dict[str, TargetPrediction | str]:
    """target -> its predictor's answer over the rows of X, or the reason it failed."""
    out: dict[str, TargetPrediction | str] = {}
    for target, pred in predictors.items():
        try:  # overflow far outside the training range gives inf, reported per quantity
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                out[target] = pred.predict(X)
        except Exception as exc:  # noqa: BLE001 - a predictor that cannot handle these rows is reported
            out[target] = f"{pred.path}: prediction failed ({one_line(exc)})"
    return out


def label_gaps(data: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(device, target) pairs the dataset has rows for but no label of: why the label is missing there."""
    gaps = {}
    for device, rows in data.groupby("device"):
        for target in TARGETS:
            if target not in rows.columns or (pd.to_numeric(rows[target], errors="coerce") > 0).any():
                continue
            reason = "no measurement on this device"
            if "energy_missing_reason" in rows.columns and target not in (
                "latency_ms",
                "throughput",
                "peak_mem_mb",
            ):
                why = [r for r in rows["energy_missing_reason"].dropna().unique() if str(r).strip()]
                reason = f"not measured on {device}: {why[0]}" if len(why) else reason
            gaps[(str(device), target)] = reason
    return gaps


def _predicted(
    i: int,
    device: str,
    tp: Mapping[str, TargetPrediction | str],
    predictors: Mapping[str, Predictor],
    missing_targets: Mapping[str, str],
    gaps: Mapping[tuple[str, str], str],
) -> Quantities:
    """Every target of row ``i`` as its predictor gave it, or missing with the reason."""
    q: Quantities = {}
    for target in TARGETS:
        if (device, target) in gaps:
            q[target] = missing(gaps[(device, target)])
        elif target in missing_targets:
            q[target] = missing(missing_targets[target])
        elif target not in tp:
            q[target] = missing("no fitted predictor")
        elif isinstance(answer := tp[target], str):
            q[target] = missing(answer)
        else:
            point, lo, hi, method = answer
            given_by = answer.given_by(i, predictors[target])  # the chosen predictor, or a fallback for this row
            if answer.why_missing(i):  # a feature its predictor uses is missing, no fallback has them
                q[target] = missing(answer.why_missing(i) + "; no other fitted predictor has every feature it uses")
            elif not (math.isfinite(point[i]) and point[i] > 0):
                why = "a number > 0" if math.isfinite(point[i]) else "a finite number (it overflows this far"
                why += "" if math.isfinite(point[i]) else " outside the profiled range)"
                q[target] = missing(f"{given_by.path} predicted {point[i]:.4g} instead of {why}")
            else:
                q[target] = quantity(point[i], lo[i], hi[i], given_by.source, method)
    return q


def derive(q: Quantities, name: str, how: str, f: Callable[..., float], *inputs: dict[str, Any]) -> None:
    """``q[name] = f(inputs)``; f is monotone in each input, so its interval spans the values at the
    inputs' lower and upper ends."""
    at_lo, at_hi = f(*(x["lo"] for x in inputs)), f(*(x["hi"] for x in inputs))
    q[name] = quantity(
        f(*(x["value"] for x in inputs)), min(at_lo, at_hi), max(at_lo, at_hi), f"derived: {how}",
        "propagated from the intervals of its inputs",
    )  # fmt: skip


def _derive_time_and_energy(
    q: Quantities, device: str, gaps: Mapping[tuple[str, str], str], batch: int
) -> None:
    """Throughput, energy per step and per sample, and EDP from the others where not predicted."""
    lat = q["latency_ms"]
    if not present(q["throughput"]) and present(lat) and (device, "throughput") not in gaps:
        derive(q, "throughput", "batch / latency_ms", lambda t: batch * 1000 / t, lat)
    if not present(q["energy_j"]) and (device, "energy_j") not in gaps:
        if present(q["mean_power_w"]) and present(lat):
            derive(
                q, "energy_j", "mean_power_w x latency_ms", lambda w, t: w * t / 1e3, q["mean_power_w"], lat
            )
        elif present(q["energy_per_sample_j"]):
            derive(
                q, "energy_j", "energy_per_sample_j x batch", lambda e: e * batch, q["energy_per_sample_j"]
            )
        else:
            q["energy_j"] = missing(
                f"needs an energy_j or mean_power_w prediction: {q['mean_power_w'].get('missing')}"
            )
    if not present(q["energy_per_sample_j"]) and present(q["energy_j"]):
        derive(q, "energy_per_sample_j", "energy_j / batch", lambda e: e / batch, q["energy_j"])
    if not present(q["edp"]) and present(q["energy_j"]) and present(lat):
        derive(
            q,
            "edp",
            "energy_j x latency_ms / 1000 (J·s per step)",
            lambda e, t: e * t / 1e3,
            q["energy_j"],
            lat,
        )
    elif not present(q["edp"]):
        q["edp"] = missing(f"needs energy and latency: {q['energy_j'].get('missing') or lat.get('missing')}")


def _derive_cost_and_carbon(
    q: Quantities, device: str, batch: int, settings: DeviceSettings, config_path: str | None
) -> None:
    """Cost and carbon per 1000 samples from the device's price and carbon intensity."""
    lat = q["latency_ms"]
    price = settings.price_per_hour
    if price is None:
        where = config_path or "the config"
        q["cost_per_1k_samples"] = missing(
            f"no devices.{device}.price_per_hour in {where} or its hardware JSON"
        )
    elif present(lat):
        k = float(price) * 1000 / batch / 3.6e6  # price per ms, for 1000 samples
        derive(
            q, "cost_per_1k_samples", f"price_per_hour {price} x time of 1000 samples", lambda t: t * k, lat
        )
    else:
        q["cost_per_1k_samples"] = missing(f"needs latency: {lat.get('missing')}")
    ci = float(settings.carbon_intensity_g_per_kwh)
    if present(q["energy_per_sample_j"]):
        g_per_j = 1000 * ci / 3.6e6  # for 1000 samples
        derive(
            q, "carbon_g_per_1k_samples", f"energy x carbon intensity {ci:g} g/kWh", lambda e: e * g_per_j,
            q["energy_per_sample_j"],
        )  # fmt: skip
    else:
        q["carbon_g_per_1k_samples"] = missing(f"needs energy: {q['energy_per_sample_j'].get('missing')}")


def row_quantities(
    i: int,
    device: str,
    tp: Mapping[str, TargetPrediction | str],
    predictors: Mapping[str, Predictor],
    missing_targets: Mapping[str, str],
    gaps: Mapping[tuple[str, str], str],
    batch: int,
    settings: DeviceSettings,
    config_path: str | None,
) -> Quantities:
    """Every quantity of one input row (predicted, derived, or missing with the reason)."""
    q = _predicted(i, device, tp, predictors, missing_targets, gaps)
    _derive_time_and_energy(q, device, gaps, batch)
    _derive_cost_and_carbon(q, device, batch, settings, config_path)
    return q


def with_roofline(X: pd.DataFrame) -> pd.DataFrame:
    """``X`` with the roofline features the predictors were fitted with."""
    # lazy: perfzoo.dataset.build imports scipy (~1 s CPU), which loads while the featurising child runs
    from perfzoo.dataset.build import add_roofline_features

    return add_roofline_features(X.copy())
