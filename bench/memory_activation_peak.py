"""``memory_sim``'s activation terms at the step's activation high-water mark instead of at its live peak, offline.

    python bench/memory_activation_peak.py RESULTS [RESULTS ...]

``memory_sim`` prices activations by ``sim_activation_bytes``, the activation bytes live at the moment of the
step's *live peak*. In a training step that moment is often the optimizer's (weights, gradients and momentum live,
activations gone), so the feature jumps with the batch: ViT-tiny-d6 training has 0.56, 2.66 and 40.9 MiB at batches
1, 8 and 32, and its leave-one-family-out errors are -19 % at batch 8 and +8 % at batch 32 on every run. The
high-water mark of the live activation bytes over the replayed steps (``act_max``) grows smoothly with the batch;
``act_small_max`` counts only blocks below :data:`perfzoo.features.memory.HEAP_MAX_BYTES` (those glibc may serve
from its heap, where a freed block stays resident).

Both are measured here by wrapping :class:`perfzoo.features.memory._LiveBytes` (not features of the workflow), on
the first run's zoo manifest (the runs must share it: the model tables of the default runs are equal), and joined to
each run's dataset. Every variant is ``memory_sim``'s own median regression with its measured depthwise factor,
only its activation columns (or one added term) changed; each is refitted on every fold of every split of each run
(its ``splits/``) and scored on the test rows. Printed: MAPE % per variant, split and run, the mean over runs, and
``select`` (the mean of family_monte_carlo and stratified_kfold, the splits the project chooses defaults on).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from this_checkout import use_this_checkout

use_this_checkout()

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from composed_shrinkage import SELECTION_SPLITS as SELECTION  # noqa: E402  (bench/, the script's own folder)
from composed_shrinkage import SPLITS  # noqa: E402

from perfzoo.features import memory  # noqa: E402
from perfzoo.features.meta import manifest_builder, simulated_memory  # noqa: E402
from perfzoo.regressors import MemorySimRegressor  # noqa: E402
from perfzoo.regressors.base import numeric_matrix  # noqa: E402

MIB, TARGET, KEY = 2.0**20, "peak_mem_mb", ["model_id", "mode", "batch"]


class _Marks(memory._LiveBytes):
    """The tracker, also keeping the high-water marks of the live activation bytes (all, and heap-sized blocks)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.act_max = self.act_small_max = self.act_small = 0
        self.small: dict[int, int] = {}
        _TRACKERS.append(self)

    def add(self, tensor, category: str) -> None:  # noqa: ANN001
        key = tensor.untyped_storage()._cdata
        new = key not in self.live
        super().add(tensor, category)
        if new and category == "activation" and self.live[key][0] < memory.HEAP_MAX_BYTES:
            self.small[key] = self.live[key][0]
            self.act_small += self.small[key]
        self.act_max = max(self.act_max, self.totals["activation"])
        self.act_small_max = max(self.act_small_max, self.act_small)

    def _free(self, key: int) -> None:
        self.act_small -= self.small.pop(key, 0)
        super()._free(key)


_TRACKERS: list[_Marks] = []


def activation_marks(manifest: pd.DataFrame, num_classes: int, optimizer: str) -> pd.DataFrame:
    """``act_max`` and ``act_small_max`` (bytes) of every (model, mode, batch) of the manifest."""
    memory._LiveBytes, original = _Marks, memory._LiveBytes
    rows = []
    try:
        for row in manifest.drop_duplicates(KEY).to_dict("records"):
            build, dtype = manifest_builder(row, num_classes)
            simulated_memory(build, tuple(json.loads(row["input_shape"])), int(row["batch"]), row["mode"], dtype,
                             optimizer, row["model_id"])
            rows.append({**{k: row[k] for k in KEY}, "act_max": _TRACKERS[-1].act_max,
                         "act_small_max": _TRACKERS[-1].act_small_max})
    finally:
        memory._LiveBytes = original
    return pd.DataFrame(rows)


def replaced(activation: str, training_activation: str) -> type[MemorySimRegressor]:
    """``memory_sim`` with its two activation columns taken from other columns."""
    class Variant(MemorySimRegressor):
        FEATURES = ("sim_heap_peak_bytes", activation, training_activation, "sim_op_kinds", "sim_onednn_conv",
                    "sim_cl_depthwise_weight_bytes")

        def _design(self, X: pd.DataFrame) -> np.ndarray:
            peak, act, train_act, kinds, onednn, depthwise = numeric_matrix(X, self.FEATURES).T
            training = (X["mode"].astype(str) == "training").to_numpy(float)
            return np.column_stack([training, peak / MIB, act / MIB, training * train_act / MIB, np.sqrt(kinds),
                                    onednn, depthwise / MIB])
    return Variant


def added(column: str, training_only: bool) -> type[MemorySimRegressor]:
    """``memory_sim`` with one more term: ``column`` in MiB (in training rows only)."""
    class Variant(MemorySimRegressor):
        FEATURES = (*MemorySimRegressor.FEATURES, column)
        TERMS = (*MemorySimRegressor.TERMS, f"{column}_mib")

        def _design(self, X: pd.DataFrame) -> np.ndarray:
            extra = numeric_matrix(X, [column])[:, 0] / MIB
            if training_only:
                extra = extra * (X["mode"].astype(str) == "training").to_numpy(float)
            return np.column_stack([MemorySimRegressor()._design(X), extra])
    return Variant


VARIANTS: dict[str, type[MemorySimRegressor]] = {
    "memory_sim (activation at the live peak)": MemorySimRegressor,
    "act_max for both activation terms": replaced("act_max", "act_max"),
    "act_small_max for both activation terms": replaced("act_small_max", "act_small_max"),
    "training term on act_max": replaced("sim_activation_bytes", "act_max"),
    "+ training x act_max": added("act_max", training_only=True),
    "+ training x act_small_max": added("act_small_max", training_only=True),
}


def scores(results: Path, marks: pd.DataFrame) -> dict[tuple[str, str], float]:
    data = pd.read_parquet(results / "dataset" / "dataset.parquet")
    data = data.merge(marks, on=KEY, how="left", validate="many_to_one").set_index("row_id")
    data = data[data[TARGET].notna() & data["sim_peak_bytes"].notna()]
    if data["act_max"].isna().any():
        raise SystemExit(f"{results}: configs not in the first run's manifest: "
                         f"{sorted(set(data.loc[data['act_max'].isna(), 'label']))}")
    out = {}
    for split_name in SPLITS:
        split = pd.read_parquet(results / "splits" / f"{split_name}.parquet")
        split = split[split["row_id"].isin(data.index)]
        for name, variant in VARIANTS.items():
            errors = []
            for _, fold in split.groupby("fold"):
                train = data.loc[fold.loc[fold["set"] == "train", "row_id"]]
                test = data.loc[fold.loc[fold["set"] == "test", "row_id"]]
                predicted = variant().fit(train, train[TARGET]).predict(test)
                errors.append(np.abs(predicted / test[TARGET].to_numpy(float) - 1) * 100)
            out[(name, split_name)] = float(np.mean(np.concatenate(errors)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="+", help="finished default runs' results/ folders")
    args = parser.parse_args()
    from perfzoo.config import load_config

    first = args.results[0]
    config = load_config(first.parent / "config.yaml")
    marks = activation_marks(pd.read_parquet(first / "zoo" / "manifest.parquet"), config["zoo"]["num_classes"],
                             config["profiling"]["optimizer"])
    table = pd.DataFrame({results.resolve().parent.name: scores(results, marks) for results in args.results})
    table["mean"] = table.mean(axis=1)
    for name in VARIANTS:
        table.loc[(name, "select"), :] = table.loc[[(name, s) for s in SELECTION]].mean()
    runs = " | ".join(table.columns)
    for split in (*SPLITS, "select"):
        print(f"\n{split}\n\n| variant | {runs} |\n|---|" + "---|" * len(table.columns))
        for name in VARIANTS:
            print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in table.loc[(name, split)]) + " |")


if __name__ == "__main__":
    main()
