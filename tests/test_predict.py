"""perfzoo predict: API, CLI, intervals, warnings, recommendations, provenance and bad input.

The workflow outputs are built programmatically with the package functions the rule scripts call
(zoo → features → traces → dataset → split → fit → evaluate), on two devices: ``cpu`` (no energy
sensor) and ``a100`` (a cuda device whose energy labels are filled in), so that energy, MIG and cost
paths are exercised without a GPU.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT

from perfzoo.prediction.predictors import merge_fold_notes

CONFIG: dict[str, Any] = {
    "devices": {
        "cpu": {"kind": "cpu", "threads": 1, "price_per_hour": 0.12},
        "a100": {
            "kind": "cuda",
            "gpu_name": "A100-SXM4-40GB",
            "spec": "A100 SXM4 40GB",
            "price_per_hour": 3.0,
            "carbon_intensity_g_per_kwh": 300,
            "power_limits_w": [250, 400],
        },
    },
    "zoo": {
        "num_classes": 10,
        "families": {
            "mlp": {
                "builder": "mlp",
                "input_shape": [64],
                "batch_sizes": [1, 4, 8],
                "models": [
                    {"name": "mlp_small", "kwargs": {"in_features": 64, "hidden": [32, 32]}},
                    {"name": "mlp", "variant": "wide", "kwargs": {"in_features": 64, "hidden": [256]}},
                    {"name": "mlp", "variant": "deep", "kwargs": {"in_features": 64, "hidden": [64, 64, 64]}},
                ],
            },
            "transformer": {
                "builder": "transformer",
                "sequence_lengths": [8],
                "batch_sizes": [1, 4, 8],
                "models": [{"name": "encoder", "kwargs": {"d_model": 32, "heads": 2, "layers": 1}}],
            },
        },
    },
    "shards": {"size": 16},
    "splits": {"schemes": ["random", "leave_one_family_out"], "seed": 1337, "random_fractions": [0.5, 0.25, 0.25]},
    "fit": {
        "targets": ["latency_ms", "peak_mem_mb", "energy_per_sample_j"],
        "regressors": ["linear", "random_forest"],
        "seed": 0,
    },
}
HARDWARE = {
    "cpu": {
        "device": "cpu",
        "kind": "cpu",
        "name": "Test CPU",
        "cores_used": 1,
        "memory_gb": 16.0,
        "measured_gemm_gflops_fp32": 50.0,
        "measured_copy_gbs": 10.0,
        "energy_sensor": None,
        "energy_missing_reason": "no energy sensor read on kind 'cpu' (RAPL is not used)",
    },
    "a100": {
        "device": "a100",
        "kind": "cuda",
        "name": "NVIDIA A100-SXM4-40GB",
        "sm_count": 108,
        "memory_gb": 40.0,
        "measured_gemm_gflops_fp32": 19000.0,
        "measured_copy_gbs": 1300.0,
        "energy_sensor": "nvml",
    },
}
_BUILT: dict[str, Path] = {}


def _synthetic_traces(manifest: pd.DataFrame, features: pd.DataFrame, device: str) -> pd.DataFrame:
    """Five measured iterations per config: time grows with FLOPs and bytes; the a100 is faster."""
    from perfzoo.profiling.runner import TRACE_COLUMNS

    rng = np.random.default_rng(0 if device == "cpu" else 1)
    feats = features.set_index(["model_id", "mode", "batch"])
    speed = 1.0 if device == "cpu" else 0.05
    rows = []
    for cfg in manifest.to_dict("records"):
        f = feats.loc[(cfg["model_id"], cfg["mode"], cfg["batch"])]
        base = speed * (0.05 + f["flops"] / 2e8 + f["activation_bytes"] / 5e8)
        mem = 40.0 + f["train_mem_estimate_bytes"] / 2**20 * (1.5 if device == "cpu" else 1.2)
        for it in range(5):
            rows.append(
                {
                    "model_id": cfg["model_id"],
                    "config_id": cfg["config_id"],
                    "mode": cfg["mode"],
                    "batch": cfg["batch"],
                    "repeat": 0,
                    "iter": it,
                    "time_ms": base * (1 + 0.02 * rng.standard_normal()),
                    "status": "ok",
                    "message": "",
                    "peak_mem_mb": mem,
                    "n_warmup": 1,
                    "stop_reason": "ci",
                    "threads": 1,
                }
            )
    return pd.DataFrame(rows, columns=TRACE_COLUMNS)


def build_workflow_outputs(workdir: Path) -> Path:
    """Write config.yaml and results/ of a finished (tiny) workflow run into ``workdir``."""
    from perfzoo.dataset.build import build_dataset
    from perfzoo.evaluate import metrics_table, with_intervals
    from perfzoo.features.meta import featurise_manifest
    from perfzoo.fitting import fit_split, save_models
    from perfzoo.io import write_json
    from perfzoo.provenance import provenance, write_table
    from perfzoo.dataset.splits import make_split
    from perfzoo.models.zoo import expand_zoo, manifest_frame

    cwd = os.getcwd()
    os.chdir(workdir)  # the workflow records paths relative to its directory
    try:
        (workdir / "config.yaml").write_text(yaml.safe_dump(CONFIG))
        manifest = manifest_frame(expand_zoo(CONFIG))
        write_table("results/zoo/manifest.parquet", manifest, provenance([], {"zoo": CONFIG["zoo"]}))
        models, _ = featurise_manifest(manifest, CONFIG["zoo"]["num_classes"], progress=False)
        write_table("results/features/models.parquet", models, provenance(["results/zoo/manifest.parquet"]))
        traces, hardware = [], []
        for device, hw in HARDWARE.items():
            path = f"results/traces/{device}/s0000.parquet"
            write_table(
                path,
                _synthetic_traces(manifest, models, device),
                provenance(["results/zoo/manifest.parquet"], {"device": CONFIG["devices"][device]}),
            )
            traces.append(path)
            hardware.append(f"results/hardware/{device}.json")
            write_json(
                hardware[-1], {**hw, "provenance": provenance([], {"device": CONFIG["devices"][device]})}
            )
        data, noise, _ = build_dataset(manifest, models, traces, hardware)
        gpu = (
            data["device"] == "a100"
        )  # the GPU's energy labels, as the NVML path of the dataset stage gives them
        data.loc[gpu, "mean_power_w"] = 80 + 30 * np.log1p(data.loc[gpu, "flops"] / 1e6)
        data.loc[gpu, "energy_j"] = data.loc[gpu, "mean_power_w"] * data.loc[gpu, "latency_ms"] / 1e3
        data.loc[gpu, "energy_per_sample_j"] = data.loc[gpu, "energy_j"] / data.loc[gpu, "batch"]
        data.loc[gpu, "edp"] = data.loc[gpu, "energy_j"] * data.loc[gpu, "latency_ms"] / 1e3
        data.loc[gpu, "energy_missing_reason"] = None
        prov = provenance(
            ["results/zoo/manifest.parquet", "results/features/models.parquet", *traces, *hardware]
        )
        write_table("results/dataset/dataset.parquet", data, prov)
        write_table("results/dataset/noise_floor.parquet", noise, prov)
        held = []
        for scheme in CONFIG["splits"]["schemes"]:
            split = make_split(scheme, data, CONFIG["splits"])
            split_path = f"results/splits/{scheme}.parquet"
            write_table(split_path, split, provenance(["results/dataset/dataset.parquet"]))
            for target in CONFIG["fit"]["targets"]:
                for regressor in CONFIG["fit"]["regressors"]:
                    stem = f"results/fit/{target}/{regressor}/{scheme}"
                    params = {"n_estimators": 50} if regressor == "random_forest" else None
                    predictions, fitted, notes = fit_split(data, split, target, regressor, params)
                    prov = provenance(
                        ["results/dataset/dataset.parquet", split_path],
                        {"target": target, "regressor": regressor, "split": scheme, "notes": notes},
                    )
                    save_models(f"{stem}.models.json", fitted, prov)
                    write_table(f"{stem}.predictions.parquet", predictions, prov)
                    held.append(f"{stem}.predictions.parquet")
        frames = [pd.read_parquet(p) for p in held]
        write_table(
            "results/evaluate/metrics.parquet",
            metrics_table(with_intervals(pd.concat(frames, ignore_index=True)), noise),
            provenance([*held, "results/dataset/noise_floor.parquet"]),
        )
    finally:
        os.chdir(cwd)
    return workdir


@pytest.fixture(scope="session")
def workflow_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny workflow run (built once per test session, shared by test_audit.py)."""
    if "dir" not in _BUILT:
        _BUILT["dir"] = build_workflow_outputs(tmp_path_factory.mktemp("workflow"))
    return _BUILT["dir"]


@pytest.fixture
def run_dir(workflow_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(workflow_dir)
    return workflow_dir


def perfzoo_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "perfzoo", *args],
        cwd=cwd,
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
        env=env,
    )


def _mlp() -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))


def _assert_intervals_bracket(table: pd.DataFrame) -> int:
    checked = 0
    for key in (
        "latency_ms",
        "throughput",
        "peak_mem_mb",
        "energy_per_sample_j",
        "edp",
        "cost_per_1k_samples",
        "carbon_g_per_1k_samples",
    ):
        for row in table.itertuples():
            v, lo, hi = getattr(row, key), getattr(row, f"{key}_lo"), getattr(row, f"{key}_hi")
            if math.isfinite(v):
                assert math.isfinite(lo) and math.isfinite(hi), (row.device, key)
                assert lo <= v <= hi, (row.device, key, lo, v, hi)
                checked += 1
    return checked


# --------------------------------------------------------------------------- API


def test_predict_module_instance_per_device_with_intervals(run_dir: Path) -> None:
    import perfzoo

    model = _mlp()
    result = perfzoo.predict(model, batch=4, input_shape=(64,))
    table = result.table.set_index("device")
    assert list(table.index) == ["a100", "cpu"]
    assert (table["latency_ms"] > 0).all() and (table["peak_mem_mb"] > 0).all()
    assert table.loc["a100", "latency_ms"] < table.loc["cpu", "latency_ms"]
    assert _assert_intervals_bracket(result.table) >= 10
    lat = result.record["devices"]["cpu"]["quantities"]["latency_ms"]
    # an anonymous nn.Sequential matches no profiled family: leave-one-family-out predictors, and conformal
    # intervals calibrated on the held-out residuals of that split
    assert lat["lo"] < lat["hi"] and lat["source"].endswith("/leave_one_family_out")
    assert "held-out rows of split leave_one_family_out" in lat["interval"]
    named = perfzoo.predict("mlp:mlp_small", batch=4, input_shape=(64,))
    lat = named.record["devices"]["cpu"]["quantities"]["latency_ms"]
    assert lat["lo"] < lat["hi"] and "held-out rows of split random" in lat["interval"]
    # the user's module is not touched: weights stay real, on the CPU
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert result.record["features"]["params"] == sum(p.numel() for p in model.parameters())


def test_energy_missing_on_cpu_with_reason_never_zero(run_dir: Path) -> None:
    from perfzoo.prediction import predict

    result = predict(_mlp(), batch=4, input_shape=64)
    cpu = result.record["devices"]["cpu"]["quantities"]
    a100 = result.record["devices"]["a100"]["quantities"]
    for key in ("energy_per_sample_j", "edp", "carbon_g_per_1k_samples", "mean_power_w"):
        assert cpu[key]["value"] is None and "no energy sensor" in cpu[key]["missing"], key
    assert a100["energy_per_sample_j"]["value"] > 0 and a100["carbon_g_per_1k_samples"]["value"] > 0
    assert a100["edp"]["source"].startswith("derived") and a100["edp"]["value"] > 0
    row = result.table.set_index("device").loc["cpu"]
    assert math.isnan(row["energy_per_sample_j"]) and "no energy sensor" in row["missing"]
    # cost: price per device-hour x predicted time for 1000 samples
    lat = a100["latency_ms"]["value"]
    assert a100["cost_per_1k_samples"]["value"] == pytest.approx(3.0 * lat * 1000 / 4 / 3.6e6)


def test_objectives_mig_and_power_cap(run_dir: Path) -> None:
    from perfzoo.prediction import predict

    energy = predict(_mlp(), batch=8, input_shape=64, objective="energy")
    assert energy.recommendation["device"] == "a100"
    assert "energy_per_sample_j missing" in energy.recommendation["excluded"]["cpu"]
    time = predict(_mlp(), batch=8, input_shape=64, objective="time", latency_target_ms=1e-9)
    assert (
        time.recommendation["device"] is None
        and "exceeds the target" in time.recommendation["excluded"]["a100"]
    )
    mig = energy.record["devices"]["a100"]["mig"]
    assert mig["gpu"] == "A100-40GB" and mig["profile"] == "1g.5gb"  # a tiny MLP fits the smallest slice
    assert mig["mig_mode"] is None and "not recorded in the hardware record" in mig["mig_state"]
    assert "not recorded in the hardware record" in energy.to_text()
    assert energy.record["devices"]["cpu"]["mig"] is None
    cap = energy.record["devices"]["a100"]["power_cap"]
    assert cap["power_cap_w"] is None and "power-limit feature" in cap["reason"]
    assert energy.record["devices"]["cpu"]["power_cap"] is None


def test_mig_state_says_whether_the_profiled_gpu_has_mig_on() -> None:
    from perfzoo.prediction.advice import mig_state

    assert mig_state({"mig_mode": "enabled"}) == {"mig_mode": "enabled",
                                                  "mig_state": "MIG is enabled on the profiled GPU"}
    off = mig_state({"mig_mode": "disabled"})
    assert off["mig_mode"] == "disabled" and "nvidia-smi -i <index> -mig 1" in off["mig_state"]
    unread = mig_state({"mig_mode": None, "identity": {"missing": {"mig_mode": "nvmlDeviceGetMigMode: Not Supported"}}})
    assert unread == {"mig_mode": None, "mig_state": "MIG mode not read: nvmlDeviceGetMigMode: Not Supported"}
    assert "not recorded" in mig_state(None)["mig_state"]


def test_predictor_choice_and_fold_average(run_dir: Path) -> None:
    from perfzoo.fitting import regressor_inputs
    from perfzoo.prediction import predict

    from perfzoo.prediction.predictors import IN_FAMILY_SPLITS, NEEDS_PROFILED_LAYERS, UNSEEN_FAMILY_SPLITS

    metrics = pd.read_parquet("results/evaluate/metrics.parquet")
    metrics = metrics[np.isfinite(metrics["mape"]) & ~metrics["regressor"].isin(NEEDS_PROFILED_LAYERS)]
    # a profiled family: the best score over the held-out rows of the within-family splits every candidate was
    # scored on, with the random split's models; an anonymous module (no family to match): the best score with
    # whole families or batches held out, with the leave-one-family-out split's models
    for model, split, scored in (("mlp:mlp_small", "random", IN_FAMILY_SPLITS),
                                 (_mlp(), "leave_one_family_out", UNSEEN_FAMILY_SPLITS)):
        chosen_all = predict(model, batch=4, input_shape=64).record["predictors"]
        for target, chosen in chosen_all.items():
            rows = metrics[metrics["target"] == target]
            fitted = [r for r in rows.loc[rows["split"] == split, "regressor"]
                      if Path(f"results/fit/{target}/{r}/{split}.models.json").is_file()]
            rows = rows[rows["regressor"].isin(fitted) & rows["split"].isin(scored)]
            rows = rows[rows.groupby("split")["regressor"].transform("nunique") == len(set(fitted))]
            pooled = (rows["mape"] * rows["n"]).groupby(rows["regressor"]).sum() / rows.groupby("regressor")["n"].sum()
            assert chosen["split"] == split
            assert chosen["regressor"] == pooled.idxmin(), target
            assert chosen["validation_mape"] == pytest.approx(pooled.min())
    result = predict(_mlp(), batch=4, input_shape=64)
    assert set(result.record["missing_targets"]) >= {"throughput", "mean_power_w"}
    assert "fit.targets" in result.record["missing_targets"]["throughput"]
    # the point value is the chosen file's fold models applied to the recorded feature row
    from perfzoo.fitting import load_models

    folds, _ = load_models(Path(result.record["predictors"]["latency_ms"]["path"]))
    X = pd.DataFrame([result.record["feature_rows"]["cpu"]])
    expected = np.mean([m.predict(regressor_inputs(X)) for m in folds.values()])
    assert result.record["devices"]["cpu"]["quantities"]["latency_ms"]["value"] == pytest.approx(expected)


def test_out_of_range_batch_warns(run_dir: Path) -> None:
    from perfzoo.prediction import predict

    inside = predict(_mlp(), batch=4, input_shape=64)
    assert not any("batch" in w for w in inside.warnings)
    big = predict(_mlp(), batch=512, input_shape=64)
    assert any("batch 512 is beyond the largest profiled batch (8)" in w for w in big.warnings)
    assert any(w.startswith("flops") for w in big.warnings)


def test_unprofiled_family_warns(run_dir: Path) -> None:
    from torch import nn

    from perfzoo.prediction import predict

    class ConvNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            self.head = nn.Linear(8, 10)

        def forward(self, x: Any) -> Any:
            return self.head(self.conv(x).mean(dim=(2, 3)))

    result = predict(ConvNet(), batch=1, input_shape="3,16,16")
    assert any("ConvNet" in w and "never profiled" in w for w in result.warnings)
    # an unseen family: predictors chosen by (and intervals from) the leave-one-family-out split
    assert {p["split"] for p in result.record["predictors"].values()} == {"leave_one_family_out"}
    assert "leave_one_family_out" in result.record["predictor_choice"]
    latency = result.record["devices"]["cpu"]["quantities"]["latency_ms"]
    assert latency["source"].endswith("/leave_one_family_out")  # whichever regressor wins on that split
    seen = predict("mlp:mlp_small", input_shape=64)
    assert not any("never profiled" in w for w in seen.warnings)
    assert {p["split"] for p in seen.record["predictors"].values()} == {"random"}


def test_predict_to_file_record(run_dir: Path, tmp_path: Path) -> None:
    from perfzoo.prediction import predict_to_file
    from perfzoo.provenance import sha256_file

    out = predict_to_file(
        {"name": "mlp:mlp_small", "batch": 4, "input": [64], "mode": "training"},
        run_dir / "results/predictions/mlp_small.json",
        "results",
        copy.deepcopy(CONFIG),
    )
    text = out.read_text()
    assert "NaN" not in text
    record = json.loads(text)
    assert record["model"]["mode"] == "training" and record["model"]["batch"] == 4
    prov = record["provenance"]
    for device in ("cpu", "a100"):
        trace = f"results/traces/{device}/s0000.parquet"
        assert prov["traces"][trace] == sha256_file(trace)
    for p in record["predictors"].values():
        assert prov["inputs"][p["path"]] == sha256_file(p["path"]) == p["sha256"]
        assert p["dataset_sha256"] == sha256_file("results/dataset/dataset.parquet")
    assert prov["config"]["devices"]["a100"]["price_per_hour"] == 3.0
    assert prov["code_version"] and prov["packages"]["torch"]
    assert not list(out.parent.glob(".*.tmp"))  # written atomically


# --------------------------------------------------------------------------- bad input


def test_unknown_name_lists_close_names(run_dir: Path) -> None:
    from perfzoo.io import InputError
    from perfzoo.prediction import predict

    with pytest.raises(InputError, match="did you mean: mlp_small"):
        predict("mlp:mlp_smal", input_shape=64)
    with pytest.raises(InputError, match=r"unknown torchvision model 'resnt50' \(did you mean: .*resnet50"):
        predict("torchvision:resnt50")
    with pytest.raises(InputError, match=r"^model: timm model 'gluon_resnet50_v1b' was renamed: it is "
                                         r"'resnet50.gluon_in1k' now$"):
        predict("timm:gluon_resnet50_v1b")
    with pytest.raises(InputError, match=r"^model: timm model 'gluon_resnet50_v1b' was renamed: it is "
                                         r"'resnet50.gluon_in1k' now$"):
        predict("gluon_resnet50_v1b")  # a bare name as well
    with pytest.raises(InputError, match=r"^model: timm model 'resnet50' has no tag 'gluon' \(did you mean: "
                                         r"resnet50.gluon_in1k"):
        predict("timm:resnet50.gluon")


def test_a_timm_name_with_a_weights_tag_names_its_architecture() -> None:
    """``timm:resnet50.gluon_in1k`` (as timm's renamed models and its model cards write it) is the architecture, built
    with random weights like any other; bare or with the library prefix."""
    from perfzoo.prediction.spec import resolve_model

    for text in ("timm:resnet50.gluon_in1k", "resnet50.gluon_in1k"):
        spec = resolve_model(text, (3, 64, 64))
        assert (spec.builder, spec.name) == ("timm", "resnet50.gluon_in1k")


def test_raising_factory_is_located(run_dir: Path, tmp_path: Path) -> None:
    from perfzoo.io import InputError
    from perfzoo.prediction import predict

    model_file = tmp_path / "net.py"
    model_file.write_text(
        textwrap.dedent("""\
        from torch import nn


        def helper():
            raise ValueError("width must be even")


        def build():
            return helper()


        class Bad(nn.Module):
            def forward(self, x):
                return x.view(-1, 7)[:, :3].unsqueeze(0) @ x.new_zeros(5, 5)


        def build_bad_forward():
            return Bad()
        """)
    )
    with pytest.raises(InputError) as err:
        predict(f"{model_file}:build", input_shape=64)
    message = str(err.value)
    assert f"{model_file}:5: ValueError: width must be even" in message and "\n" not in message
    with pytest.raises(InputError) as err:
        predict(f"{model_file}:build_bad_forward", input_shape=64)
    assert f"{model_file}:14: RuntimeError" in str(err.value) and "meta device" in str(err.value)
    with pytest.raises(InputError, match="defines no function 'buld'.*did you mean: build"):
        predict(f"{model_file}:buld", input_shape=64)


def test_empty_results_names_the_workflow_target(tmp_path: Path) -> None:
    from perfzoo.io import InputError
    from perfzoo.prediction import predict

    (tmp_path / "results").mkdir()
    with pytest.raises(InputError) as err:
        predict("mlp:mlp_small", input_shape=64, results=tmp_path / "results")
    assert "results/evaluate/metrics.parquet" in str(err.value) and "snakemake --cores all" in str(err.value)


def test_the_printed_record_says_its_precision_or_that_an_older_record_has_none(run_dir: Path) -> None:
    from perfzoo.prediction import predict
    from perfzoo.prediction.record import Prediction

    result = predict(_mlp(), batch=8, input_shape=64)
    assert ", precision fp32, " in result.to_text().splitlines()[0]
    older = copy.deepcopy(result.record)
    del older["model"]["precision"]  # as records were written before predictions had a precision
    head = Prediction(record=older, table=result.table).to_text().splitlines()[0]
    assert "precision not recorded (older record)" in head and "fp32" not in head


def test_bad_options(run_dir: Path) -> None:
    from perfzoo.io import InputError
    from perfzoo.prediction import parse_input, predict

    assert parse_input("3,224,224") == (3, 224, 224) and parse_input(128) == (128,)
    with pytest.raises(InputError, match="--input"):
        parse_input("3,two,2")
    with pytest.raises(InputError, match="--devices: unknown device 'a10'.*a100"):
        predict(_mlp(), input_shape=64, devices="a10")
    with pytest.raises(InputError, match="--objective"):
        predict(_mlp(), input_shape=64, objective="speed")
    with pytest.raises(InputError, match="--precision: unknown precision 'fp64'"):
        predict(_mlp(), input_shape=64, precision="fp64")
    with pytest.raises(InputError, match="--precision: bf16 builds the model in bfloat16"):
        predict(_mlp(), input_shape=64, precision="bfloat16")


# --------------------------------------------------------------------------- CLI


def test_cli_predict_factory_file(run_dir: Path, tmp_path: Path) -> None:
    model_file = tmp_path / "factory.py"
    model_file.write_text(
        "from torch import nn\n\n\ndef build():\n"
        "    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))\n"
    )
    out = tmp_path / "prediction.json"
    proc = perfzoo_cli(
        "predict",
        f"{model_file}:build",
        "--input",
        "64",
        "--batch",
        "8",
        "--objective",
        "energy",
        "--output",
        str(out),
        cwd=run_dir,
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["recommendation"]["device"] == "a100"
    assert record["features"]["params"] == 64 * 32 + 32 + 32 * 10 + 10
    assert record["provenance"]["inputs"][str(model_file)]  # the factory file is hashed too
    text = proc.stdout
    assert "device cpu (cpu)" in text and "device a100 (cuda)" in text and "MIG profile" in text
    assert "recommended device (energy): a100" in text
    cpu_block = text.split("device cpu (cpu)")[1].split("recommended device")[0]
    assert "energy per sample (J)           missing  not measured on cpu: no energy sensor" in cpu_block


def test_cli_bad_input_is_one_line_exit_2(run_dir: Path) -> None:
    proc = perfzoo_cli("predict", "mlp:mlp_smal", "--input", "64", cwd=run_dir)
    assert proc.returncode == 2
    assert (
        proc.stderr.count("\n") == 1
        and "mlp_small" in proc.stderr
        and proc.stderr.startswith("perfzoo: error:")
    )
    proc = perfzoo_cli("predict", "mlp:mlp_small", "--batch", "zero", cwd=run_dir)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def test_import_perfzoo_is_cheap_and_predict_callable() -> None:
    code = (
        "import sys, perfzoo; heavy = [m for m in ('torch', 'pandas', 'sklearn') if m in sys.modules]; "
        "import perfzoo.prediction, perfzoo.auditing; "
        "print(heavy, callable(perfzoo.predict), callable(perfzoo.audit))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        check=False,
    )
    assert out.stdout.strip() == "[] True True", out.stderr


def test_featurise_child_process_reports_file_and_line(tmp_path: Path) -> None:
    """The CLI featurises in a child process (forked, or a fresh interpreter): a raising factory is
    reported the same way from there."""
    from perfzoo.io import InputError
    from perfzoo.prediction import Featuriser, resolve_model

    model_file = tmp_path / "broken.py"
    model_file.write_text("def build():\n    raise KeyError('no such layer')\n")
    spec = resolve_model(f"{model_file}:build", 64)
    child = Featuriser(spec, 1, "inference", 10, "spawn")
    assert child.proc is not None
    with pytest.raises(InputError, match=f"{model_file}:2: KeyError: 'no such layer'"):
        child.result()
    assert not Path(child.tmp.name).exists()  # its files are cleaned up


class _Stub:
    """A fitted-regressor stand-in whose prediction depends on the power limit."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.feature_names_ = ["power_limit_w", "flops"]

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return self.fn(X["power_limit_w"].to_numpy(float))


def test_power_cap_sweep_picks_lowest_energy_meeting_the_target() -> None:
    from dataclasses import replace

    from perfzoo.evaluate import Calibration
    from perfzoo.prediction import (
        DeviceSettings,
        PredictionContext,
        Predictor,
        power_cap,
        row_quantities,
        target_predictions,
        with_roofline,
    )

    def stub(target: str, fn: Any) -> Predictor:
        return Predictor(
            target,
            "stub",
            "random",
            Path(f"{target}.models.json"),
            {"0": _Stub(fn)},
            {},
            5.0,
            10,
            Calibration(0.1, 30),
        )

    predictors = {
        "energy_per_sample_j": stub("energy_per_sample_j", lambda w: 1 + ((w - 300) / 100) ** 2),
        "latency_ms": stub("latency_ms", lambda w: 3000 / w),
    }
    row = {
        "flops": 1e9,
        "weight_bytes": 1e6,
        "activation_bytes": 1e6,
        "is_training": 0.0,
        "batch": 4,
        "hw_peak_gflops": 1e4,
        "hw_mem_bw_gbs": 1e3,
        "power_limit_w": 400.0,
    }
    cfg = DeviceSettings(kind="cuda", power_limits_w=[200, 300, 400])
    base = with_roofline(pd.DataFrame([row]))
    q = row_quantities(0, "gpu", target_predictions(base, predictors), predictors, {}, {}, 4, cfg, None)
    assert (
        q["energy_per_sample_j"]["lo"] <= q["energy_per_sample_j"]["value"] <= q["energy_per_sample_j"]["hi"]
    )
    ctx = PredictionContext(
        predictors=predictors,
        missing={},
        gaps={},
        batch=4,
        objective="energy",
        latency_target_ms=12.0,
    )
    assert (
        power_cap("gpu", row, cfg, q, ctx)["power_cap_w"] == 300
    )  # 200 W: lowest energy, but 15 ms > 12 ms
    assert power_cap("gpu", row, cfg, q, replace(ctx, latency_target_ms=8.0))["power_cap_w"] == 400
    none = power_cap("gpu", row, cfg, q, replace(ctx, latency_target_ms=1.0))
    assert none["power_cap_w"] is None and "latency target" in none["reason"]


def test_fold_average_conformal_interval_and_split_choice(tmp_path: Path) -> None:
    from perfzoo.evaluate import Calibration
    from perfzoo.prediction import Predictor, choose_file
    from perfzoo.prediction.predictors import MeasuredCoverage

    folds = {"a": _Stub(lambda w: np.full_like(w, 1.0)), "b": _Stub(lambda w: np.full_like(w, 3.0))}
    X = pd.DataFrame({"power_limit_w": [300.0]})
    calibrated = Calibration(math.log(1.5), 40)  # conformal half-width in log space over 40 held-out rows
    p = Predictor("latency_ms", "linear", "random", tmp_path / "m.json", folds, {}, 5.0, 50, calibrated,
                  MeasuredCoverage(0.8, 30, ""))
    point, lo, hi, method = p.predict(X)
    assert point[0] == pytest.approx(2.0)  # the mean of the fold predictions
    assert lo[0] == pytest.approx(2.0 / 1.5) and hi[0] == pytest.approx(3.0)
    assert "40 held-out rows of split random" in method
    assert "measured coverage 80% of 30 held-out test rows" in method and "outside the 85%–95% band" in method
    # too few residuals: no interval, with the reason, never a number
    few = Calibration(math.nan, 7, "7 calibration residuals, fewer than the 20 required")
    p = Predictor("latency_ms", "linear", "random", tmp_path / "m.json", folds, {}, 5.0, 50, few)
    point, lo, hi, method = p.predict(X)
    assert np.isnan(lo[0]) and np.isnan(hi[0]) and "no interval: 7 calibration residuals" in method
    # the lowest MAPE of the random split wins; without a random score, the best of any split
    metrics = pd.DataFrame({"target": "latency_ms", "regressor": ["linear", "random_forest", "xgboost"],
                            "split": ["random", "random", "leave_one_family_out"], "mape": [9.0, 7.0, 1.0],
                            "n": 10})  # fmt: skip
    for regressor, split in zip(metrics["regressor"], metrics["split"], strict=True):
        path = tmp_path / "fit" / "latency_ms" / regressor / f"{split}.models.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    assert choose_file(metrics, tmp_path, "latency_ms")[:2] == ("random_forest", "random")
    no_random = metrics[metrics["split"] != "random"]
    assert choose_file(no_random, tmp_path, "latency_ms")[:2] == ("xgboost", "leave_one_family_out")
    # with the other within-family splits scored too, their held-out rows count: linear is better on 100 rows
    # of family_monte_carlo, random_forest on the random split's 10, so linear is chosen, with random's models
    within = pd.concat([metrics, pd.DataFrame({"target": "latency_ms", "regressor": ["linear", "random_forest"],
                                               "split": "family_monte_carlo", "mape": [5.0, 8.0], "n": 100})])
    regressor, split, score, n, scored_on = choose_file(within, tmp_path, "latency_ms")
    assert (regressor, split, n, scored_on) == ("linear", "random", 110, ("random", "family_monte_carlo"))
    assert score == pytest.approx((9.0 * 10 + 5.0 * 100) / 110)
    # a split some candidate lacks is not pooled: the random split alone decides again
    lacking = within[~((within["regressor"] == "random_forest") & (within["split"] == "family_monte_carlo"))]
    assert choose_file(lacking, tmp_path, "latency_ms")[0] == "random_forest"
    # a family never profiled: leave-one-family-out and batch extrapolation pooled, with the former's models;
    # xgboost is best on whole families held out (10 rows), linear over both (40 rows)
    unseen = pd.DataFrame({"target": "latency_ms", "regressor": ["linear", "xgboost"] * 2,
                           "split": ["leave_one_family_out"] * 2 + ["batch_extrapolation"] * 2,
                           "mape": [3.0, 1.0, 10.0, 30.0], "n": [10, 10, 30, 30]})
    for regressor in ("linear", "xgboost"):
        path = tmp_path / "fit" / "latency_ms" / regressor / "leave_one_family_out.models.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    regressor, split, score, n, scored_on = choose_file(unseen, tmp_path, "latency_ms", "leave_one_family_out")
    assert (regressor, split, n, scored_on) == ("linear", "leave_one_family_out", 40,
                                                ("leave_one_family_out", "batch_extrapolation"))
    assert score == pytest.approx((3.0 * 10 + 10.0 * 30) / 40)
    only_families = unseen[unseen["split"] == "leave_one_family_out"]
    assert choose_file(only_families, tmp_path, "latency_ms", "leave_one_family_out")[:2] == (
        "xgboost", "leave_one_family_out")


def test_model_names_are_cached_per_user_not_per_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second workflow folder finds the name list the first one cached, without importing torchvision."""
    from importlib.metadata import version

    from perfzoo.models import builders

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    builders.library_model_names.cache_clear()
    try:
        (tmp_path / "a").mkdir()
        monkeypatch.chdir(tmp_path / "a")
        names = builders.library_model_names("torchvision")
        cached = tmp_path / "cache" / "perfzoo" / "model-names" / f"torchvision-{version('torchvision')}.json"
        assert json.loads(cached.read_text()) == list(names) and "resnet50" in names
        cached.write_text(json.dumps(["only_this_one"]))  # what the next lookup reads, wherever it runs
        builders.library_model_names.cache_clear()
        (tmp_path / "b").mkdir()
        monkeypatch.chdir(tmp_path / "b")
        assert builders.library_model_names("torchvision") == ("only_this_one",)
    finally:
        builders.library_model_names.cache_clear()


def test_fold_notes_that_differ_in_a_share_are_given_once_with_its_range() -> None:
    unseen = "operator kind 'recurrent' never seen in training: {} % of the predicted step (costed by the pooled fit)"
    fallback = "no operator trace (op aten::foo has no meta kernel); predicted by the fallback 'xgboost'"
    notes = [unseen.format(91), fallback, unseen.format(89), "kind 'attention': 4 % of conv2d", unseen.format(92),
             fallback]
    assert merge_fold_notes(notes) == [unseen.format("89-92"), fallback, "kind 'attention': 4 % of conv2d"]
    assert merge_fold_notes([unseen.format(7), unseen.format(7.0)]) == [unseen.format(7)]


def _linear_predictor(regressor: str, features: list[str], mape: float) -> Any:
    """A :class:`Predictor` of one linear fold model fitted on ``features`` of a synthetic latency table."""
    from perfzoo.evaluate import Calibration
    from perfzoo.prediction.predictors import Predictor
    from perfzoo.regressors import REGISTRY

    rng = np.random.default_rng(0)
    train = pd.DataFrame({"flops": rng.uniform(1e6, 1e8, 40), "graph_nodes": rng.uniform(10, 200, 40)})
    y = 1e-6 * train["flops"] + 0.05 * train["graph_nodes"]
    model = REGISTRY["linear"](features=features).fit(train, y)
    return Predictor("latency_ms", regressor, "leave_one_family_out", Path(f"{regressor}.models.json"),
                     {"0": model}, {}, mape, 40, Calibration(0.2, 40))


def test_a_row_missing_a_feature_is_predicted_by_the_next_best_predictor_that_has_its_features() -> None:
    chosen = _linear_predictor("with_graph", ["flops", "graph_nodes"], 10.0)
    fallback = _linear_predictor("flops_only", ["flops"], 20.0)
    chosen.alternatives = (lambda: None, lambda: fallback)  # an unreadable file is passed over
    X = pd.DataFrame({"flops": [5e7, 5e7], "graph_nodes": [np.nan, 100.0],
                      "graph_error": ["TraceError: symbolically traced variables cannot be used as inputs to "
                                      "control flow", ""]})
    answer = chosen.predict(X)
    point, lo, hi, method = answer
    assert point[0] == pytest.approx(fallback.predict_own(X.iloc[[0]])[0][0])  # the fallback's number, not a median's
    assert point[1] == pytest.approx(chosen.predict_own(X.iloc[[1]])[0][0])
    assert answer.sources == ("flops_only/leave_one_family_out", "with_graph/leave_one_family_out")
    assert answer.fallbacks == (fallback,)
    assert ("with_graph/leave_one_family_out gives no prediction where graph_nodes is missing (graph_error: "
            "TraceError: symbolically traced variables") in method
    assert "1 row(s) predicted by the fallback flops_only/leave_one_family_out" in method
    assert lo[0] < point[0] < hi[0]


def test_an_answer_names_its_fallback_after_the_predictor_is_asked_again() -> None:
    """The power-cap sweep asks the predictors again between the devices' rows: each answer keeps whose numbers
    its rows hold (they were once the predictor's state, which the second call overwrote)."""
    from perfzoo.prediction import DeviceSettings, row_quantities

    chosen = _linear_predictor("with_graph", ["flops", "graph_nodes"], 10.0)
    fallback = _linear_predictor("flops_only", ["flops"], 20.0)
    chosen.alternatives = (lambda: fallback,)
    X = pd.DataFrame({"flops": [5e7, 5e7], "graph_nodes": [np.nan, 100.0]})
    first = chosen.predict(X)
    again = chosen.predict(X.iloc[[1, 1]])  # e.g. power caps: every row has the graph
    predictors = {"latency_ms": chosen}
    q = [row_quantities(i, "gpu", {"latency_ms": first}, predictors, {}, {}, 4, DeviceSettings(kind="cuda"), None)
         for i in (0, 1)]
    assert [x["latency_ms"]["source"] for x in q] == ["flops_only/leave_one_family_out",
                                                      "with_graph/leave_one_family_out"]
    assert first.fallbacks == (fallback,) and again.fallbacks == ()
    # a number a fallback gave that is no time names the fallback's file, not the chosen one's
    from perfzoo.evaluate import Calibration
    from perfzoo.prediction.predictors import Predictor

    broken = Predictor("latency_ms", "broken", "leave_one_family_out", Path("broken.models.json"),
                       {"0": _Stub(lambda w: np.full_like(w, -1.0))}, {}, 30.0, 40, Calibration(0.2, 40))
    chosen.alternatives = (lambda: broken,)
    negative = chosen.predict(X.assign(power_limit_w=300.0))
    q = row_quantities(0, "gpu", {"latency_ms": negative}, predictors, {}, {}, 4, DeviceSettings(kind="cuda"), None)
    assert q["latency_ms"]["missing"] == "broken.models.json predicted -1 instead of a number > 0"


def test_a_row_missing_a_feature_no_alternative_has_gets_no_number() -> None:
    chosen = _linear_predictor("with_graph", ["flops", "graph_nodes"], 10.0)
    X = pd.DataFrame({"flops": [5e7], "graph_nodes": [np.nan]})
    answer = chosen.predict(X)
    point, lo, hi, method = answer
    assert np.isnan(point[0]) and np.isnan(lo[0]) and np.isnan(hi[0])
    assert "graph_nodes is missing (graph_* not computed; a training median is never filled in)" in method
    assert answer.fallbacks == ()
    assert answer.missing[0].startswith("with_graph/leave_one_family_out gives no prediction where graph_nodes")


GATED = '''import torch
from torch import nn


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 32)
        self.b = nn.Linear(32, 10)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:  # control flow on tensor values: the meta device has none
            h = torch.relu(h)
        return self.b(h)


def build():
    return Gated()
'''


def test_a_step_whose_control_flow_depends_on_values_is_counted_on_the_cpu_and_names_the_line(tmp_path) -> None:
    from perfzoo.prediction.metamodel import featurise_model
    from perfzoo.prediction.spec import resolve_model

    model_file = tmp_path / "gated.py"
    model_file.write_text(GATED)
    spec = resolve_model(f"{model_file}:build", "64")
    features = featurise_model(spec, 8, "training", 10)["features"]
    assert features["params"] == 64 * 32 + 32 + 32 * 10 + 10
    assert features["flops_fw"] >= 2 * 8 * (64 * 32 + 32 * 10)  # the two products of the path taken
    assert features["featurised_on"].startswith("CPU, one seeded random input: its control flow depends on")
    assert f"{model_file}:13" in features["featurised_on"]  # the `if` on a tensor's value
    for group in ("sim_peak_bytes", "graph_nodes", "op_matmul_flops"):
        assert features[group] is None  # missing (NaN in the record), never a zero or another model's value
    assert f"{model_file}:13" in features["sim_error"] and f"{model_file}:13" in features["graph_error"]


def test_a_value_dependent_model_is_predicted_only_by_predictors_whose_features_it_has(run_dir: Path,
                                                                                        tmp_path: Path) -> None:
    model_file = tmp_path / "gated.py"
    model_file.write_text(GATED)
    out = tmp_path / "prediction.json"
    proc = perfzoo_cli("predict", f"{model_file}:build", "--input", "64", "--batch", "8", "--output", str(out),
                       cwd=run_dir)
    assert proc.returncode == 0, proc.stderr
    assert "features (CPU, one seeded random input: its control flow depends on tensor values" in proc.stdout
    from perfzoo.fitting import load_models

    record = json.loads(out.read_text())
    assert record["features"]["graph_nodes"] is None and record["features"]["sim_peak_bytes"] is None
    for target, quantity in record["devices"]["cpu"]["quantities"].items():
        if quantity["value"] is None:  # no predictor had every feature: said so, or nothing fitted for it
            assert "a training median is never filled in" in quantity["missing"] or target not in (
                "latency_ms", "peak_mem_mb")
            continue
        if "/" not in quantity["source"] or quantity["source"].startswith("derived"):
            continue
        regressor, split = quantity["source"].split("/")
        folds, _ = load_models(run_dir / "results" / "fit" / target / regressor / f"{split}.models.json")
        used = {name for model in folds.values() for name in model.feature_names_}
        assert not [name for name in used if name.startswith(("graph_", "sim_", "op_"))], (target, regressor)


def test_a_value_dependent_model_too_large_for_this_machine_is_not_built_on_the_cpu(tmp_path) -> None:
    from perfzoo.hardware import total_memory_gb
    from perfzoo.io import InputError
    from perfzoo.prediction.metamodel import featurise_model
    from perfzoo.prediction.spec import resolve_model

    width = int((total_memory_gb() * 1024**3 / 4) ** 0.5) + 1024  # one weight matrix over all of the memory
    model_file = tmp_path / "huge.py"
    model_file.write_text(GATED.replace("nn.Linear(64, 32)", f"nn.Linear(64, {width})").replace(
        "nn.Linear(32, 10)", f"nn.Linear({width}, {width})"))
    spec = resolve_model(f"{model_file}:build", "64")
    with pytest.raises(InputError, match=r"huge.py:13: RuntimeError: Tensor.item\(\) cannot be called on "
                                         r"meta tensors .*; counting the step on the CPU instead would need .* GB of "
                                         r"weights, over the .* GB \(50%\) of this machine's memory"):
        featurise_model(spec, 8, "inference", 10)
