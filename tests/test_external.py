"""Importing external measurement tables: unit conversion, spec-sheet hardware features, row-named errors."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import perfzoo.provenance
from perfzoo.models.builders import build_model
from perfzoo.dataset.build import MODEL_FEATURES
from perfzoo.dataset.external import (
    LABELS,
    ImportOptions,
    convert,
    external_main,
    family_from_name,
    import_external,
    import_summary,
    resolve_builder,
)
from perfzoo.features.meta import featurise
from perfzoo.features import pool
from perfzoo.features.op_kinds import OP_FEATURES
from perfzoo.features.pool import FeatureJob, featurise_job, featurise_jobs, load_cache, scale_features
from perfzoo.fitting import fit_split
from perfzoo.hardware.specs import lookup_gpu
from perfzoo.io import InputError
from perfzoo.provenance import read_provenance
from perfzoo.dataset.splits import make_split, split_notes
from perfzoo.dataset.timm import TimmFile, describe_file, timm_family

FIXTURE = Path(__file__).parent / "fixtures" / "external_measurements.csv"
HEADER = "model,device,batch,mode,precision,n_gpus,metric,value,unit"
# Two GPUs of the spec table, one named as NVML reports it, one by its table name. Numbers are made up.
ROWS = [
    "resnet18,NVIDIA A100-SXM4-80GB,32,inference,fp32,1,latency,0.0125,s",
    "resnet18,NVIDIA A100-SXM4-80GB,32,inference,fp32,1,peak_memory,1.5,GB",
    "resnet18,NVIDIA A100-SXM4-80GB,32,inference,fp32,1,power,0.25,kW",
    "resnet18,NVIDIA A100-SXM4-80GB,32,inference,fp32,1,energy,0.001,Wh",
    "resnet18,H100 SXM,32,inference,fp32,1,latency,6400,us",
    "resnet18,H100 SXM,32,inference,fp32,1,peak_memory,1536,MiB",
    "resnet18,H100 SXM,32,inference,fp32,1,energy,2.5,kJ",
    "resnet18,H100 SXM,32,training,fp16,1,throughput,40,it/s",
    "inhouse_cnn,H100 SXM,8,training,fp32,2,throughput,900,images/s",
]


@pytest.fixture(autouse=True)
def _no_git(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perfzoo.provenance, "code_version", lambda: "test")


def write_csv(tmp_path: Path, rows: list[str], header: str = HEADER, name: str = "m.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_import_converts_units_and_adds_spec_hardware_features(tmp_path: Path) -> None:
    data, prov = import_external(write_csv(tmp_path, ROWS))
    assert len(data) == 4 and not data["row_id"].duplicated().any()
    assert sorted(data["device"].unique()) == ["A100 SXM4 80GB", "H100 SXM"]
    a100 = data[(data["device"] == "A100 SXM4 80GB")].iloc[0]
    assert a100["device_reported"] == "NVIDIA A100-SXM4-80GB" and a100["family"] == "resnet"
    assert a100["latency_ms"] == pytest.approx(12.5)
    assert a100["peak_mem_mb"] == pytest.approx(1.5 * 1024)  # GB read as 2^30 bytes = 1024 MB (MiB)
    assert a100["mean_power_w"] == pytest.approx(250)
    assert a100["energy_j"] == pytest.approx(3.6)
    assert a100["throughput"] == pytest.approx(32 / 12.5 * 1000)  # derived from latency
    assert a100["energy_per_sample_j"] == pytest.approx(3.6 / 32)
    assert a100["edp"] == pytest.approx(3.6 * 0.0125)
    assert set(a100["derived_labels"].split(",")) == {"throughput", "energy_per_sample_j", "edp"}
    h100 = data[(data["device"] == "H100 SXM") & (data["mode"] == "inference")].iloc[0]
    assert h100["latency_ms"] == pytest.approx(6.4) and h100["peak_mem_mb"] == pytest.approx(1536)
    assert h100["energy_j"] == pytest.approx(2500) and math.isnan(h100["mean_power_w"])
    train = data[(data["model_id"] != h100["model_id"]) & (data["name"] == "resnet18")].iloc[0]
    assert train["throughput"] == pytest.approx(40 * 32)  # it/s x batch = samples/s
    assert train["latency_ms"] == pytest.approx(25.0) and train["precision"] == "fp16"
    for _, row in data.iterrows():
        spec = lookup_gpu(row["device"])
        peak = spec["peak_fp16_tflops"] if row["precision"] == "fp16" else spec["peak_fp32_tflops"]
        assert row["hw_peak_gflops"] == pytest.approx(peak * 1000)  # the peak of the row's precision
        assert row["hw_tensor_cores"] == (1.0 if row["precision"] == "fp16" else 0.0)
        assert row["hw_mem_bw_gbs"] == spec["mem_bw_gbs"] and row["hw_cores"] == spec["sm_count"]
        assert row["hw_mem_gb"] == spec["mem_gb"] and row["hw_spec_tdp_w"] == spec["tdp_w"]
        assert row["trace_kind"] == "external" and row["source_sha256"] == prov["source"]["sha256"]
    assert set(LABELS) <= set(data.columns)
    assert data.select_dtypes("number").columns.str.startswith("hw_").sum() == 11
    key = data[["model_id", "device", "mode", "batch"]].astype(str)
    assert data["row_id"].equals(key.agg("|".join, axis=1))


def test_known_models_are_featurised_others_get_a_reason(tmp_path: Path) -> None:
    data, _ = import_external(write_csv(tmp_path, ROWS))
    known = data[data["name"] == "resnet18"]
    assert (known["feature_missing_reason"] == "").all() and (known["flops"] > 0).all()
    fp16 = known[known["precision"] == "fp16"].iloc[0]
    fp32 = known[known["precision"] == "fp32"].iloc[0]
    assert fp16["weight_bytes"] == pytest.approx(fp32["weight_bytes"] / 2, rel=1e-3)  # built in float16
    assert fp16["flops"] > fp16["flops_fw"]  # training step counts the backward pass
    other = data[data["name"] == "inhouse_cnn"].iloc[0]
    assert math.isnan(other["flops"]) and "not a timm or torchvision model" in other["feature_missing_reason"]
    assert other["hw_n_gpus"] == 2 and other["label"] == "inhouse_cnn@fp32x2"
    skipped, _ = import_external(write_csv(tmp_path, ROWS), featurise_models=False)
    assert skipped["flops"].isna().all() and (skipped["feature_missing_reason"] != "").all()


def test_imported_rows_support_leave_one_device_out(tmp_path: Path) -> None:
    data, _ = import_external(write_csv(tmp_path, ROWS), featurise_models=False)
    split = make_split("leave_one_device_out", data, {"seed": 1337})
    assert sorted(split["fold"].unique()) == ["A100 SXM4 80GB", "H100 SXM"]
    assert split_notes("leave_one_device_out", data, {}) == []


def test_sha256_in_provenance_is_the_files_hash(tmp_path: Path) -> None:
    path = write_csv(tmp_path, ROWS)
    _, prov = import_external(path, featurise_models=False)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert prov["source"]["sha256"] == digest and prov["inputs"][str(path)] == digest
    assert prov["source"]["kind"] == "external" and prov["source"]["data_rows"] == len(ROWS)


@pytest.mark.parametrize(("bad_row", "expected"), [
    ("resnet18,NVIDIA Z9000,32,inference,fp32,1,latency,3,ms", "row 3 (line 4): device 'NVIDIA Z9000'"),
    ("resnet18,T4,32,inference,fp32,1,latency,3,fortnights", "row 3 (line 4): unknown unit 'fortnights'"),
    ("resnet18,T4,32,inference,fp32,1,flux,3,ms", "row 3 (line 4): unknown metric 'flux'"),
    ("resnet18,T4,32,inference,fp32,1,latency,fast,ms", "row 3 (line 4): value 'fast'"),
    ("resnet18,T4,32,inference,fp32,1,latency,-2,ms", "row 3 (line 4): value '-2'"),
    ("resnet18,T4,0,inference,fp32,1,latency,2,ms", "row 3 (line 4): batch '0'"),
    ("resnet18,T4,32,sleeping,fp32,1,latency,2,ms", "row 3 (line 4): unknown mode 'sleeping'"),
    ("resnet18,T4,32,inference,fp32,1,latency,2,GB", "unknown unit 'GB' for metric 'latency'"),
])
def test_bad_rows_raise_input_error_naming_row_and_value(tmp_path: Path, bad_row: str, expected: str) -> None:
    path = write_csv(tmp_path, [ROWS[0], ROWS[1], bad_row, ROWS[4]])
    with pytest.raises(InputError) as err:
        import_external(path, featurise_models=False)
    message = str(err.value)
    assert expected in message and str(path) in message and "\n" not in message


def test_rows_count_data_rows_not_comments_or_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text(f"# example\n\n{HEADER}\n{ROWS[0]}\n\n{ROWS[0].replace('A100-SXM4-80GB', 'B999')}\n")
    with pytest.raises(InputError, match=r"row 2 \(line 6\): device 'NVIDIA B999'"):
        import_external(path, featurise_models=False)


def test_missing_columns_duplicates_and_family_conflicts_are_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"missing columns \['unit'\]"):
        import_external(write_csv(tmp_path, ["x,T4,1,inference,fp32,1,latency,2"],
                                  header="model,device,batch,mode,precision,n_gpus,metric,value"))
    with pytest.raises(InputError, match="rows 1, 2 give the same latency_ms"):
        import_external(write_csv(tmp_path, [ROWS[0], ROWS[0].replace("0.0125,s", "12,ms")]),
                        featurise_models=False)
    rows = ["a1,T4,1,inference,fp32,1,latency,2,ms,cnn", "a1,T4,2,inference,fp32,1,latency,3,ms,mlp"]
    with pytest.raises(InputError, match="model 'a1' is given different families"):
        import_external(write_csv(tmp_path, rows, header=HEADER + ",family"), featurise_models=False)


def test_optional_columns_default_and_family_column_wins(tmp_path: Path) -> None:
    rows = ["netA,T4,4,train,,,latency,10,ms,convnets", "netA,T4,4,train,,,energy,5,MJ,"]
    data, _ = import_external(write_csv(tmp_path, rows, header=HEADER + ",family"), featurise_models=False)
    row = data.iloc[0]
    assert row["family"] == "convnets" and row["precision"] == "fp32" and row["n_gpus"] == 1
    assert row["mode"] == "training" and row["energy_j"] == pytest.approx(5e6)  # MJ is mega, mJ milli
    assert convert("energy_j", 5, "mJ", 1) == pytest.approx(5e-3)
    assert convert("peak_mem_mb", 1, "MB", 1) == convert("peak_mem_mb", 1, "MiB", 1) == 1.0
    assert convert("throughput", 3, "samples/sec", 8) == 3 and convert("throughput", 3, "it/s", 8) == 24
    assert family_from_name("vit_base_patch16_224") == "vit" and family_from_name("timm:resnet50") == "resnet"


def test_example_fixture_parses(tmp_path: Path) -> None:
    data, _ = import_external(FIXTURE, featurise_models=False)
    assert len(data) == 4 and data["device"].nunique() == 3


def test_cli_writes_table_with_provenance_and_reports_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, out = write_csv(tmp_path, ROWS), tmp_path / "out" / "ext.parquet"
    assert external_main([str(path), "-o", str(out), "--no-features", "--quiet"]) == 0
    table = pd.read_parquet(out)
    assert len(table) == 4
    assert read_provenance(out)["source"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    bad = write_csv(tmp_path, [ROWS[0].replace("latency", "flux")], name="bad.csv")
    assert external_main([str(bad), "-o", str(tmp_path / "bad.parquet"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("perfzoo-import: error:") and "row 1" in err[-1]
    assert not (tmp_path / "bad.parquet").exists()


# --------------------------------------------------------------------------- honest imports (issue: GPU transfer)

TIMM = Path(__file__).parent / "fixtures" / "timm"
TIMM_3090 = TIMM / "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv"
TIMM_4090 = TIMM / "benchmark-infer-amp-nchw-pt291-cu128-4090.csv"
UNKNOWN = "timm:retired_vit3"
"""A synthetic row's model, under a name no installed timm has (as 167 names of timm's own training file are)."""


def timm_4090_with_an_unknown_model(tmp_path: Path) -> Path:
    """The 4090 fixture plus one synthetic row (``test_vit3``'s numbers under :data:`UNKNOWN`): a model that
    cannot be featurised, now that every model of the fixtures can."""
    path = tmp_path / TIMM_4090.name
    path.write_text(TIMM_4090.read_text() + "retired_vit3,160,95175.2,10.737,1024,0.93,0.09,1.0\n")
    return path


def test_unknown_optional_column_is_an_error_naming_it_and_the_accepted_ones(tmp_path: Path) -> None:
    path = write_csv(tmp_path, [ROWS[0].replace(",1,latency", ",1,latency")], header=HEADER.replace("n_gpus", "n_gpu"))
    with pytest.raises(InputError, match=r"unknown column 'n_gpu' \(required: .*optional: precision, n_gpus"):
        import_external(path, featurise_models=False)


def test_every_unmapped_gpu_is_listed_at_once_with_close_names_and_the_device_map_hint(tmp_path: Path) -> None:
    rows = [ROWS[0], "resnet18,GeForce RTX 3090 Ti,8,inference,fp32,1,latency,3,ms",
            "resnet18,Tesla V100 32G,8,inference,fp32,1,latency,3,ms",
            "resnet18,GeForce RTX 3090 Ti,16,inference,fp32,1,latency,5,ms"]
    path = write_csv(tmp_path, rows)
    with pytest.raises(InputError) as err:
        import_external(path, featurise_models=False)
    message = str(err.value)
    assert "2 GPU names not in the spec table" in message and "\n" not in message
    assert "row 2 (line 3): device 'GeForce RTX 3090 Ti' (close names: RTX 3090" in message
    assert "row 3 (line 4): device 'Tesla V100 32G' (close names: V100" in message
    assert "--device-map" in message and "device_map:" in message
    mapping = {"GeForce RTX 3090 Ti": "RTX 3090", "Tesla V100 32G": "V100 PCIe 32GB"}
    data, prov = import_external(path, options=ImportOptions(device_map=mapping, featurise_models=False))
    assert sorted(data["device"].unique()) == ["A100 SXM4 80GB", "RTX 3090", "V100 PCIe 32GB"]
    assert set(data.loc[data["device"] == "RTX 3090", "device_reported"]) == {"GeForce RTX 3090 Ti"}
    assert prov["config"]["device_map"] == mapping
    with pytest.raises(InputError, match="device map entry 'x': GPU 'Z1' is not in"):
        import_external(path, options=ImportOptions(device_map={"x": "Z1"}, featurise_models=False))


def test_device_map_file_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path, ["resnet18,my-gpu-7,8,inference,fp32,1,latency,3,ms"])
    out = tmp_path / "o.parquet"
    assert external_main([str(path), "-o", str(out), "--no-features", "--quiet"]) == 2
    assert "my-gpu-7" in capsys.readouterr().err
    (tmp_path / "map.yaml").write_text("my-gpu-7: L40S\n")
    assert external_main([str(path), "-o", str(out), "--no-features", "--quiet",
                          "--device-map", str(tmp_path / "map.yaml")]) == 0
    assert pd.read_parquet(out)["device"].tolist() == ["L40S"]


@pytest.mark.parametrize(("precision", "column", "tensor"), [
    ("fp32", "peak_fp32_tflops", 0.0), ("tf32", "peak_tf32_tflops", 1.0), ("fp16", "peak_fp16_tflops", 1.0),
    ("bf16", "peak_bf16_tflops", 1.0), ("amp", "peak_fp16_tflops", 1.0), ("mixed", "peak_fp16_tflops", 1.0),
])
def test_peak_and_roofline_follow_the_precision(tmp_path: Path, precision: str, column: str, tensor: float) -> None:
    path = write_csv(tmp_path, [f"resnet18,NVIDIA A100-SXM4-80GB,8,inference,{precision},1,latency,3,ms"])
    row = import_external(path)[0].iloc[0]
    peak = lookup_gpu("A100 SXM4 80GB")[column] * 1000
    assert row["hw_peak_gflops"] == pytest.approx(peak) and row["hw_tensor_cores"] == tensor
    assert row["roofline_compute_ms"] == pytest.approx(row["flops"] / (peak * 1e9) * 1e3)


@pytest.mark.parametrize("device", ["Tesla V100-SXM2-16GB", "Tesla T4", "NVIDIA GeForce RTX 2080 Ti"])
def test_bf16_on_a_gpu_without_bf16_is_an_error_naming_the_device(tmp_path: Path, device: str) -> None:
    path = write_csv(tmp_path, [f"resnet18,{device},8,inference,bf16,1,latency,3,ms"])
    with pytest.raises(InputError, match=r"row 1 \(line 2\): precision bf16 is not supported on (V100|T4|RTX 2080)"):
        import_external(path, featurise_models=False)
    with pytest.raises(InputError, match=r"unknown precision 'fp8' \(accepted: fp32, tf32, fp16, bf16, amp"):
        import_external(write_csv(tmp_path, [f"resnet18,{device},8,inference,fp8,1,latency,3,ms"]),
                        featurise_models=False)


def test_unfeaturisable_models_are_named_counted_and_never_given_features(tmp_path: Path) -> None:
    table = timm_4090_with_an_unknown_model(tmp_path)
    with pytest.raises(InputError, match="looks like a timm benchmark file: use --format timm"):
        import_external(table)
    data, prov = import_external(table, options=ImportOptions(fmt="timm"))
    bad = data[data["feature_missing_reason"] != ""]
    assert list(bad["name"]) == [UNKNOWN] and bad[list(MODEL_FEATURES)].isna().all().all()
    assert bad["roofline_ms"].isna().all()  # no roofline from features that do not exist
    assert UNKNOWN in bad["feature_missing_reason"].iloc[0]
    assert [m["name"] for m in prov["unfeaturisable"]] == [UNKNOWN]
    summary = import_summary(data, "x.parquet")
    assert summary[0].startswith(f"{len(data)} rows ({len(data) - 1} featurised, 1 without features")
    assert f"of {data['name'].nunique()} models ({data['name'].nunique() - 1} featurised, 1 not)" in summary[0]
    assert summary[1].startswith(f"  not featurised: {UNKNOWN} (amp, 160px, inference; 1 rows): '{UNKNOWN}' is not")
    with pytest.raises(InputError, match=rf"1 model\(s\) cannot be featurised, e.g. {UNKNOWN} \('{UNKNOWN}' is not"):
        import_external(table, options=ImportOptions(fmt="timm", strict=True))


def test_fitting_leaves_unfeaturisable_rows_out_and_counts_them(tmp_path: Path) -> None:
    data = pd.concat([import_external(p, options=ImportOptions(fmt="timm"))[0]
                      for p in (TIMM_3090, timm_4090_with_an_unknown_model(tmp_path))], ignore_index=True)
    split = make_split("leave_one_device_out", data, {"seed": 1337})
    predictions, _, notes = fit_split(data, split, "latency_ms", "linear")
    assert notes["excluded_unfeaturised_rows"] == 1 and notes["unfeaturised_models"] == [f"{UNKNOWN}@amp"]
    assert UNKNOWN not in set(predictions["label"].str.split("@").str[0])
    assert len(predictions) == int((data["feature_missing_reason"] == "").sum())


def test_a_row_missing_a_feature_is_neither_fitted_on_nor_predicted_with_a_median(tmp_path: Path) -> None:
    data = pd.concat([import_external(p, options=ImportOptions(fmt="timm"))[0]
                      for p in (TIMM_3090, timm_4090_with_an_unknown_model(tmp_path))], ignore_index=True)
    featurised = data["feature_missing_reason"] == ""
    assert data.loc[featurised, "flops"].notna().all()
    gap = data.index[featurised & (data["name"] == data.loc[featurised, "name"].iloc[0])]  # one model, both GPUs
    data.loc[gap, "flops"] = np.nan  # as a feature a featurisation could not compute
    split = make_split("leave_one_device_out", data, {"seed": 1337})
    predictions, models, notes = fit_split(data, split, "latency_ms", "linear")
    trained_on = {fold: int((data.loc[gap, "device"] != fold).sum()) for fold in models}  # the held device is the fold
    assert set(trained_on.values()) != {0}
    assert notes["excluded_rows_missing_features"] == {fold: {"rows": n, "features": ["flops"]}
                                                       for fold, n in trained_on.items() if n}
    missing = predictions["row_id"].isin(data.loc[gap, "row_id"])
    assert missing.sum() == len(gap) and predictions.loc[missing, "y_pred"].isna().all()
    assert np.isfinite(predictions.loc[~missing, "y_pred"]).all()


def test_timm_benchmark_files_are_read_with_device_precision_software_and_timm_family() -> None:
    data, prov = import_external(TIMM_3090, options=ImportOptions(fmt="timm"))
    raw = pd.read_csv(TIMM_3090)
    assert len(data) == len(raw) and prov["source"]["models"] == raw["model"].nunique()
    assert set(data["device"]) == {"RTX 3090 pt240-cu124"} and set(data["gpu"]) == {"RTX 3090"}
    assert set(data["precision"]) == {"amp"} and set(data["mode"]) == {"inference"}
    row = data[(data["name"] == "timm:resnet50") & (data["resolution"] == 224)].iloc[0]
    source = raw[(raw["model"] == "resnet50") & (raw["infer_img_size"] == 224)].iloc[0]
    assert row["latency_ms"] == source["infer_step_time"] and row["throughput"] == source["infer_samples_per_sec"]
    assert row["batch"] == source["infer_batch_size"] and row["derived_labels"] == ""
    families = data.drop_duplicates("name").set_index("name")["family"]
    assert families["timm:resnet50"] == "resnet" and families["timm:deit_tiny_patch16_224"] == "deit"
    assert families["timm:vit_tiny_patch16_224"] == "vision_transformer"
    assert row["hw_peak_gflops"] == lookup_gpu("RTX 3090")["peak_fp16_tflops"] * 1000  # AMP: FP16 tensor peak
    assert describe_file("results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv") == TimmFile(
        "training", "amp", "rtx3090", "pt112-cu113")
    with pytest.raises(InputError, match="does not say the device and precision"):
        import_external(FIXTURE, options=ImportOptions(fmt="timm"))


def test_a_timm_name_this_timm_does_not_know_is_imported_with_its_label(tmp_path) -> None:
    """timm's training file (torch 1.12) names models a newer timm dropped: the import does not stop at them;
    their rows keep their labels, with the family read from the name (timm has no module for them)."""
    path = tmp_path / "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv"
    path.write_text("model,train_samples_per_sec,train_step_time,train_batch_size,train_img_size,param_count\n"
                    "convnext_nano_hnf,1000.0,256.0,256,224,15.59\n"
                    "resnet18,2000.0,128.0,256,224,11.69\n")
    assert timm_family("convnext_nano_hnf") == "" and timm_family("resnet18.a1_in1k") == "resnet"
    data, _ = import_external(path, options=ImportOptions(fmt="timm", featurise_models=False))
    rows = data.set_index("name")
    assert rows.loc["timm:convnext_nano_hnf", "family"] == "convnext"
    assert rows.loc["timm:resnet18", "family"] == "resnet"
    assert rows.loc["timm:convnext_nano_hnf", "latency_ms"] == 256.0


def test_a_name_timm_renamed_is_featurised_as_the_model_timm_builds_for_it_now(tmp_path) -> None:
    """timm's table of renamed models maps the training file's ``gluon_resnet18_v1b`` to ``resnet18.gluon_in1k``:
    its row gets resnet18's features (same resolution and batch), the provenance and summary say under which
    name, and a name timm removed without a successor stays unfeaturised with its reason."""
    path = tmp_path / "benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv"
    path.write_text("model,train_samples_per_sec,train_step_time,train_batch_size,train_img_size,param_count\n"
                    "gluon_resnet18_v1b,1000.0,8.0,8,64,11.69\n"
                    "resnet18,1000.0,8.0,8,64,11.69\n"
                    "convnext_nano_hnf,1000.0,8.0,8,64,15.59\n")
    assert resolve_builder("timm:gluon_resnet18_v1b") == ("timm", "resnet18.gluon_in1k")
    assert resolve_builder("timm:convnext_nano_hnf") is None
    assert resolve_builder("timm:vit_base_patch16_224_sam") == ("timm", "vit_base_patch16_224")  # a tag timm dropped
    data, prov = import_external(path, options=ImportOptions(fmt="timm", workers=1))
    rows = data.set_index("name")
    renamed, current = rows.loc["timm:gluon_resnet18_v1b"], rows.loc["timm:resnet18"]
    assert renamed["feature_missing_reason"] == "" and renamed["family"] == "resnet"
    assert renamed[list(MODEL_FEATURES)].equals(current[list(MODEL_FEATURES)])
    assert renamed["flops"] > 0
    assert prov["featurised_as"] == {"timm:gluon_resnet18_v1b": "timm:resnet18.gluon_in1k"}
    assert "is not a timm or torchvision model name" in rows.loc["timm:convnext_nano_hnf", "feature_missing_reason"]
    summary = import_summary(data, "x.parquet", prov)
    assert "  featurised as: timm:gluon_resnet18_v1b -> timm:resnet18.gluon_in1k" in summary


def test_batch_scaled_features_equal_a_direct_featurisation(monkeypatch: pytest.MonkeyPatch) -> None:
    job = FeatureJob("timm", "efficientnet_b0", "amp", 96, "training", (3, 64))
    references = {}
    for batch in job.batches:
        build = partial(build_model, "timm", "efficientnet_b0", {}, 1000, (3, 96, 96))
        direct, _ = featurise(build, (3, 96, 96), batch, "training", "float32", "x")
        references[batch] = {k: v for k, v in direct.items() if k != "model_id"}
    # two batches: featurised at each batch on one build (probes would cost more than they save)
    shared = featurise_job(job)
    assert shared.method == "direct" and not shared.reason and shared.probes is None
    for batch in job.batches:
        assert {k: v for k, v in shared.features[batch].items() if k != "model_id"} == references[batch]
    monkeypatch.setattr(pool, "SCALED_FROM", len(job.batches))  # as a job with more batches: probed
    result = featurise_job(job)  # a traced step: its bytes read from cache are no line in the batch, so direct
    assert result.method == "direct" and not result.reason
    for batch in job.batches:
        assert {k: v for k, v in result.features[batch].items() if k != "model_id"} == references[batch]
    probes = tuple(featurise(partial(build_model, "timm", "efficientnet_b0", {}, 1000, (3, 96, 96)), (3, 96, 96),
                             b, "training", "float32", "x")[0] for b in pool.PROBE_BATCHES)
    assert scale_features(probes, 64) is None
    # a step without an operator trace is scaled exactly; its other batch-dependent features are lines
    untraced = tuple({**p, **dict.fromkeys(OP_FEATURES, float("nan"))} for p in probes)
    low, high, eight = untraced
    scaled = scale_features(untraced, 64)
    assert scaled is not None and scaled["flops"] == references[64]["flops"]
    assert scaled["activation_bytes"] == references[64]["activation_bytes"]
    assert scale_features((low, {**high, "flops": high["flops"] + 2}, eight), 64) is None  # not on a line
    assert scale_features((low, {**high, "params": high["params"] + 1}, eight), 64) is None  # batch-dependent
    shifted = tuple({**p, "flops": p["flops"] + 6} for p in untraced)  # a once-per-step part
    assert scale_features(shifted, 64)["flops"] == references[64]["flops"] + 6  # affine: exact


def test_directly_featurised_batches_are_cached_and_reloaded(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "_CACHE", {})
    job = FeatureJob("timm", "resnet18", "fp32", 32, "inference", (1, 4))
    cache = tmp_path / "features.jsonl"
    (first,) = featurise_jobs([job], workers=1, cache_path=cache)
    assert first.method == "direct" and sorted(first.features) == [1, 4]
    monkeypatch.setattr(pool, "_CACHE", {})
    assert load_cache(cache) == 1

    def featurised_again(job: FeatureJob) -> None:
        raise AssertionError(f"{job.batches} featurised again")

    monkeypatch.setattr(pool, "featurise_job", featurised_again)
    (again,) = featurise_jobs([replace(job, batches=(4,))], workers=1)
    assert again.method == "direct" and json.dumps(again.features) == json.dumps({4: first.features[4]})
    with pytest.raises(AssertionError, match=r"\(2,\) featurised again"):  # a batch not cached is featurised
        featurise_jobs([replace(job, batches=(2,))], workers=1)


@pytest.mark.parametrize("module", ["features/recurrent.py", "features/ops.py", "models/builders.py"])
def test_the_feature_cache_is_set_aside_when_any_featuriser_module_changes(tmp_path: Path, module: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    before = pool.featuriser_source_digest()
    changed = Path(pool.__file__).parents[1] / module
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda path: read_bytes(path) + (b"#" if path == changed else b""))
    assert pool.featuriser_source_digest() != before
    monkeypatch.undo()
    cache = tmp_path / "features.jsonl"
    entry = {"key": ["timm", "resnet18", "fp32", 32, "inference", 100], "reason": "", "probes": None,
             "features": {"1": {"flops": 1.0}}}
    stale = {**pool._versions(), "featuriser_source": "0" * 16}
    cache.write_text(json.dumps({**entry, "versions": stale}) + "\n")
    assert load_cache(cache) == 0  # numbers of another featuriser are never reused
    cache.write_text(json.dumps({**entry, "versions": pool._versions()}) + "\n")
    monkeypatch.setattr(pool, "_CACHE", {})
    assert load_cache(cache) == 1


def test_timm_model_whose_module_mentions_img_size_but_whose_class_takes_none_is_built_at_any_size() -> None:
    import torch

    with torch.device("meta"):  # hieradet's module mentions img_size; its class rejects the argument
        model = build_model("timm", "hieradet_small", {}, 10, (3, 256, 256))
        out = model(torch.empty(1, 3, 256, 256))
    assert tuple(out.shape) == (1, 10)
    with pytest.raises(TypeError, match="img_size"):  # a size the user passes explicitly is never dropped
        build_model("timm", "hieradet_small", {"img_size": 256}, 10, (3, 256, 256))


# --------------------------------------------------------------------------- a GPU measured with timm's protocol

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "gpu-h200" / "benchmark-infer-amp-nchw-pt211-cu130-h200.csv"
H100 = FIXTURES / "gpu-h100" / "timm" / "benchmark-infer-amp-nchw-pt211-cu130-h100.csv"


@pytest.mark.parametrize(("path", "device_map", "gpu", "measured_n", "missing", "why", "batch"), [
    (H200, {}, "H200 SXM", 39, "efficientnet_cc_b1_8e", "stopped at its time limit", "240px, batch 1024"),
    # "h100" in a file name is the SXM or the PCIe part: the device map says which
    (H100, {"h100": "H100 SXM"}, "H100 SXM", 97, "tf_efficientnet_cc_b0_4e", "per-model limit", "224px, batch 1024"),
])
def test_gpu_file_measured_here_imports_and_its_unmeasured_model_is_named_with_the_reason_never_a_number(
        path: Path, device_map: dict[str, str], gpu: str, measured_n: int, missing: str, why: str, batch: str) -> None:
    options = ImportOptions(fmt="timm", featurise_models=False, device_map=device_map)
    data, prov = import_external(path, options=options)
    raw = pd.read_csv(path)
    measured = raw[raw["infer_step_time"].notna()]
    assert len(data) == len(measured) == measured_n and set(data["device"]) == {f"{gpu} pt211-cu130"}
    assert set(data["gpu"]) == {gpu} and data["latency_ms"].notna().all()
    assert data["hw_peak_gflops"].iloc[0] == lookup_gpu(gpu)["peak_fp16_tflops"] * 1000
    row = data[data["name"] == "timm:resnet50"].iloc[0]
    assert row["latency_ms"] == measured.set_index("model").loc["resnet50", "infer_step_time"]
    assert f"timm:{missing}" not in set(data["name"])
    [not_measured] = prov["not_measured"]
    assert not_measured["name"] == f"timm:{missing}" and not_measured["device"] == f"{gpu} pt211-cu130"
    assert why in not_measured["reason"]
    summary = import_summary(data, "out.parquet", prov)
    assert summary[-2] == "1 model(s) not measured in the table (no time; left out):"
    assert summary[-1].startswith(f"  not measured: timm:{missing} ({batch}): no time:")


def test_timm_file_with_only_unmeasured_models_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "benchmark-infer-amp-nchw-pt211-cu130-h200.csv"
    path.write_text("model,infer_img_size,infer_samples_per_sec,infer_step_time,infer_batch_size,error\n"
                    "resnet50,224,,,1024,CUDA out of memory\n")
    with pytest.raises(InputError, match=r"benchmark-infer-amp-nchw-pt211-cu130-h200.csv: no measured model "
                                         r"\(1 row\(s\) with an error only\)"):
        import_external(path, options=ImportOptions(fmt="timm", featurise_models=False))


def test_unmeasured_imported_models_are_counted_in_the_status_table_and_the_report_notes() -> None:
    from perfzoo.dataset.build import NOT_MEASURED_STATUS, with_imported_statuses
    from perfzoo.report.html import report_notes

    profiled = pd.DataFrame({"device": ["cpu"], "status": ["ok"], "configs": [12]})
    assert with_imported_statuses(profiled, []) is profiled
    _, prov = import_external(H200, options=ImportOptions(fmt="timm", featurise_models=False))
    statuses = with_imported_statuses(profiled, prov["not_measured"])
    assert statuses.to_dict("records") == [
        {"device": "cpu", "status": "ok", "configs": 12},
        {"device": "H200 SXM pt211-cu130", "status": NOT_MEASURED_STATUS, "configs": 1}]
    assert report_notes(statuses, []) == ["1 config(s) on H200 SXM pt211-cu130 ended with status "
                                          "not measured (imported table)"]


def test_report_notes_name_the_models_featurised_under_timms_current_name_the_first_ten_and_a_count() -> None:
    from perfzoo.report.html import RENAMED_NAMED, report_notes

    ok = pd.DataFrame({"device": ["cpu"], "status": ["ok"], "configs": [12]})
    assert report_notes(ok, [], featurised_as={}) == []
    renamed = {f"timm:old_{i:02d}": f"timm:new_{i:02d}" for i in range(RENAMED_NAMED + 3)}
    [note] = report_notes(ok, [], featurised_as=renamed)
    assert note.startswith(f"{RENAMED_NAMED + 3} imported model(s) featurised under the name timm gives them now: "
                           "timm:old_00 -> timm:new_00, timm:old_01 -> timm:new_01")
    assert f"timm:old_{RENAMED_NAMED - 1:02d} -> " in note and f"timm:old_{RENAMED_NAMED:02d}" not in note
    assert note.endswith(", and 3 more (each import's log names them)")


TIMM_HEADER = "model,infer_img_size,infer_samples_per_sec,infer_step_time,infer_batch_size,param_count\n"


def test_the_models_of_every_table_are_featurised_once_for_every_batch_they_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workflow's import jobs: the first featurises every table's models, each at every batch any table lists
    (timm's files: 1,024 on most GPUs, 2,048 on another); a later job, a new process reading the cache file, builds
    no model; a table that cannot be read is named and left to its own import."""
    from perfzoo.dataset.external import entry_options, featurise_tables

    monkeypatch.setattr(pool, "_CACHE", {})
    tables = []
    for gpu, batch in (("5090", 1024), ("4090", 2048)):
        path = tmp_path / f"benchmark-infer-amp-nchw-pt291-cu130-{gpu}.csv"
        path.write_text(TIMM_HEADER + f"resnet18,64,1000.0,{batch / 1000:.3f},{batch},11.69\n")
        tables.append((path, {"format": "timm"}, None))
    cache = str(tmp_path / "features.jsonl")
    missing = (tmp_path / "benchmark-infer-amp-nchw-pt291-cu130-3090.csv", {"format": "timm"}, None)
    skipped = featurise_tables([*tables, missing], entry_options({"format": "timm"}, None, 1, cache))
    assert len(skipped) == 1 and skipped[0].startswith(str(missing[0]))
    assert load_cache(cache) == 1  # one model, one job holding both batches

    def built_again(job: FeatureJob) -> None:
        raise AssertionError(f"{job.name} at {job.batches} featurised again")

    monkeypatch.setattr(pool, "_CACHE", {})  # a later import job
    monkeypatch.setattr(pool, "featurise_job", built_again)
    for path, entry, _ in tables:
        rows, _ = import_external(path, options=entry_options(entry, None, 1, cache))
        assert rows["flops"].notna().all() and (rows["featurised_by"] != "").all()


def test_a_cache_line_its_writer_left_unfinished_is_passed_over(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "features.jsonl"
    entry = {"key": ["timm", "resnet18", "fp32", 32, "inference", 100], "reason": "", "probes": None,
             "features": {"1": {"flops": 1.0}}, "versions": pool._versions()}
    cache.write_text(json.dumps(entry) + "\n" + json.dumps(entry)[:40])
    monkeypatch.setattr(pool, "_CACHE", {})
    assert load_cache(cache) == 1


def test_jobs_featurised_by_two_forked_workers_equal_those_featurised_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The import featuriser's worker pool (perfzoo.features.meta.forked_pool) returns every job's result, in order,
    equal to one process's."""
    jobs = [FeatureJob("torchvision", "resnet18", "fp32", 32, "inference", (1, 2)),
            FeatureJob("torchvision", "mobilenet_v3_small", "fp32", 32, "training", (2,))]
    monkeypatch.setattr(pool, "_CACHE", {})
    here = featurise_jobs(jobs, workers=1)
    monkeypatch.setattr(pool, "_CACHE", {})
    forked = featurise_jobs(jobs, workers=2)
    assert [r.job for r in forked] == jobs
    assert [r.features for r in forked] == [r.features for r in here] and all(r.features for r in here)
