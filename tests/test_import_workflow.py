"""Import-only workflow: real Snakemake on a subset of timm's benchmark files, no local device, no zoo."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from perfzoo.config import validate_config
from perfzoo.io import InputError

from conftest import ROOT, snakemake

pytestmark = pytest.mark.e2e

TIMM = ROOT / "tests" / "fixtures" / "timm"
FILES = {"rtx3090": "benchmark-infer-amp-nchw-pt240-cu124-rtx3090.csv",
         "rtx4090": "benchmark-infer-amp-nchw-pt291-cu128-4090.csv",
         "rtx5090": "benchmark-infer-amp-nchw-pt291-cu130-5090.csv"}
# measured by perfzoo on an H200 with timm's protocol; one model has an error and no time (an absolute path)
H200 = ROOT / "tests" / "fixtures" / "gpu-h200" / "benchmark-infer-amp-nchw-pt211-cu130-h200.csv"


def config(timm_dir: Path) -> dict:
    external = {name: {"path": f, "format": "timm"} for name, f in FILES.items()}
    external["rtx4090"]["device_map"] = "gpus.yaml"  # a device-map file, relative to the working directory
    external["h200"] = {"path": str(H200), "format": "timm"}
    return {"external_dir": str(timm_dir), "external": external,
            "splits": {"schemes": ["leave_one_device_out", "leave_one_family_out"]},
            "fit": {"targets": ["latency_ms"], "regressors": ["linear"], "ablation_regressors": ["xgboost"],
                    "grid_search_splits": []}}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("import_only")
    tables = workdir / "tables"
    tables.mkdir()
    for name in FILES.values():
        (tables / name).write_text((TIMM / name).read_text())
    # one synthetic row under a name no installed timm has: a model that cannot be featurised (every model of the
    # fixtures can), with test_vit3's numbers
    with (tables / FILES["rtx4090"]).open("a") as table:
        table.write("retired_vit3,160,95175.2,10.737,1024,0.93,0.09,1.0\n")
    # one under a name timm renamed since (featurised as the architecture it names now), with the RTX 3090
    # file's numbers for that architecture
    with (tables / FILES["rtx3090"]).open("a") as table:
        table.write("tf_efficientnet_b0_ap,224,6210.04,164.879,1024,5.29,0.4,6.75\n")
    (workdir / "config.yaml").write_text(yaml.safe_dump(config(tables)))
    (workdir / "gpus.yaml").write_text('"4090": RTX 4090\n')
    snakemake(workdir)
    return workdir


def test_import_only_config_runs_to_the_report(run: Path) -> None:
    data = pd.read_parquet(run / "results/dataset/dataset.parquet")
    expected = sum(len(pd.read_csv(run / "tables" / f)) for f in FILES.values()) + 39  # the H200's measured models
    assert len(data) == expected and (data["trace_kind"] == "external").all()
    assert sorted(data["device"].unique()) == ["H200 SXM pt211-cu130", "RTX 3090 pt240-cu124",
                                                "RTX 4090 pt291-cu128", "RTX 5090 pt291-cu130"]
    assert "timm:efficientnet_cc_b1_8e" not in set(data["name"])
    assert not (run / "results/zoo").exists() and not (run / "results/traces").exists()
    metrics = pd.read_parquet(run / "results/evaluate/metrics.parquet")
    assert set(metrics["split"]) == {"leave_one_device_out", "leave_one_family_out"}
    by_device = metrics[metrics["split"] == "leave_one_device_out"].set_index("regressor")
    lodo = by_device.loc["linear"]
    featurised = data["feature_missing_reason"] == ""
    untraced = featurised & data["graph_nodes"].isna()  # models torch.fx cannot trace: no graph size, no median
    assert 0 < untraced.sum() < 10
    assert lodo["n"] + lodo["n_missing"] == featurised.sum() and lodo["folds"] == 4  # every row held out once
    assert lodo["n_missing"] == untraced.sum()  # linear uses the graph size: those rows are not predicted
    ablation = pd.read_parquet(run / "results/evaluate/ablation.parquet")
    assert ablation["mape"].notna().all()  # a row without a prediction is counted, not scored as NaN
    assert ablation.loc[ablation["split"] == "leave_one_device_out", "n_missing"].max() == untraced.sum()
    # a workload no other GPU ran (most of the H200's): "same workload on the nearest device" has no number for it
    devices_of = data.groupby("model_id")["device"].nunique()
    alone = int((data["model_id"].map(devices_of) == 1).sum())
    assert by_device.loc["baseline:device_peak", "n_missing"] == alone > 30
    index = (run / "results/report/index.html").read_text()
    assert "1 row(s) of 1 model(s) that could not be featurised excluded" in index
    assert "1 imported config(s) not measured in their table (no time, left out)" in index
    assert "1 config(s) on H200 SXM pt211-cu130 ended with status not measured (imported table)" in index
    assert "not measured: timm:efficientnet_cc_b1_8e (240px, batch 1024): no time:" in (
        run / "logs/external/h200.log").read_text()
    assert (run / "results/report/figures/latency_vs_batch.png").stat().st_size > 0
    log = (run / "logs/external/rtx4090.log").read_text()
    assert "not featurised: timm:retired_vit3" in log and "of 10 models (9 featurised, 1 not)" in log
    renamed = "timm:tf_efficientnet_b0_ap -&gt; timm:tf_efficientnet_b0.ap_in1k"  # as the page escapes it
    assert f"1 imported model(s) featurised under the name timm gives them now: {renamed}" in index
    assert "featurised as: timm:tf_efficientnet_b0_ap -> timm:tf_efficientnet_b0.ap_in1k" in (
        run / "logs/external/rtx3090.log").read_text()


def test_relative_tables_are_read_from_external_dir(tmp_path: Path) -> None:
    for name in FILES.values():
        (tmp_path / name).write_text((TIMM / name).read_text())
    cfg = config(tmp_path / "elsewhere")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "gpus.yaml").write_text('"4090": RTX 4090\n')
    snakemake(tmp_path, "-n", "--config", f"external_dir={tmp_path}")
    proc = snakemake(tmp_path, "-n", check=False)
    assert proc.returncode != 0 and "elsewhere" in proc.stderr + proc.stdout


def test_a_config_needs_devices_and_zoo_together_or_external_tables() -> None:
    with pytest.raises(InputError, match="nothing to do"):
        validate_config({})
    with pytest.raises(InputError, match="devices is given but zoo.families is empty"):
        validate_config({"devices": {"cpu": {"kind": "cpu"}}, "external": {"t": "x.csv"}})
    cfg = {"external": {"t": {"path": "x.csv", "format": "timm", "precision": "bf16"}}}
    validate_config(cfg)
    assert cfg["devices"] == {} and cfg["zoo"]["families"] == {}


def test_shipped_timm_config_is_valid_and_plans_every_stage() -> None:
    cfg = yaml.safe_load((ROOT / "config" / "timm-benchmark.yaml").read_text())
    validate_config(cfg)
    assert set(cfg["splits"]["schemes"]) == {"leave_one_device_out", "leave_one_family_out", "few_shot_device"}
    assert len(cfg["external"]) == 6 and all(e["format"] == "timm" for e in cfg["external"].values())


def test_bf16_in_the_zoo_on_a_gpu_without_bf16_is_a_validation_error_naming_the_device() -> None:
    family = {"builder": "mlp", "models": ["mlp"], "precisions": ["fp32", "bf16"]}
    cfg = {"devices": {"v100": {"kind": "cuda", "gpu_name": "V100-SXM2-16GB"}},
           "zoo": {"families": {"m": family}}}
    with pytest.raises(InputError, match=r"devices.v100: precision bf16 is not supported on V100 SXM2 16GB"):
        validate_config(cfg)
    cfg["devices"] = {"a100": {"kind": "cuda", "gpu_name": "A100-SXM4-80GB"}}
    validate_config(cfg)
