"""MIG profile tables and the profile recommendation."""

from __future__ import annotations

import math

import pytest

from perfzoo.hardware import mig
from perfzoo.io import InputError


def test_tables_are_consistent_with_the_mig_user_guide() -> None:
    for gpu, profiles in mig.MIG_PROFILES.items():
        full = max(profiles, key=lambda p: p.compute_slices)
        assert full.compute_slices == 7 and full.max_instances == 1, gpu
        assert full.name == f"7g.{full.memory_gb:g}gb"
        for p in profiles:
            assert p.name == f"{p.compute_slices}g.{p.memory_gb:g}gb"
            assert p.compute_slices * p.max_instances <= 7
    assert [p.name for p in mig.mig_profiles("NVIDIA H200")] == [
        "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-80GB"),
        ("NVIDIA H200", "H200-141GB"),
    ],
)
def test_resolve_nvml_names(name: str, key: str) -> None:
    assert mig.resolve_mig_gpu(name) == key


@pytest.mark.parametrize("name", ["Tesla V100-SXM2-32GB", "NVIDIA GH200 480GB", "NVIDIA H100 NVL"])
def test_gpus_without_a_table_are_refused(name: str) -> None:
    with pytest.raises(InputError, match="no MIG profile table"):
        mig.resolve_mig_gpu(name)


def test_memory_only_picks_smallest_fitting_profile() -> None:
    rec = mig.recommend_mig("A100-40GB", predicted_peak_mem_mb=6000.0, predicted_latency_ms=4.0)
    assert rec["profile"] == "1g.10gb"  # 6600 MB with the 10 % margin: more than 5 GB, less than 10 GB
    assert [r["profile"] for r in rec["rejected"]] == ["1g.5gb"]
    assert "memory" in rec["rejected"][0]["reason"]
    assert rec["scaled_latency_ms"] == pytest.approx(28.0)  # 4 ms * 7 / 1


def test_margin_pushes_to_a_bigger_profile() -> None:
    assert mig.recommend_mig("A100-40GB", 4800.0, None, margin=0.0)["profile"] == "1g.5gb"
    assert mig.recommend_mig("A100-40GB", 4800.0, None, margin=0.1)["profile"] == "1g.10gb"


def test_latency_target_makes_it_pick_a_bigger_slice() -> None:
    memory_only = mig.recommend_mig("A100-80GB", 3000.0, predicted_latency_ms=3.0)
    assert memory_only["profile"] == "1g.10gb"
    rec = mig.recommend_mig("A100-80GB", 3000.0, predicted_latency_ms=3.0, latency_target_ms=8.0)
    # 1 slice -> 21 ms, 2 slices -> 10.5 ms, 3 slices -> 7 ms <= 8 ms
    assert rec["profile"] == "3g.40gb"
    assert rec["scaled_latency_ms"] == pytest.approx(7.0)
    assert [r["profile"] for r in rec["rejected"]] == ["1g.10gb", "1g.20gb", "2g.20gb"]
    assert all(r["reason"].startswith("latency") for r in rec["rejected"])


def test_nothing_fits_gives_none_with_reason() -> None:
    rec = mig.recommend_mig("A100-40GB", predicted_peak_mem_mb=39000.0, predicted_latency_ms=1.0)
    assert rec["profile"] is None
    assert rec["reason"].startswith("no MIG profile fits") and "7g.40gb: memory" in rec["reason"]
    assert len(rec["rejected"]) == len(mig.MIG_PROFILES["A100-40GB"])
    too_slow = mig.recommend_mig("H100-80GB", 1000.0, predicted_latency_ms=10.0, latency_target_ms=5.0)
    assert too_slow["profile"] is None and "latency" in too_slow["reason"]


def test_bad_input_is_refused() -> None:
    with pytest.raises(InputError, match="predicted_peak_mem_mb"):
        mig.recommend_mig("A100-40GB", math.nan, 1.0)
    with pytest.raises(InputError, match="predicted_latency_ms"):
        mig.recommend_mig("A100-40GB", 100.0, None, latency_target_ms=5.0)
    with pytest.raises(InputError, match="unknown MIG profiles"):
        mig.recommend_mig("A100-40GB", 100.0, None, profiles=["9g.99gb"])


def test_report_table_reproduces_dippm_table_with_seed_rule() -> None:
    # predicted and measured memory of DIPPM's Table 4.5; eq. 2 (no margin, four A100 profiles)
    rows = [
        ("densenet121", 8, 2865, 3272, "1g.5gb"),
        ("densenet121", 32, 5952, 6294, "2g.10gb"),
        ("swin_base_patch4", 2, 2873, 2944, "1g.5gb"),
        ("swin_base_patch4", 16, 6736, 6156, "2g.10gb"),
        ("convnext_base", 4, 4771, 1652, "1g.5gb"),
        ("convnext_base", 128, 26439, 30996, "7g.40gb"),
    ]
    table = mig.mig_report_table(
        [{"model": m, "batch": b, "predicted_mem_mb": p, "measured_mem_mb": a} for m, b, p, a, _ in rows],
        "A100-40GB",
        margin=0.0,
        profiles=mig.DIPPM_A100_PROFILES,
    )
    assert table["predicted_mig"].tolist() == [r[-1] for r in rows]
    assert list(table.columns[:5]) == [
        "model",
        "batch",
        "predicted_mig",
        "predicted_mem_mb",
        "measured_mem_mb",
    ]
    assert table.loc[5, "use_7g.40gb_pct"] == pytest.approx(100 * 30996 / 40960)
    assert math.isnan(table.loc[5, "use_3g.20gb_pct"])  # measured memory does not fit
    assert table.loc[0, "use_1g.5gb_pct"] == pytest.approx(100 * 3272 / 5120)
