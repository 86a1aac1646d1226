"""The timm operator-trace benchmark (bench/timm_family.py): a workload whose totals are not linear in the batch
is left out, never given extrapolated totals; a candidate method blended with ``composed`` is the geometric mean
of its members."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from timm_family import NOT_CHECKED, NOT_LINEAR, off_the_line  # noqa: E402

from perfzoo.features.op_kinds import OP_FEATURES  # noqa: E402


def probes(model_id: str, totals: dict[int, float]) -> list[dict]:
    return [{"model_id": model_id, "batch": b, **dict.fromkeys(OP_FEATURES, t)} for b, t in totals.items()]


def test_a_workload_off_the_line_of_its_probes_or_without_the_check_is_named_and_only_those():
    linear = probes("convnet@224", {1: 9.0, 2: 17.0, 4: 31.0, 8: 59.0})  # 7 per sample + 3 (batch 1 unread)
    condconv = probes("condconv@224", {2: 10.0, 4: 4.0, 8: 20.0})  # its line would give -8 at batch 8
    untested = probes("old@224", {2: 1.0, 4: 5.0})  # traced before the third probe: its line is not checked
    frame = pd.DataFrame(linear + condconv + untested)
    off = off_the_line(frame).set_index("model_id").iloc[:, 0].to_dict()
    assert off == {"condconv@224": NOT_LINEAR, "old@224": NOT_CHECKED}
    frame.loc[(frame["model_id"] == "convnet@224") & (frame["batch"] == 8), OP_FEATURES[0]] += 1  # one total off
    assert sorted(off_the_line(frame)["model_id"]) == ["condconv@224", "convnet@224", "old@224"]


def test_rows_get_the_totals_on_the_line_of_batches_2_and_4_and_a_workload_off_it_is_left_out(tmp_path):
    from timm_family import PER_SAMPLE_OPS, with_op_features

    path = tmp_path / "ops.parquet"
    pd.DataFrame(probes("convnet@224", {1: 9.0, 2: 17.0, 4: 31.0, 8: 59.0})
                 + probes("condconv@224", {2: 10.0, 4: 4.0, 8: 20.0})).assign(op_trace_error="").to_parquet(path)
    data = pd.DataFrame({"model_id": ["convnet@224", "convnet@224", "condconv@224"], "batch": [1024, 2, 1024]})
    kept = with_op_features(data, path)
    assert list(kept["model_id"]) == ["convnet@224", "convnet@224"]
    assert kept[OP_FEATURES[0]].tolist() == [3 + 7 * 1024, 17.0]
    assert kept[PER_SAMPLE_OPS[0]].tolist() == [(3 + 7 * 1024) / 1024, 17.0 / 2]


def test_a_candidate_blended_with_composed_is_the_geometric_mean_of_its_members():
    import numpy as np
    from timm_family import CANDIDATES, FEATURES, PER_SAMPLE_OPS, composed_per_sample, predict_candidates, \
        with_derived_features

    rng = np.random.default_rng(0)
    n = 40
    batch = rng.choice([256, 1024], n).astype(float)
    totals = pd.DataFrame(rng.uniform(1.0, 1e6, (n, len(OP_FEATURES))), columns=list(OP_FEATURES))
    rows = pd.concat([totals, (totals.div(batch, axis=0)).set_axis(PER_SAMPLE_OPS, axis=1)], axis=1).assign(
        **{f: rng.uniform(1.0, 100.0, n) for f in FEATURES if f != "batch"}, batch=batch,
        latency_ms=totals.sum(axis=1).to_numpy() / batch * 1e-4)
    rows = with_derived_features(rows)
    train, test = rows.iloc[:30], rows.iloc[30:]
    out = predict_candidates(train, test, ["et300+log_ops+shares", "composed", "et300+log_ops+shares+composed"])
    assert CANDIDATES["composed"].trees == 0
    np.testing.assert_allclose(out["composed"], composed_per_sample(train, test))
    np.testing.assert_allclose(out["et300+log_ops+shares+composed"],
                               np.sqrt(out["et300+log_ops+shares"] * out["composed"]), rtol=1e-12)
    assert not np.allclose(out["et300+log_ops+shares"], out["composed"])  # two members that differ
