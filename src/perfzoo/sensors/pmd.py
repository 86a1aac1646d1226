"""Reader of the ElmorLabs PMD power meter's binary log (as recorded by the GPU_Power_Benchmark
artifact of Yang, Adamek and Armour, "Accurate and Convenient Energy Measurements for GPUs: A Detailed
Study of NVIDIA GPU's Built-in Power Sensor", SC24).

Format: records of 18 bytes = 9 little-endian uint16. Word 0 is a timer tick (2934.5 ticks per ms,
wrapping at 65536); words 1-8 are four (voltage, current) channel pairs, each read as int16, shifted
right by 4 and masked to 12 bits, 0 when bit 11 is set; V = raw × 0.007568 (× 0.0075 for the third
pair), I = raw × 0.0488; the card's power is the sum of V × I over the four pairs.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from perfzoo.io import InputError

RECORD_WORDS = 9
TICKS_PER_MS = 2934.5
VOLT_SCALE = (0.007568, 0.007568, 0.0075, 0.007568)
AMP_SCALE = 0.0488
START_LEAD_US = 50_000
"""The artifact's authors subtract 50 ms from the recorded start time before aligning."""


def _channel_raw(words: np.ndarray) -> np.ndarray:
    raw = (words.astype(np.int16).astype(np.int32) >> 4) & 0xFFF
    return np.where(raw & 0x800, 0, raw)


def meter_power_w(records: np.ndarray) -> np.ndarray:
    """Card power (W) of each record (rows of 9 uint16 words)."""
    raw = _channel_raw(records[:, 1:])
    volts = raw[:, 0::2] * np.asarray(VOLT_SCALE)
    amps = raw[:, 1::2] * AMP_SCALE
    return (volts * amps).sum(axis=1)


def meter_time_us(ticks: np.ndarray) -> np.ndarray:
    """Microseconds since the first record, unwrapping the 16-bit timer."""
    steps = np.diff(ticks.astype(np.int64)) % 65536
    return np.concatenate([[0.0], np.cumsum(steps)]) * (1000.0 / TICKS_PER_MS)


def read_pmd(path: str | os.PathLike[str], start_us: int, lead_us: int = START_LEAD_US) -> pd.DataFrame:
    """Meter samples as a sensor-sample table: ``t_ns`` (UTC epoch ns) and ``power_w``.

    ``start_us`` is the meter's start time in µs since the epoch (``PMD_start_ts.txt``).
    """
    src = Path(path)
    try:
        words = np.fromfile(src, dtype="<u2")
    except OSError as exc:
        raise InputError(f"{src}: cannot read ({exc})") from None
    if words.size == 0 or words.size % RECORD_WORDS:
        raise InputError(f"{src}: {words.size * 2} bytes is not a whole number of 18-byte PMD records")
    records = words.reshape(-1, RECORD_WORDS)
    t_us = (start_us - lead_us) + meter_time_us(records[:, 0])
    return pd.DataFrame({"t_ns": np.round(t_us * 1000).astype("int64"), "power_w": meter_power_w(records)})


def read_start_us(path: str | os.PathLike[str]) -> int:
    """The meter's start time (µs since the epoch) from ``PMD_start_ts.txt``."""
    src = Path(path)
    try:
        text = src.read_text().strip()
        return int(text)
    except (OSError, ValueError):
        raise InputError(f"{src}: line 1: expected the meter's start time as an integer of µs since the epoch") from None
