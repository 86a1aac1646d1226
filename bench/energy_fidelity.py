"""Energy fidelity of NVML's power fields against an external power meter on real GPU traces.

    python bench/energy_fidelity.py [DATA] [--csv OUT.csv] [--figure OUT.png]

DATA (default ../shared/data/gpu-power-benchmark) holds run folders with gpudata.csv (nvidia-smi log),
PMD_data.bin + PMD_start_ts.txt (meter) and timestamps.csv (load edges). Prints the error table
(mean |error| and mean signed error of window energies vs the meter, %) as Markdown.
"""

from __future__ import annotations

import argparse
import sys

from perfzoo.io import InputError, write_text
from perfzoo.sensors.fidelity import (
    default_estimate,
    fidelity_markdown,
    fidelity_table,
    find_runs,
    load_run,
    plot_meter_vs_nvml,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", default="../shared/data/gpu-power-benchmark")
    parser.add_argument("--utc-offset", type=float, default=1.0, help="UTC offset of the nvidia-smi timestamps (h)")
    parser.add_argument("--min-window", type=float, default=4.0, help="window of perfzoo's default estimate (s)")
    parser.add_argument("--csv", help="write the full table here")
    parser.add_argument("--figure", help="write the power-over-time figure here (.png/.pdf)")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(p, utc_offset_h=args.utc_offset) for p in find_runs(args.data)]
    except InputError as exc:
        print(f"energy_fidelity: error: {exc}", file=sys.stderr)
        return 2
    table = fidelity_table(runs)
    print(fidelity_markdown(table))
    print("default estimate (power.draw.instant where present, own clock, window >= "
          f"{args.min_window:g} s):")
    print(default_estimate(table, args.min_window)[["gpu", "load", "field", "window_s", "n_windows",
                                                      "mean_err_pct", "max_abs_err_pct"]].round(1).to_string(index=False))
    print("\nlags of the NVML fields behind the meter's first rising edge (ms):")
    lags = table.drop_duplicates(["gpu", "load", "field"])[["gpu", "load", "field", "lag_ms", "meter_shift_ms"]]
    print(lags.round(1).to_string(index=False))
    if args.csv:
        write_text(args.csv, table.to_csv(index=False, float_format="%.4f"))
    if args.figure:
        plot_meter_vs_nvml(runs, args.figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
