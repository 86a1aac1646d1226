"""The GPU spec table and its lookup."""

from __future__ import annotations

import re

import pytest

from perfzoo.hardware_specs import NUMERIC_COLUMNS, SPEC_COLUMNS, load_gpu_specs, lookup_gpu
from perfzoo.io import InputError

NVML_NAMES = {
    "Tesla V100-PCIE-16GB": "V100 PCIe 16GB",
    "Tesla V100-PCIE-32GB": "V100 PCIe 32GB",
    "Tesla V100-SXM2-16GB": "V100 SXM2 16GB",
    "Tesla V100-SXM2-32GB": "V100 SXM2 32GB",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe 40GB",
    "NVIDIA A100-SXM4-40GB": "A100 SXM4 40GB",
    "NVIDIA A100 80GB PCIe": "A100 PCIe 80GB",
    "NVIDIA A100-SXM4-80GB": "A100 SXM4 80GB",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "NVIDIA A10": "A10",
    "Tesla T4": "T4",
    "NVIDIA GeForce RTX 3090": "RTX 3090",
    "NVIDIA GeForce RTX 4090": "RTX 4090",
    "NVIDIA RTX A6000": "RTX A6000",
    "NVIDIA RTX 6000 Ada Generation": "RTX 6000 Ada",
}


def test_columns_sources_and_positive_numbers() -> None:
    table = load_gpu_specs()
    assert tuple(table.columns) == SPEC_COLUMNS
    assert table["name"].is_unique and len(table) >= 19
    assert table["source"].str.match(r"https://[\w.-]+\.(nvidia\.com)/\S+").all()
    for column in NUMERIC_COLUMNS:
        values = table[column].dropna()
        assert (values > 0).all(), column
    for column in ("peak_fp32_tflops", "peak_fp16_tflops", "mem_gb", "mem_bw_gbs", "sm_count", "tdp_w"):
        assert table[column].notna().all(), column
    assert (table["peak_fp16_tflops"] > table["peak_fp32_tflops"]).all()  # tensor cores beat CUDA cores
    assert (table["min_power_w"].dropna() < table.loc[table["min_power_w"].notna(), "tdp_w"]).all()


@pytest.mark.parametrize(("nvml_name", "row"), sorted(NVML_NAMES.items()))
def test_every_nvml_name_matches_exactly_one_row(nvml_name: str, row: str) -> None:
    table = load_gpu_specs()
    hits = [
        n
        for n, p in zip(table["name"], table["match"], strict=True)
        if re.search(p, nvml_name, re.IGNORECASE)
    ]
    assert hits == [row]
    assert lookup_gpu(nvml_name)["name"] == row


def test_lookup_by_table_name_returns_row_with_none_for_missing() -> None:
    spec = lookup_gpu("v100 sxm2 32gb")
    assert spec["mem_gb"] == 32.0 and spec["peak_tf32_tflops"] is None
    assert lookup_gpu("A100 SXM4 40GB")["peak_fp16_tflops"] == 312.0


@pytest.mark.parametrize(
    ("name", "suggested"),
    [
        ("NVIDIA H200 NVL", "H200 SXM"),
        ("A100 SXM 40GB", "A100 SXM4 40GB"),
        ("NVIDIA GeForce RTX 3090 Ti", "RTX 3090"),
    ],
)
def test_unknown_name_suggests_close_names(name: str, suggested: str) -> None:
    with pytest.raises(
        InputError, match=rf"'{re.escape(name)}' is not in .*gpu_specs\.csv; close names: .*{suggested}"
    ):
        lookup_gpu(name)


def test_returned_copy_does_not_alter_the_table() -> None:
    table = load_gpu_specs()
    table.loc[0, "mem_gb"] = -1
    assert load_gpu_specs().loc[0, "mem_gb"] > 0
