"""``memory_sim``'s term sets on models no zoo family resembles: fitted on a run, scored on measured user models.

    python bench/memory_user_models.py RESULTS FILE.py:FUNCTION INPUT MEASURED.csv [FILE.py:FUNCTION INPUT MEASURED.csv ...]

RESULTS is a finished default run's ``results/`` (read only); each case is a model factory, its input shape
(``12,256``) and the CSV that ``bench/user_model.py --out`` wrote for it after that run (its ``meas_peak_mem_mb``
per mode and batch: the profile rule's own measurement). The run's ``num_classes`` and optimizer come from the
``config.yaml`` beside RESULTS, checked against the run's feature provenance (``bench/memory_sim.py``). Every term set of ``bench/memory_terms.py`` is fitted on
all rows of the run's dataset, as ``memory_sim``'s median regression (one device), and predicts each measured
config from the memory simulation of the factory's model (``perfzoo.features.meta.simulated_memory``, the features
``perfzoo predict`` computes). Printed as Markdown: MAPE % per model and term set, and the simulated features.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_sim import run_settings  # noqa: E402
from memory_terms import TARGET, TERM_SETS, fit_predict  # noqa: E402

from perfzoo.features.meta import simulated_memory  # noqa: E402
from perfzoo.models.builders import build_model  # noqa: E402
from perfzoo.prediction.spec import parse_input  # noqa: E402


def simulated_rows(ref: str, shape: tuple[int, ...], measured: pd.DataFrame, device: str, num_classes: int,
                   optimizer: str) -> pd.DataFrame:
    """One row per measured config on ``device``: mode, batch, the measured label and the simulated features
    (a training step with the run's optimizer; ``num_classes`` goes to the factory loader, which a user's
    factory ignores)."""
    build = partial(build_model, "python", ref, {}, num_classes, shape)  # as `perfzoo predict` builds it
    rows = []
    for case in measured.itertuples():
        sim = simulated_memory(build, shape, int(case.batch), str(case.mode), optimizer=optimizer, model_id=ref)
        rows.append({"model": Path(ref.rpartition(":")[0]).name, "mode": case.mode, "batch": int(case.batch),
                     "device": device, TARGET: float(case.meas_peak_mem_mb),
                     **sim.features()})
    return pd.DataFrame(rows)


def main() -> None:
    if len(sys.argv) < 5 or (len(sys.argv) - 2) % 3:
        raise SystemExit(__doc__)
    results = Path(sys.argv[1])
    num_classes, optimizer = run_settings(results, results.parent / "config.yaml")
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    data = data[data[TARGET].notna() & data["sim_peak_bytes"].notna()]
    if data["device"].nunique() != 1:
        raise SystemExit(f"{results}: this comparison fits one device; found {sorted(data['device'].unique())}")
    cases = [sys.argv[i:i + 3] for i in range(2, len(sys.argv), 3)]
    device = str(data["device"].iloc[0])
    users = pd.concat([simulated_rows(ref, parse_input(shape), pd.read_csv(csv), device, num_classes, optimizer)
                       for ref, shape, csv in cases], ignore_index=True)
    table = {}
    for name, terms in TERM_SETS.items():
        pred = fit_predict(terms, data, users)
        ape = np.abs(pred / users[TARGET].to_numpy() - 1) * 100
        table[name] = pd.Series(ape).groupby(users["model"]).mean()
    frame = pd.DataFrame(table).T
    print("| terms | " + " | ".join(frame.columns) + " |\n|---|" + "---|" * len(frame.columns))
    for name, row in frame.iterrows():
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in row) + " |")
    shown = users.assign(peak_mib=users["sim_peak_bytes"] / 2**20, activation_mib=users["sim_activation_bytes"] / 2**20,
                         heap_churn_mib=users["sim_heap_churn_bytes"] / 2**20)
    print("\n" + shown[["model", "mode", "batch", TARGET, "peak_mib", "activation_mib", "heap_churn_mib"]]
          .round(1).to_markdown(index=False))


if __name__ == "__main__":
    main()
