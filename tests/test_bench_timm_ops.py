"""The timm operator-trace benchmark's batch extrapolation (bench/timm_family.py): a workload whose totals are
not linear in the batch is left out, never given extrapolated totals."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from timm_family import NOT_LINEAR, off_the_line  # noqa: E402

from perfzoo.features.op_kinds import OP_FEATURES  # noqa: E402


def probes(model_id: str, totals: dict[int, float]) -> list[dict]:
    return [{"model_id": model_id, "batch": b, **dict.fromkeys(OP_FEATURES, t)} for b, t in totals.items()]


def test_a_workload_off_the_line_of_its_first_two_probes_is_named_and_only_it():
    linear = probes("convnet@224", {1: 10.0, 2: 17.0, 4: 31.0})  # 7 per sample plus 3 once per step
    condconv = probes("condconv@224", {1: 10.0, 2: 4.0, 4: 20.0})  # its line would give -8 at batch 4
    untested = probes("old@224", {1: 1.0, 2: 5.0})  # traced before the third probe: not judged here
    frame = pd.DataFrame(linear + condconv + untested)
    off = off_the_line(frame)
    assert list(off["model_id"]) == ["condconv@224"]
    assert (off.iloc[:, 1] == NOT_LINEAR).all()
    frame.loc[(frame["model_id"] == "convnet@224") & (frame["batch"] == 4), OP_FEATURES[0]] += 1  # one total off
    assert sorted(off_the_line(frame)["model_id"]) == ["condconv@224", "convnet@224"]
