"""``memory_sim``'s term sets on models no zoo family resembles: fitted on a run, scored on measured user models.

    python bench/memory_user_models.py RESULTS FILE.py:FUNCTION INPUT MEASURED.csv [FILE.py:FUNCTION INPUT MEASURED.csv ...]

RESULTS is a finished default run's ``results/`` (read only); each case is a model factory, its input shape
(``12,256``) and the CSV that ``bench/user_model.py --out`` wrote for it after that run (its ``meas_peak_mem_mb``
per mode and batch: the profile rule's own measurement). Every term set of ``bench/memory_terms.py`` is fitted on
all rows of the run's dataset, as ``memory_sim``'s median regression (one device), and predicts each measured
config from the memory simulation of the factory's model (``perfzoo.features.meta.simulated_memory``, the features
``perfzoo predict`` computes). Printed as Markdown: MAPE % per model and term set, and the simulated features.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_terms import TARGET, TERM_SETS, fit_predict  # noqa: E402

from perfzoo.features.meta import simulated_memory  # noqa: E402
from perfzoo.prediction.spec import parse_input  # noqa: E402


def factory(ref: str):  # noqa: ANN201 - the module's build function
    path, _, name = ref.rpartition(":")
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def simulated_rows(ref: str, shape: tuple[int, ...], measured: pd.DataFrame) -> pd.DataFrame:
    """One row per measured config: mode, batch, the measured label and the simulated features."""
    build = factory(ref)
    rows = []
    for case in measured.itertuples():
        sim = simulated_memory(build, shape, int(case.batch), str(case.mode), model_id=ref)
        rows.append({"model": Path(ref.rpartition(":")[0]).name, "mode": case.mode, "batch": int(case.batch),
                     "device": "cpu", TARGET: float(case.meas_peak_mem_mb),
                     **sim.features()})
    return pd.DataFrame(rows)


def main() -> None:
    if len(sys.argv) < 5 or (len(sys.argv) - 2) % 3:
        raise SystemExit(__doc__)
    results = Path(sys.argv[1])
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    data = data[data[TARGET].notna() & data["sim_peak_bytes"].notna()]
    cases = [sys.argv[i:i + 3] for i in range(2, len(sys.argv), 3)]
    users = pd.concat([simulated_rows(ref, parse_input(shape), pd.read_csv(csv)) for ref, shape, csv in cases],
                      ignore_index=True)
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
