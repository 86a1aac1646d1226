"""MIG (Multi-Instance GPU) profiles and the recommendation of a profile for a model.

Profile tables follow NVIDIA's MIG user guide ("Supported MIG Profiles",
https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): name, compute
slices out of 7, memory in GB as the profile name states it, and how many instances of it fit on one
GPU. Media-extension variants (``+me``) have the compute and memory of their base profile and are left
out.

Recommendation rule. The memory rule is DIPPM's (Panner Selvam and Brorsson, "MAELSTROM D3.5:
Performance model for hardware configurations", §4.5, eq. 2): profile ``g`` fits a model of predicted
peak memory α if α < memory(g), α being predicted on the full GPU and so an upper bound
(memory consumption is highest on the full GPU). Here α is multiplied by ``1 + margin`` first;
``margin=0`` reproduces eq. 2, and ``profiles=DIPPM_A100_PROFILES`` its candidate set. 1 GB = 1024 MB.
The latency rule is an extension: a profile with ``k`` of 7 compute slices is assumed to run ``7 / k``
times slower than the full GPU (latency_full · 7 / k), which is pessimistic for models that do not fill
the GPU. The smallest profile (by memory, then compute slices) that passes both rules is recommended.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from perfzoo.io import InputError

MIG_GUIDE_URL = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html"
FULL_SLICES = 7
MB_PER_GB = 1024


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile: name, compute slices (of 7), memory (GB) and max instances per GPU."""

    name: str
    compute_slices: int
    memory_gb: float
    max_instances: int

    @property
    def memory_mb(self) -> float:
        return self.memory_gb * MB_PER_GB

    @property
    def compute_fraction(self) -> float:
        return self.compute_slices / FULL_SLICES


def _profiles(*rows: tuple[str, int, float, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(*row) for row in rows)


MIG_PROFILES: dict[str, tuple[MigProfile, ...]] = {
    "A100-40GB": _profiles(
        ("1g.5gb", 1, 5, 7), ("1g.10gb", 1, 10, 4), ("2g.10gb", 2, 10, 3),
        ("3g.20gb", 3, 20, 2), ("4g.20gb", 4, 20, 1), ("7g.40gb", 7, 40, 1),
    ),
    "A100-80GB": _profiles(
        ("1g.10gb", 1, 10, 7), ("1g.20gb", 1, 20, 4), ("2g.20gb", 2, 20, 3),
        ("3g.40gb", 3, 40, 2), ("4g.40gb", 4, 40, 1), ("7g.80gb", 7, 80, 1),
    ),
    "H100-80GB": _profiles(
        ("1g.10gb", 1, 10, 7), ("1g.20gb", 1, 20, 4), ("2g.20gb", 2, 20, 3),
        ("3g.40gb", 3, 40, 2), ("4g.40gb", 4, 40, 1), ("7g.80gb", 7, 80, 1),
    ),
    "H200-141GB": _profiles(
        ("1g.18gb", 1, 18, 7), ("1g.35gb", 1, 35, 4), ("2g.35gb", 2, 35, 3),
        ("3g.71gb", 3, 71, 2), ("4g.71gb", 4, 71, 1), ("7g.141gb", 7, 141, 1),
    ),
}  # fmt: skip

DIPPM_A100_PROFILES: tuple[str, ...] = ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")
"""The four A100 40 GB profiles DIPPM chooses among (Panner Selvam and Brorsson, MAELSTROM D3.5, eq. 2)."""

_GPU_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"A100.*80\s*GB|80\s*GB.*A100", "A100-80GB"),
    (r"A100", "A100-40GB"),
    (r"GH200|H100.*(94|96)\s*GB|H100\s*NVL", ""),  # other memory sizes: not tabulated
    (r"H200", "H200-141GB"),
    (r"H100", "H100-80GB"),
)


def resolve_mig_gpu(gpu: str) -> str:
    """Key of :data:`MIG_PROFILES` for a table key or an NVML name such as 'NVIDIA A100-SXM4-40GB'."""
    if gpu in MIG_PROFILES:
        return gpu
    for pattern, key in _GPU_PATTERNS:
        if re.search(pattern, gpu, flags=re.IGNORECASE):
            if key:
                return key
            break
    raise InputError(f"GPU '{gpu}': no MIG profile table (known: {', '.join(MIG_PROFILES)})")


def mig_profiles(gpu: str, names: Sequence[str] | None = None) -> list[MigProfile]:
    """Profiles of ``gpu``, smallest first (memory, then compute slices); optionally only ``names``."""
    key = resolve_mig_gpu(gpu)
    table = MIG_PROFILES[key]
    if names is not None:
        known = {p.name: p for p in table}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InputError(f"GPU '{gpu}': unknown MIG profiles {unknown} (known: {', '.join(known)})")
        table = tuple(known[n] for n in names)
    return sorted(table, key=lambda p: (p.memory_gb, p.compute_slices))


def _check_number(value: float | None, what: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not math.isfinite(float(value)) or float(value) < 0:
        raise InputError(f"recommend_mig: {what} must be a finite number >= 0, got {value!r}")


def scaled_latency_ms(latency_full_ms: float, profile: MigProfile) -> float:
    """Latency on ``profile`` assuming linear scaling with compute slices: latency_full · 7 / k."""
    return latency_full_ms * FULL_SLICES / profile.compute_slices


def _rejection(
    profile: MigProfile, required_mb: float, latency_ms: float | None, target_ms: float | None
) -> str:
    if not required_mb < profile.memory_mb:
        return f"memory: needs {required_mb:.0f} MB, profile has {profile.memory_mb:.0f} MB"
    if target_ms is not None and latency_ms is not None:
        scaled = scaled_latency_ms(latency_ms, profile)
        if scaled > target_ms:
            slices = f"{profile.compute_slices}/7 slices"
            return f"latency: {scaled:.3g} ms on {slices} exceeds the target {target_ms:g} ms"
    return ""


def recommend_mig(
    gpu: str,
    predicted_peak_mem_mb: float,
    predicted_latency_ms: float | None,
    latency_target_ms: float | None = None,
    margin: float = 0.1,
    profiles: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The smallest MIG profile of ``gpu`` that holds the model and, if a target is given, meets it.

    Returns ``profile`` (None when nothing fits), ``reason``, the ``rejected`` smaller profiles with
    their reasons, and the numbers the decision used.
    """
    _check_number(predicted_peak_mem_mb, "predicted_peak_mem_mb")
    _check_number(margin, "margin")
    _check_number(latency_target_ms, "latency_target_ms", allow_none=True)
    if latency_target_ms is not None:
        _check_number(predicted_latency_ms, "predicted_latency_ms (needed for a latency target)")
    required_mb = float(predicted_peak_mem_mb) * (1.0 + margin)
    result: dict[str, Any] = {
        "gpu": resolve_mig_gpu(gpu),
        "profile": None,
        "required_mem_mb": required_mb,
        "latency_target_ms": latency_target_ms,
        "scaled_latency_ms": None,
        "rejected": [],
    }
    for profile in mig_profiles(gpu, profiles):
        why = _rejection(profile, required_mb, predicted_latency_ms, latency_target_ms)
        if why:
            result["rejected"].append({"profile": profile.name, "reason": why})
            continue
        latency = (
            None if predicted_latency_ms is None else scaled_latency_ms(float(predicted_latency_ms), profile)
        )
        result.update(
            profile=profile.name,
            compute_slices=profile.compute_slices,
            memory_gb=profile.memory_gb,
            scaled_latency_ms=latency,
            reason=f"smallest profile with memory > {required_mb:.0f} MB (peak x {1 + margin:g})"
            + (f" and scaled latency <= {latency_target_ms:g} ms" if latency_target_ms is not None else ""),
        )
        return result
    result["reason"] = "no MIG profile fits: " + "; ".join(
        f"{r['profile']}: {r['reason']}" for r in result["rejected"]
    )
    return result


def mig_report_table(
    rows: pd.DataFrame | Iterable[Mapping[str, Any]],
    gpu: str,
    margin: float = 0.1,
    latency_target_ms: float | None = None,
    profiles: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Recommendation table in the shape of DIPPM's Table 4.5 (Panner Selvam, "Performance Prediction
    Models for Deep Learning: A Graph Neural Network and Large Language Model Approach", PhD thesis).

    Input columns: ``model``, ``batch``, ``predicted_mem_mb`` and optionally ``measured_mem_mb`` and
    ``predicted_latency_ms``. Output: model, batch, recommended profile, predicted and measured memory,
    and per profile the measured memory as a percentage of the profile's memory (empty where it does
    not fit), the quantity DIPPM compares against its prediction.
    """
    frame = pd.DataFrame(list(rows) if not isinstance(rows, pd.DataFrame) else rows)
    missing = [c for c in ("model", "batch", "predicted_mem_mb") if c not in frame.columns]
    if missing:
        raise InputError(f"mig_report_table: input lacks columns {missing}")
    table = mig_profiles(gpu, profiles)
    out = []
    for record in frame.to_dict("records"):
        latency = record.get("predicted_latency_ms")
        latency = None if latency is None or pd.isna(latency) else float(latency)
        choice = recommend_mig(gpu, record["predicted_mem_mb"], latency, latency_target_ms, margin, profiles)
        measured = record.get("measured_mem_mb")
        measured = float("nan") if measured is None or pd.isna(measured) else float(measured)
        row = {
            "model": record["model"],
            "batch": record["batch"],
            "predicted_mig": choice["profile"],
            "predicted_mem_mb": float(record["predicted_mem_mb"]),
            "measured_mem_mb": measured,
        }
        for profile in table:
            fits = math.isfinite(measured) and measured < profile.memory_mb
            row[f"use_{profile.name}_pct"] = 100.0 * measured / profile.memory_mb if fits else float("nan")
        out.append(row)
    return pd.DataFrame(out)


def profile_table(gpu: str) -> pd.DataFrame:
    """The profile table of ``gpu`` as a DataFrame (for hardware JSON and the report)."""
    return pd.DataFrame([asdict(p) for p in mig_profiles(gpu)])
