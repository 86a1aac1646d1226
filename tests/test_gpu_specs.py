"""The GPU spec table and its lookup."""

from __future__ import annotations

import re

import pytest

from perfzoo.hardware.specs import NUMERIC_COLUMNS, SPEC_COLUMNS, load_gpu_specs, lookup_gpu
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
    for column in ("mem_gb", "mem_bw_gbs", "sm_count", "tdp_w", "arch"):
        assert table[column].notna().all(), column
    both = table.dropna(subset=["peak_fp16_tflops", "peak_fp32_tflops"])
    assert len(both) >= len(table) - 2  # a peak the source does not state is missing, said so in the note
    assert (both["peak_fp16_tflops"] > both["peak_fp32_tflops"]).all()  # tensor cores beat CUDA cores
    unstated = table[table[["peak_fp32_tflops", "peak_fp16_tflops"]].isna().any(axis=1)]
    assert unstated["note"].str.contains("missing").all()
    pre_ampere = table["arch"].isin(["Volta", "Turing"])
    assert table.loc[pre_ampere, ["peak_tf32_tflops", "peak_bf16_tflops"]].isna().all().all()
    assert table.loc[~pre_ampere, "peak_bf16_tflops"].notna().sum() >= len(table[~pre_ampere]) - 1
    assert (table["min_power_w"].dropna() < table.loc[table["min_power_w"].notna(), "tdp_w"]).all()


DEVELOPMENT_AND_COMMON_GPUS = [
    "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 5090",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "Tesla V100-SXM2-16GB", "Tesla T4",
    "NVIDIA A10", "NVIDIA A30", "NVIDIA A40", "NVIDIA L4", "NVIDIA L40", "NVIDIA L40S", "NVIDIA H100 PCIe",
    "NVIDIA H200", "NVIDIA B200", "NVIDIA GeForce RTX 2080 Ti", "Quadro RTX 8000", "NVIDIA RTX A5000",
    "NVIDIA RTX A6000", "NVIDIA RTX 6000 Ada Generation",
]


@pytest.mark.parametrize("nvml_name", DEVELOPMENT_AND_COMMON_GPUS)
def test_development_and_common_gpus_have_a_row_with_its_source(nvml_name: str) -> None:
    spec = lookup_gpu(nvml_name)
    assert spec["source"].startswith("https://") and spec["mem_bw_gbs"] > 0


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
