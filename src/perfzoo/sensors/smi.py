"""Readers of GPU sensor logs into the sensor-sample contract
(:data:`perfzoo.profiling.nvml.SENSOR_COLUMNS`: ``t_ns`` UTC epoch nanoseconds, ``power_w`` ...).

Two kinds of log are accepted:

* ``nvidia-smi --query-gpu=FIELDS --format=csv[,nounits] [-lms N]``: a header naming the fields (with
  units such as ``power.draw [W]`` unless ``nounits``), any order and subset, ``timestamp`` in local
  wall-clock time (``YYYY/MM/DD HH:MM:SS.mmm``) turned into UTC with an explicit offset;
* perfzoo's own sample files (``results/traces/<device>/<shard>.sensors.parquet`` or a CSV of the same
  columns).

What cannot be read is refused with :class:`perfzoo.io.InputError` naming the file, line and column.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from perfzoo.io import InputError
from perfzoo.profiling.nvml import SENSOR_COLUMNS


@dataclass(frozen=True)
class SmiField:
    """One ``nvidia-smi --query-gpu`` field and the sensor-sample column it fills."""

    query: str
    column: str
    unit: str


SMI_FIELDS: tuple[SmiField, ...] = (
    SmiField("power.draw", "power_w", "W"),
    SmiField("power.draw.average", "power_average_w", "W"),
    SmiField("power.draw.instant", "power_instant_w", "W"),
    SmiField("utilization.gpu", "gpu_util", "%"),
    SmiField("utilization.memory", "mem_util", "%"),
    SmiField("clocks.current.sm", "sm_clock_mhz", "MHz"),
    SmiField("clocks.sm", "sm_clock_mhz", "MHz"),
    SmiField("clocks.current.memory", "mem_clock_mhz", "MHz"),
    SmiField("clocks.mem", "mem_clock_mhz", "MHz"),
    SmiField("temperature.gpu", "temp_c", ""),
    SmiField("memory.used", "mem_used_mb", "MiB"),
    SmiField("power.limit", "power_limit_w", "W"),
    SmiField("enforced.power.limit", "power_limit_w", "W"),
)
"""Numeric fields understood; ``power.draw`` is NVML's averaged reading (1-s window on Ampere and
newer), ``power.draw.instant`` the instantaneous one."""

SMI_TEXT_FIELDS: frozenset[str] = frozenset({"pstate", "name", "pci.bus_id", "index", "uuid"})
SMI_TIMESTAMP_FORMAT = "%Y/%m/%d %H:%M:%S.%f"
_MISSING_VALUES = frozenset({"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]"})


def _split_header(name: str) -> tuple[str, str]:
    """``'power.draw [W]'`` -> ``('power.draw', 'W')``; no unit -> ``''``."""
    name = name.strip()
    if name.endswith("]") and " [" in name:
        field, unit = name[:-1].split(" [", 1)
        return field.strip(), unit.strip()
    return name, ""


def _fields_by_query() -> dict[str, SmiField]:
    return {f.query: f for f in SMI_FIELDS}


def _header_columns(path: Path, header: list[str]) -> list[SmiField | str | None]:
    """Map each header cell to its field ('timestamp' / text field name / SmiField / None = ignored)."""
    known = _fields_by_query()
    mapped: list[SmiField | str | None] = []
    for col, cell in enumerate(header, start=1):
        field, unit = _split_header(cell)
        if field == "timestamp":
            mapped.append("timestamp")
        elif field in known:
            spec = known[field]
            if unit and spec.unit and unit != spec.unit:
                raise InputError(f"{path}: line 1, column {col} ('{cell.strip()}'): unit '{unit}', "
                                 f"expected '{spec.unit}'")
            mapped.append(spec)
        else:
            mapped.append(field if field in SMI_TEXT_FIELDS else None)
    return mapped


def _check_header(path: Path, mapped: list[SmiField | str | None], header: list[str]) -> None:
    if "timestamp" not in mapped or not any(isinstance(m, SmiField) for m in mapped):
        raise InputError(
            f"{path}: line 1: not an nvidia-smi --query-gpu CSV log (header {', '.join(h.strip() for h in header)!r}); "
            "expected a header with 'timestamp' and at least one of "
            f"{', '.join(sorted(_fields_by_query()))} (nvidia-smi --query-gpu=timestamp,power.draw,... --format=csv)"
        )


def _parse_time(path: Path, line: int, col: int, cell: str, offset: timezone) -> int:
    try:
        stamp = datetime.strptime(cell.strip(), SMI_TIMESTAMP_FORMAT).replace(tzinfo=offset)
    except ValueError:
        raise InputError(f"{path}: line {line}, column {col} (timestamp): '{cell.strip()}' is not "
                         "'YYYY/MM/DD HH:MM:SS.mmm'") from None
    delta = stamp - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def _parse_number(path: Path, line: int, col: int, cell: str, spec: SmiField) -> float:
    text = cell.strip()
    if text in _MISSING_VALUES:
        return float("nan")
    if spec.unit and text.endswith(spec.unit):
        text = text[: -len(spec.unit)].strip()
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{path}: line {line}, column {col} ({spec.query}): '{cell.strip()}' is not a "
                         "number") from None


def read_smi_csv(path: str | os.PathLike[str], utc_offset_h: float) -> pd.DataFrame:
    """Read an ``nvidia-smi --query-gpu`` CSV log recorded at local time UTC``+utc_offset_h``.

    Returns one row per log line: ``t_ns`` (UTC epoch ns), the numeric fields present under their
    sensor-sample names (missing readings NaN, never 0), and text fields such as ``pstate`` as strings.
    """
    src = Path(path)
    offset = timezone(timedelta(hours=utc_offset_h))
    try:
        with src.open(newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{src}: cannot read ({exc})") from None
    if not rows:
        raise InputError(f"{src}: empty file; expected an nvidia-smi --query-gpu CSV log with a header")
    mapped = _header_columns(src, rows[0])
    _check_header(src, mapped, rows[0])
    return _parse_rows(src, rows[1:], mapped, offset)


def _parse_rows(src: Path, rows: list[list[str]], mapped: list[SmiField | str | None],
                offset: timezone) -> pd.DataFrame:
    columns: dict[str, list[object]] = {"t_ns": []}
    for m in mapped:
        name = m.column if isinstance(m, SmiField) else m
        if name and name != "timestamp":
            columns.setdefault(name, [])
    for line, row in enumerate(rows, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(mapped):
            raise InputError(f"{src}: line {line}: {len(row)} columns, header has {len(mapped)}")
        for col, (cell, m) in enumerate(zip(row, mapped, strict=True), start=1):
            if m == "timestamp":
                columns["t_ns"].append(_parse_time(src, line, col, cell, offset))
            elif isinstance(m, SmiField):
                columns[m.column].append(_parse_number(src, line, col, cell, m))
            elif m:
                columns[m].append(cell.strip())
    if not columns["t_ns"]:
        raise InputError(f"{src}: header only, no samples")
    frame = pd.DataFrame(columns)
    frame["t_ns"] = frame["t_ns"].astype("int64")
    return frame


def read_sensor_file(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read perfzoo's own sensor-sample file (Parquet or CSV with the :data:`SENSOR_COLUMNS`)."""
    src = Path(path)
    reader: Callable[[Path], pd.DataFrame] = pd.read_parquet if src.suffix == ".parquet" else pd.read_csv
    try:
        frame = reader(src)
    except Exception as exc:  # noqa: BLE001 - any parser failure becomes one line naming the file
        raise InputError(f"{src}: cannot read as a perfzoo sensor-sample file ({type(exc).__name__})") from None
    missing = [c for c in ("t_ns", "power_w") if c not in frame.columns]
    if missing:
        raise InputError(f"{src}: missing columns {', '.join(missing)}; a perfzoo sensor-sample file has "
                         f"{', '.join(SENSOR_COLUMNS)}")
    for col in [c for c in SENSOR_COLUMNS if c in frame.columns]:
        bad = pd.to_numeric(frame[col], errors="coerce").isna() & frame[col].notna()
        if bad.any():
            line = int(np.flatnonzero(bad.to_numpy())[0]) + 2
            raise InputError(f"{src}: line {line}, column {col}: '{frame[col][bad].iloc[0]}' is not a number")
    return frame


def read_sensor_log(path: str | os.PathLike[str], utc_offset_h: float | None = None) -> pd.DataFrame:
    """Read either kind of log: a perfzoo sample file (Parquet, or CSV with ``t_ns``) or an nvidia-smi
    CSV log (then ``utc_offset_h`` is required: its timestamps carry no zone)."""
    src = Path(path)
    if src.suffix == ".parquet" or _csv_has_t_ns(src):
        return read_sensor_file(src)
    if utc_offset_h is None:
        raise InputError(f"{src}: nvidia-smi timestamps are local time without a zone; give the UTC "
                         "offset of the machine that logged them (e.g. --utc-offset 1)")
    return read_smi_csv(src, utc_offset_h)


def _csv_has_t_ns(src: Path) -> bool:
    try:
        with src.open(newline="") as handle:
            first = next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{src}: cannot read ({exc})") from None
    return "t_ns" in [c.strip() for c in first]
