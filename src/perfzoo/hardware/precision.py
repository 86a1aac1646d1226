"""Numeric precision of a measurement and the hardware peak that matches it.

Precisions: ``fp32`` (IEEE float32 on CUDA cores), ``tf32`` (float32 matmuls/convolutions on TF32
tensor cores), ``fp16`` and ``bf16`` (model and data in that dtype, tensor cores), ``amp`` (automatic
mixed precision: float32 weights, ``torch.autocast`` runs matmuls and convolutions in float16 on tensor
cores). Spellings such as ``float16``, ``half``, ``bfloat16`` and ``mixed`` are accepted as aliases.

The peak used by the hardware features (``hw_peak_gflops`` and the roofline compute time) is the spec
sheet's peak of the unit that runs the matmuls at that precision: FP32 non-tensor for ``fp32``, the TF32
tensor peak for ``tf32``, the FP16 tensor peak (FP32 accumulate) for ``fp16`` and ``amp``, the BF16 tensor
peak for ``bf16``. TF32 and BF16 tensor cores exist from Ampere on; asking for them on an older GPU is an
error naming the device. A peak the source does not state stays missing (NaN), never filled in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfzoo.io import InputError

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "amp")
ALIASES: dict[str, str] = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "tf32": "tf32", "fp16": "fp16", "float16": "fp16",
    "half": "fp16", "bf16": "bf16", "bfloat16": "bf16", "amp": "amp", "mixed": "amp", "amp_fp16": "amp",
}
#: torch dtype the model is built in when featurised (amp keeps float32 weights)
BUILD_DTYPES: dict[str, str] = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16",
                                "amp": "float32"}
#: precisions a prediction can be made at: the model is featurised with float32 weights
PREDICTABLE: tuple[str, ...] = tuple(p for p in PRECISIONS if BUILD_DTYPES[p] == "float32")
#: spec-table column of the peak that matches each precision, and whether tensor cores run it
PEAK_COLUMNS: dict[str, tuple[str, bool]] = {
    "fp32": ("peak_fp32_tflops", False), "tf32": ("peak_tf32_tflops", True),
    "fp16": ("peak_fp16_tflops", True), "bf16": ("peak_bf16_tflops", True), "amp": ("peak_fp16_tflops", True),
}
#: architectures without TF32/BF16 tensor cores (compute capability below 8.0)
PRE_AMPERE = frozenset({"Volta", "Turing", "Pascal"})


@dataclass(frozen=True)
class Peak:
    """The peak FLOP/s that applies to one precision on one GPU."""

    tflops: float  # NaN where the source does not state it
    tensor_cores: bool
    column: str


def normalise_precision(value: str, where: str = "precision") -> str:
    """The canonical precision name of ``value``; InputError naming ``where`` and the accepted names."""
    key = str(value).strip().lower()
    if key not in ALIASES:
        raise InputError(f"{where}: unknown precision {value!r} (accepted: {', '.join(PRECISIONS)}; "
                         f"aliases: {', '.join(sorted(set(ALIASES) - set(PRECISIONS)))})")
    return ALIASES[key]


def predictable_precision(value: str, where: str = "precision") -> str:
    """The canonical name of a prediction's precision; InputError for an unknown one, or for one that builds the
    model in another dtype (fp16, bf16), since predictions featurise float32 weights (:data:`PREDICTABLE`)."""
    name = normalise_precision(value, where)
    if name not in PREDICTABLE:
        raise InputError(f"{where}: {name} builds the model in {BUILD_DTYPES[name]}, and predictions "
                         f"featurise float32 weights only; use {', '.join(PREDICTABLE)}")
    return name


def check_supported(spec: dict[str, Any], precision: str, where: str = "") -> None:
    """InputError naming the device when ``precision`` needs tensor cores the GPU does not have."""
    if precision in ("tf32", "bf16") and spec.get("arch") in PRE_AMPERE:
        prefix = f"{where}: " if where else ""
        raise InputError(f"{prefix}precision {precision} is not supported on {spec['name']} "
                         f"({spec['arch']}: no {precision.upper()} tensor cores; use fp32, fp16 or amp)")


def peak_for(spec: dict[str, Any], precision: str) -> Peak:
    """The spec row's peak (TFLOP/s) for ``precision``, checked for support; NaN where not stated."""
    precision = normalise_precision(precision)
    check_supported(spec, precision)
    column, tensor = PEAK_COLUMNS[precision]
    value = spec.get(column)
    return Peak(math.nan if value is None else float(value), tensor, column)
