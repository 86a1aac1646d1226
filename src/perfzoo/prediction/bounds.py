"""Physical bounds and the training range of a prediction: what ``perfzoo predict`` may claim.

A fitted regressor knows nothing of physics; far outside its training data it can predict a peak memory
smaller than the input tensor or a step time faster than the device's arithmetic allows. Two checks
bound what is said:

- **Physical floors**: peak memory is at least the input batch plus the weights (both must be resident);
  a step takes at least its FLOPs at the device's measured peak GEMM rate (the roofline's compute
  term). Throughput is capped by the same time floor. A prediction below a floor is raised to it and
  says so.
- **Physical ceiling**: peak memory cannot exceed the device's memory (``hw_mem_gb``): the interval is
  capped there, and a point prediction above it says that the step would not fit (it would run out of
  memory) instead of quoting a number the device cannot hold.
- **Training range**: the regressor's 90 % interval was calibrated on held-out rows inside the profiled
  range of FLOPs, parameters and batch, and of operator calls per step of each kind (a model calling a kind
  more often than any profiled config of its mode, e.g. a recurrent net's many small matrix products,
  lies outside it; a kind no profiled config ran is named by ``composed`` itself). Up to one decade beyond it the interval is widened by the
  factor the model lies outside (both ends, the floor still holding); further out, or for a mode never
  profiled, the prediction is *out of range*: its interval is replaced by ``[physical floor,
  unbounded)`` and marked, and a recommendation resting on such a number says so in its reason.
- **Warnings**: a mode, FLOPs, parameter count or batch outside the profiled range, a model family or a
  device never profiled (:func:`range_warnings`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from perfzoo.features.op_kinds import OP_FEATURE_KINDS
from perfzoo.prediction.predictors import TargetPrediction
from perfzoo.prediction.spec import ModelSpec

MIB = float(1 << 20)
RANGE_COLUMNS = ("flops", "params", "batch")
WIDEN_UP_TO_DECADES = 1.0  # beyond this distance from the profiled range: out of range
OP_CALL_COLUMNS = {name: kind for name, (kind, stat) in OP_FEATURE_KINDS.items() if stat == "count"}


@dataclass
class RangeCheck:
    """Where a model lies relative to the profiled range: the reasons and the distance in decades."""

    reasons: list[str] = field(default_factory=list)
    decades: float = 0.0

    @property
    def out_of_range(self) -> bool:
        return bool(self.reasons) and self.decades > WIDEN_UP_TO_DECADES

    @property
    def widened(self) -> bool:
        return bool(self.reasons) and not self.out_of_range

    def text(self) -> str:
        return "; ".join(self.reasons)


def memory_floor_mb(row: Mapping[str, Any]) -> float:
    """Input batch plus weights, in MiB (NaN when either is unknown)."""
    total = _num(row.get("input_bytes")) + _num(row.get("weight_bytes"))
    return total / MIB if math.isfinite(total) and total > 0 else math.nan


def memory_ceiling_mb(row: Mapping[str, Any]) -> float:
    """The device's memory in MiB (NaN when unknown)."""
    gb = _num(row.get("hw_mem_gb"))
    return gb * 1024 if math.isfinite(gb) and gb > 0 else math.nan


def time_floor_ms(row: Mapping[str, Any]) -> float:
    """The step's FLOPs at the device's measured peak rate, in ms (NaN when unknown)."""
    flops, gflops = _num(row.get("flops")), _num(row.get("hw_peak_gflops"))
    if not (math.isfinite(flops) and math.isfinite(gflops)) or flops <= 0 or gflops <= 0:
        return math.nan
    return flops / (gflops * 1e9) * 1e3


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


@dataclass(frozen=True)
class Outside:
    """A number of the model (``column``: FLOPs, parameters or batch) outside its profiled ``[lo, hi]``."""

    column: str
    value: float
    lo: float
    hi: float

    @property
    def decades(self) -> float:
        """How far outside, in decades of the nearer end."""
        if self.value > self.hi:
            return math.log10(self.value / self.hi)
        return math.log10(self.lo / self.value) if self.value > 0 else math.inf


def outside_profiled(feats: Mapping[str, Any], batch: int, same_mode: pd.DataFrame, data: pd.DataFrame
                     ) -> list[Outside]:
    """The model's FLOPs (against ``same_mode``, the profiled rows of its mode), parameters and batch (against
    every profiled row) that lie outside the profiled range, in :data:`RANGE_COLUMNS` order; a number unknown,
    or not profiled, is not compared."""
    values = {"flops": feats.get("flops"), "params": feats.get("params"), "batch": batch}
    outside = []
    for col in RANGE_COLUMNS:
        ref = pd.to_numeric((same_mode if col == "flops" else data).get(col), errors="coerce")
        ref = ref.dropna() if ref is not None else pd.Series(dtype=float)
        v = _num(values[col])
        if not len(ref) or not math.isfinite(v):
            continue
        lo, hi = float(ref.min()), float(ref.max())
        if not lo <= v <= hi:
            outside.append(Outside(col, v, lo, hi))
    return outside


def range_check(feats: Mapping[str, Any], batch: int, mode: str, data: pd.DataFrame) -> RangeCheck:
    """Whether and how far the model lies outside the profiled range (FLOPs of the same mode, parameters,
    batch, operator calls of each kind)."""
    check = RangeCheck()
    same_mode = data[data["mode"] == mode] if "mode" in data.columns else data
    if same_mode.empty:
        return RangeCheck([f"mode {mode!r} was never profiled"], math.inf)
    for out in outside_profiled(feats, batch, same_mode, data):
        check.reasons.append(f"{out.column} {out.value:.3g} outside the profiled [{out.lo:.3g}, {out.hi:.3g}]")
        check.decades = max(check.decades, out.decades)
    for reason, decades in operator_call_excess(feats, same_mode):
        check.reasons.append(reason)
        check.decades = max(check.decades, decades)
    return check


def operator_call_excess(feats: Mapping[str, Any], profiled: pd.DataFrame) -> list[tuple[str, float]]:
    """(reason, decades beyond) for each operator kind the model calls more often per step than any
    profiled config of ``profiled``; kinds the model does not call, or no profiled config called, are
    not compared."""
    excess = []
    for column, kind in OP_CALL_COLUMNS.items():
        calls = _num(feats.get(column))
        if column not in profiled.columns or not calls > 0:
            continue
        most = float(pd.to_numeric(profiled[column], errors="coerce").max())
        if math.isfinite(most) and 0 < most < calls:
            excess.append((f"{kind} operators: {calls:.0f} calls per step, profiled at most {most:.0f}",
                           math.log10(calls / most)))
    return excess


def bound_predictions(
    tp: Mapping[str, TargetPrediction | str], X: pd.DataFrame, check: RangeCheck
) -> dict[str, TargetPrediction | str]:
    """Raise latency and peak memory (point and interval) to their physical floors, cap throughput at
    the time floor, widen intervals a little outside the profiled range and replace them by
    ``[floor, inf)`` far outside it."""
    floors = {
        "latency_ms": np.array([time_floor_ms(r) for _, r in X.iterrows()], dtype=float),
        "peak_mem_mb": np.array([memory_floor_mb(r) for _, r in X.iterrows()], dtype=float),
    }
    batch = pd.to_numeric(X.get("batch"), errors="coerce").to_numpy(dtype=float) if len(X) else np.array([])
    out = dict(tp)
    for target, value in tp.items():
        if isinstance(value, str):
            continue
        point, lo, hi = (np.asarray(v, dtype=float) for v in (value.point, value.lo, value.hi))
        method = value.method
        floor = floors.get(target)
        if check.widened:
            factor = 10**check.decades
            lo, hi = lo / factor, hi * factor
            method = f"{method}; widened x{factor:.3g} outside the profiled range ({check.text()})"
        if floor is not None:
            point, lo, hi = (_kept_missing(a, np.fmax(a, floor)) for a in (point, lo, hi))
            method = _floored(method, floor, value.point)
        if target == "throughput":
            ceiling = batch * 1000 / floors["latency_ms"]
            point, lo, hi = (_kept_missing(a, np.fmin(a, ceiling)) for a in (point, lo, hi))
        if check.out_of_range:
            lo = (
                np.where(np.isfinite(floor), floor, np.nan)
                if floor is not None
                else np.full_like(point, np.nan)
            )
            hi = np.full_like(point, np.inf)
            method = f"out of range ({check.text()}): the 90 % interval does not hold"
        if target == "peak_mem_mb":
            point, lo, hi, method = _capped_at_device_memory(point, lo, hi, method, X)
        out[target] = replace(value, point=point, lo=lo, hi=hi, method=method)
    return out


def _capped_at_device_memory(
    point: np.ndarray, lo: np.ndarray, hi: np.ndarray, method: Any, X: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """Cap the memory interval at the device's memory; a point above it means the step does not fit."""
    ceiling = np.array([memory_ceiling_mb(r) for _, r in X.iterrows()], dtype=float)
    over = np.isfinite(ceiling) & (point > ceiling)
    if bool(np.any(over)):
        gib = float(np.nanmin(ceiling[over])) / 1024
        method = (
            f"{method}; above the device's {gib:.3g} GiB of memory: the step would not fit (out of memory)"
        )
    lo, hi = _kept_missing(lo, np.fmin(lo, ceiling)), _kept_missing(hi, np.fmin(hi, ceiling))
    return point, lo, hi, method


def _kept_missing(value: np.ndarray, bounded: np.ndarray) -> np.ndarray:
    """``bounded`` where ``value`` is known; a missing value (an interval without calibration) stays
    missing instead of becoming the bound."""
    return np.where(np.isnan(value), np.nan, bounded)


def _floored(method: Any, floor: np.ndarray, raw: Any) -> Any:
    """The method text, noting when a physical floor raised the prediction."""
    raised = np.asarray(raw, dtype=float) < floor
    return f"{method}; raised to its physical floor" if bool(np.any(raised)) else method


def mark_out_of_range(quantities: dict[str, dict[str, Any]], check: RangeCheck) -> None:
    """Flag every present quantity (derived ones included) of an out-of-range model."""
    if not check.out_of_range:
        return
    for q in quantities.values():
        if "missing" not in q:
            q["out_of_range"] = check.text()


def qualify_recommendation(rec: dict[str, Any], quantities: Mapping[str, Mapping[str, Any]]) -> None:
    """A recommendation resting on an out-of-range prediction says so in its own reason."""
    device = rec.get("device")
    if not device:
        return
    why = quantities[device][rec["metric"]].get("out_of_range")
    if why:
        rec["out_of_range"] = why
        rec["reason"] = (
            f"OUT OF RANGE, unreliable: rests on a prediction outside the profiled range ({why}); "
            + rec["reason"]
        )


# --------------------------------------------------------------------------- warnings


def _prefix(name: str) -> str:
    m = re.match(r"[a-z]+", name.lower())
    return m.group(0) if m else ""


def family_profiled(candidates: Sequence[str], data: pd.DataFrame) -> bool:
    """Whether a model named ``candidates`` (its name, its class) belongs to a profiled family."""
    families = {str(f).lower() for f in data.get("family", pd.Series(dtype=str)).dropna().unique()}
    names = {str(n).lower() for n in data.get("name", pd.Series(dtype=str)).dropna().unique()}
    names |= {
        str(label).split("@")[0].split("-")[0].lower()
        for label in data.get("label", pd.Series(dtype=str)).dropna()
    }
    stems = families | {_prefix(n) for n in names}
    for cand in filter(None, (c.lower() for c in candidates)):
        if cand in families or cand in names:
            return True
        p = _prefix(cand)
        if any(s and len(s) >= 3 and len(p) >= 3 and (p.startswith(s) or s.startswith(p)) for s in stems):
            return True
    return False


def range_warnings(
    spec: ModelSpec,
    class_name: str,
    feats: Mapping[str, Any],
    batch: int,
    mode: str,
    data: pd.DataFrame,
    devices: Sequence[str],
    hardware: Mapping[str, Mapping[str, Any]] | None = None,
    precision: str | None = None,
) -> list[str]:
    """Where the model lies outside the profiled data: mode, FLOPs, parameters, batch, family, devices (and
    for a device without profiled rows, where its ``hardware`` features, device -> feature row at
    ``precision``, lie beyond the profiled ones)."""
    warnings = []
    same_mode = data[data["mode"] == mode]
    if same_mode.empty:
        warnings.append(f"mode {mode!r} was never profiled: every number extrapolates")
        same_mode = data
    for out in outside_profiled(feats, batch, same_mode, data):
        if out.column != "batch":
            warnings.append(f"{out.column} {out.value:.3g} is outside the profiled range [{out.lo:.3g}, {out.hi:.3g}]"
                            f"{' of ' + mode + ' rows' if out.column == 'flops' else ''}: the prediction extrapolates")
        elif out.value > out.hi:
            warnings.append(f"batch {batch} is beyond the largest profiled batch ({int(out.hi)}): "
                            "the prediction extrapolates")
        else:
            warnings.append(f"batch {batch} is below the smallest profiled batch ({int(out.lo)})")
    candidates = [spec.name.split(":")[-1], class_name]
    if not family_profiled(candidates, data):
        fams = ", ".join(sorted(map(str, data["family"].dropna().unique()))) if "family" in data else ""
        warnings.append(
            f"the family of {spec.text} ({class_name}) was never profiled (profiled families: {fams}): "
            "errors on unseen model families are much larger (23-99 % MAPE in the DIPPM study of unseen applications)"
        )
    profiled = set(data["device"].astype(str))
    for d in devices:
        if d not in profiled:
            beyond = hardware_beyond_profiled((hardware or {}).get(d, {}), data, precision)
            warnings.append(
                f"device {d} has no profiled rows: its numbers extrapolate from hardware features alone"
                + "".join(f"; {text}" for text in beyond)
            )
    return warnings


#: hardware features whose range over the profiled devices bounds a transfer to a new device
HARDWARE_RANGE_COLUMNS = {"hw_peak_gflops": "peak GFLOP/s", "hw_mem_bw_gbs": "memory bandwidth GB/s"}


def hardware_beyond_profiled(row: Mapping[str, Any], data: pd.DataFrame, precision: str | None = None) -> list[str]:
    """How far a device's peak FLOP/s and bandwidth (its feature ``row``) lie outside those of the profiled
    rows of ``precision`` (all rows when None or none has it), as a factor: a device faster than every
    profiled one is predicted by extrapolation (an H200 was predicted 2.3x too fast from four workstation
    GPUs, bench/RESULTS.md)."""
    if precision is not None and "precision" in data.columns and (data["precision"] == precision).any():
        data = data[data["precision"] == precision]
    texts = []
    for col, name in HARDWARE_RANGE_COLUMNS.items():
        v = _num(row.get(col))
        ref = pd.to_numeric(data[col], errors="coerce").dropna() if col in data.columns else pd.Series(dtype=float)
        if not len(ref) or not v > 0:
            continue
        lo, hi = float(ref.min()), float(ref.max())
        if v > hi:
            texts.append(f"its {name} {v:.4g} is {v / hi:.2f}x the largest profiled ({hi:.4g})")
        elif v < lo:
            texts.append(f"its {name} {v:.4g} is {lo / v:.2f}x below the smallest profiled ({lo:.4g})")
    return texts
