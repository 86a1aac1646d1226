"""``perfzoo sensors LOG -o OUT.parquet``: read an nvidia-smi CSV log or a perfzoo sensor-sample file
into the sensor-sample contract. Light to import: pandas is loaded only when the command runs."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_sensors_parser(sub: Any) -> None:
    """Register the ``sensors`` subcommand on an argparse subparsers object."""
    p = sub.add_parser("sensors", help="read an nvidia-smi --query-gpu CSV log or a perfzoo sensor file")
    p.add_argument("log", metavar="LOG", help="nvidia-smi --query-gpu ... --format=csv log, or *.sensors.parquet")
    p.add_argument("-o", "--output", required=True, help="sensor-sample Parquet to write")
    p.add_argument("--utc-offset", type=float, default=None, metavar="HOURS",
                   help="UTC offset of the machine that wrote the nvidia-smi timestamps (required for them)")


def sensors_command(args: argparse.Namespace) -> int:
    """Read ``args.log`` and write its samples to ``args.output`` (atomically); 0 on success."""
    # lazy: pandas and pyarrow (~1 s) are not needed by `perfzoo --help`, which imports this module
    from perfzoo.io import write_parquet
    from perfzoo.sensors.smi import read_sensor_log

    samples = read_sensor_log(args.log, utc_offset_h=args.utc_offset)
    write_parquet(args.output, samples)
    print(f"perfzoo sensors: {len(samples)} samples, columns {', '.join(samples.columns)} -> {args.output}",
          file=sys.stderr)
    return 0
