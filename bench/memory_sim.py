"""Peak memory by simulation: the ``memory_sim`` regressor on every split of a finished run, beside the best
existing regressor, the baselines and the noise floor of that run.

    python bench/memory_sim.py RESULTS_DIR [--config config.yaml]

RESULTS_DIR is a finished run's ``results/`` (read only). The simulated features (``sim_*``) of every
(model, mode, batch) of its ``zoo/manifest.parquet`` are computed here with the current code (the run's
own feature table may predate them) and joined to its ``dataset/dataset.parquet``; ``memory_sim`` is then
fitted on every fold of every ``splits/*.parquet`` by ``perfzoo.fitting.fit_split`` (the fit rule's
function) and scored on the test rows, pooled over folds, as ``perfzoo.evaluate`` does. ``zoo.num_classes``
and ``profiling.optimizer`` come from ``--config`` (the repository's config.yaml by default), checked
against the hash of ``zoo.num_classes`` recorded in the run's feature table. Printed as Markdown: MAPE per
split (``memory_sim``, the uncalibrated simulator ``sim_peak_bytes`` as MiB, the best existing regressor
and the best baseline from ``evaluate/metrics.parquet``, the noise floor), per-family MAPE of the
leave-one-family-out split, and the coefficients fitted on all rows.

``--calibration`` says where the devices' measured constants (``perfzoo.hardware.CALIBRATION_COLUMNS``: the
depthwise temporary's factor, which ``memory_sim`` applies as measured) come from: ``dataset`` (default) as the
run's dataset has them (a run made before the hardware rule measured them has none: the term is fitted),
``measure`` measured now on this CPU with the checkout's code and the run's threads (for such a run, on the
machine that profiled it: the CPU's name is printed beside the run's), ``none`` left out (the term is fitted).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from perfzoo.config import load_config
from perfzoo.features.memory import SIM_COLUMNS
from perfzoo.features.meta import simulate_manifest
from perfzoo.fitting import fit_split, regressor_inputs
from perfzoo.hardware import CALIBRATION_COLUMNS, DEPTHWISE_TEMPORARY_FACTOR, cpu_model_name
from perfzoo.io import InputError, read_json
from perfzoo.profiling.temporaries import measure_depthwise_temporary
from perfzoo.provenance import config_subset_sha, read_provenance
from perfzoo.regressors import BASELINES, MemorySimRegressor
from perfzoo.stats import mape

TARGET, REGRESSOR, MIB = "peak_mem_mb", "memory_sim", 2.0**20


def run_settings(results: Path, config_path: Path) -> tuple[int, str]:
    """(num_classes, optimizer) of the run, from the config, checked against the run's feature provenance."""
    config = load_config(config_path)
    recorded = read_provenance(results / "features" / "models.parquet").get("inputs", {})
    for sections in (["zoo.num_classes"], ["zoo.num_classes", "profiling.optimizer"]):
        key = f"config.yaml#{','.join(sections)}"
        if key in recorded and recorded[key] != config_subset_sha(config, sections):
            raise InputError(f"{config_path}: {', '.join(sections)} differ from those {results}/features "
                             "was made with")
    return int(config["zoo"]["num_classes"]), str(config["profiling"]["optimizer"])


def dataset_with_simulation(results: Path, num_classes: int, optimizer: str
                            ) -> tuple[pd.DataFrame, float, int]:
    """(the run's dataset with fresh sim_* columns, seconds the simulation took, configs it failed on)."""
    manifest = pd.read_parquet(results / "zoo" / "manifest.parquet")
    started = time.perf_counter()
    simulated = simulate_manifest(manifest, num_classes, optimizer)
    seconds = time.perf_counter() - started
    failed = simulated[simulated["sim_error"] != ""]
    for error in failed["sim_error"]:
        print(f"simulation failed: {error}", file=sys.stderr)
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    data = data.drop(columns=[c for c in SIM_COLUMNS if c in data.columns])
    key = ["model_id", "mode", "batch"]
    data = data.merge(simulated[[*key, *SIM_COLUMNS]], on=key, how="left")
    return data, seconds, len(failed)


def with_calibration(data: pd.DataFrame, results: Path, source: str) -> pd.DataFrame:
    """``data`` with the devices' measured constants from ``source`` (see the module's docstring)."""
    if source == "none":
        return data.drop(columns=[c for c in CALIBRATION_COLUMNS if c in data.columns])
    if source == "measure":
        factors = {}
        for device in sorted(set(data["device"])):
            hw = read_json(results / "hardware" / f"{device}.json")
            if hw.get("kind") != "cpu":
                continue
            measured = measure_depthwise_temporary(int(hw["cores_used"]))
            print(f"{device}: depthwise temporary factor measured here {measured['factor']:g} on "
                  f"{cpu_model_name()!r} ({measured['threads']} threads); the run's CPU {hw.get('name')!r}")
            factors[device] = measured["factor"]
        data = data.assign(**{DEPTHWISE_TEMPORARY_FACTOR: data["device"].map(factors).astype(float)})
    present = [c for c in CALIBRATION_COLUMNS if c in data.columns]
    print(f"measured constants applied: {', '.join(present) or 'none (fitted)'}\n")
    return data


def score_split(data: pd.DataFrame, split: pd.DataFrame) -> pd.DataFrame:
    """Test-row predictions of memory_sim and of the raw simulator (sim_peak_bytes in MiB), every fold."""
    predictions, _, notes = fit_split(data, split, TARGET, REGRESSOR)
    if notes["skipped_folds"]:
        print(f"{split['split'].iloc[0]}: skipped folds {notes['skipped_folds']}", file=sys.stderr)
    test = predictions[predictions["set"] == "test"].copy()
    raw = data.set_index("row_id")["sim_peak_bytes"] / MIB
    test["y_raw"] = test["row_id"].map(raw).to_numpy(float)
    return test


def existing_results(results: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(best regressor and best baseline per split, per-family MAPE) of the run's evaluation of the target."""
    metrics = pd.read_parquet(results / "evaluate" / "metrics.parquet")
    metrics = metrics[(metrics["target"] == TARGET) & metrics["mape"].notna()]
    learned = metrics[~metrics["regressor"].isin(BASELINES)]
    best = learned.loc[learned.groupby("split")["mape"].idxmin(), ["split", "regressor", "mape"]]
    baselines = metrics[metrics["regressor"].isin(BASELINES)]
    base = baselines.loc[baselines.groupby("split")["mape"].idxmin(), ["split", "regressor", "mape"]]
    table = best.merge(base, on="split", suffixes=("_best", "_baseline"))
    table["noise_floor_mape"] = table["split"].map(metrics.groupby("split")["noise_floor_mape"].first())
    families = pd.read_parquet(results / "evaluate" / "per_family.parquet")
    return table.set_index("split"), families[families["target"] == TARGET]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[1] / "config.yaml")
    parser.add_argument("--calibration", choices=("dataset", "measure", "none"), default="dataset")
    args = parser.parse_args()
    num_classes, optimizer = run_settings(args.results, args.config)
    data, seconds, n_failed = dataset_with_simulation(args.results, num_classes, optimizer)
    data = with_calibration(data, args.results, args.calibration)
    existing, families = existing_results(args.results)
    n_configs = data[["model_id", "mode", "batch"]].drop_duplicates().shape[0]
    print(f"simulated {n_configs} configs in {seconds:.1f} s "
          f"({n_failed} failed); optimizer {optimizer}; {len(data)} dataset rows\n")
    print("| split | n | memory_sim | raw simulator | best existing | best baseline | noise floor |")
    print("|---|---|---|---|---|---|---|")
    lofo = None
    for path in sorted((args.results / "splits").glob("*.parquet")):
        split = pd.read_parquet(path)
        name = split["split"].iloc[0]
        test = score_split(data, split)
        if name == "leave_one_family_out":
            lofo = test
        row = existing.loc[name] if name in existing.index else None
        best = f"{row['mape_best']:.1f} % ({row['regressor_best']})" if row is not None else "n/a"
        base = f"{row['mape_baseline']:.1f} % ({row['regressor_baseline']})" if row is not None else "n/a"
        floor = f"{row['noise_floor_mape']:.2f} %" if row is not None else "n/a"
        print(f"| {name} | {len(test)} | **{mape(test['y_true'], test['y_pred']):.1f} %** | "
              f"{mape(test['y_true'], test['y_raw']):.1f} % | {best} | {base} | {floor} |")
    if lofo is not None:
        best_name = existing.loc["leave_one_family_out", "regressor_best"]
        lofo_rows = (families["split"] == "leave_one_family_out") & (families["regressor"] == best_name)
        theirs = families[lofo_rows]
        theirs = theirs.set_index("family")["mape"]
        print(f"\nleave_one_family_out per held-out family (MAPE %; best existing = {best_name}):\n")
        print(f"| family | n | memory_sim | raw simulator | {best_name} |")
        print("|---|---|---|---|---|")
        for family, rows in lofo.groupby("family"):
            print(f"| {family} | {len(rows)} | {mape(rows['y_true'], rows['y_pred']):.1f} | "
                  f"{mape(rows['y_true'], rows['y_raw']):.1f} | {theirs.get(family, np.nan):.1f} |")
    everything = data[np.isfinite(data[TARGET])]
    fitted = MemorySimRegressor().fit(regressor_inputs(everything, device_calibration=True), everything[TARGET])
    print("\ncoefficients fitted on all rows, per device (MiB for an indicator term, MiB per MiB for a byte "
          "term):\n")
    for device in sorted(fitted.group_coefs_):
        row = regressor_inputs(everything[everything["device"] == device].head(1), device_calibration=True)
        applied, fitted_here = fitted.row_coefficients(row)[0], fitted.coefficients(device).to_numpy()
        print(f"- {device}: " + ", ".join(f"{k} {v:.3g}" + (" (measured)" if np.isfinite(v) and v != f else "")
                                          for k, v, f in zip(fitted.TERMS, applied, fitted_here, strict=True)))


if __name__ == "__main__":
    main()
