"""Regressors: each learns a known relation, and save/load round-trips bit-identically without pickle."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from perfzoo.io import InputError
from perfzoo.regressors import (
    REGISTRY,
    GiannitiE2ERegressor,
    Regressor,
    RooflineRegressor,
    XGBoostRegressor,
    feature_importances,
    load_regressor,
    make_regressor,
    save_regressor,
)
from perfzoo.stats import mape

LEARNED = ["linear", "poly_lasso", "random_forest", "extra_trees", "xgboost", "mlp"]
#: held-out MAPE bound (percent) on y = 3·x1^0.8·x2 with 3 % log-normal noise, 400 training rows
MAPE_BOUND = {
    "linear": 10.0,
    "poly_lasso": 7.0,
    "random_forest": 15.0,
    "extra_trees": 10.0,
    "xgboost": 15.0,
    "mlp": 15.0,
}


def normalised(params: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}


@pytest.fixture(scope="module")
def power_law() -> tuple[pd.DataFrame, np.ndarray]:
    """y = 3·x1^0.8·x2 with noise, plus non-numeric columns the learned models must ignore."""
    rng = np.random.default_rng(0)
    n = 500
    x1 = np.exp(rng.uniform(0.0, np.log(1000.0), n))
    x2 = rng.uniform(0.5, 5.0, n)
    y = 3.0 * x1**0.8 * x2 * np.exp(rng.normal(0.0, 0.03, n))
    X = pd.DataFrame(
        {
            "x1": x1,
            "x2": x2,
            "device": rng.choice(["a100", "v100"], n),
            "family": rng.choice(["resnet", "vit"], n),
            "model_id": [f"m{i}" for i in range(n)],
        }
    )
    return X, y


@pytest.fixture(scope="module")
def fitted(power_law: tuple[pd.DataFrame, np.ndarray]) -> dict[str, Regressor]:
    X, y = power_law
    return {name: make_regressor(name).fit(X.iloc[:400], y[:400]) for name in LEARNED}


def roofline_frame(n: int = 120, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    devices = np.array(["a100", "h100", "v100"])
    peak = {"a100": 19500.0, "h100": 51000.0, "v100": 14000.0}
    bandwidth = {"a100": 1555.0, "h100": 3350.0, "v100": 900.0}
    device = rng.choice(devices, n)
    return pd.DataFrame(
        {
            "flops": np.exp(rng.uniform(np.log(1e8), np.log(1e13), n)),
            "weight_bytes": np.exp(rng.uniform(np.log(1e6), np.log(1e9), n)),
            "activation_bytes": np.exp(rng.uniform(np.log(1e6), np.log(1e9), n)),
            "hw_peak_gflops": [peak[d] for d in device],
            "hw_mem_bw_gbs": [bandwidth[d] for d in device],
            "device": device,
        }
    )


ROOFLINE_FACTORS = {"a100": 1.7, "h100": 2.5, "v100": 1.3}


def roofline_truth(X: pd.DataFrame) -> np.ndarray:
    compute_s = X["flops"] / (X["hw_peak_gflops"] * 1e9)
    memory_s = (X["weight_bytes"] + X["activation_bytes"]) / (X["hw_mem_bw_gbs"] * 1e9)
    factor = X["device"].map(ROOFLINE_FACTORS)
    return (np.maximum(compute_s, memory_s) * 1e3 * factor).to_numpy()


GIANNITI_LINES = {"alexnet": (2.0, 0.5), "resnet50": (5.0, 1.25), "vgg16": (8.0, 2.0)}


def gianniti_frame(batches: list[int], noise: float = 0.0, seed: int = 2) -> tuple[pd.DataFrame, np.ndarray]:
    """Per model and device, time = (a + b·batch)·device_speed, with multiplicative noise."""
    rng = np.random.default_rng(seed)
    speed = {"k80": 1.0, "m60": 0.6}
    rows, y = [], []
    for model, (a, b) in GIANNITI_LINES.items():
        for device, s in speed.items():
            for batch in batches:
                for _ in range(3):
                    rows.append({"model_id": model, "device": device, "mode": "training", "batch": batch,
                                 "flops": 1e9 * b * batch})
                    y.append((a + b * batch) * s * (1.0 + noise * rng.standard_normal()))
    return pd.DataFrame(rows), np.array(y)


# --------------------------------------------------------------------------- registry


def test_registry_names() -> None:
    expected = {"roofline", "linear", "gianniti_e2e", "poly_lasso", "random_forest", "extra_trees",
                "xgboost", "mlp"}
    assert expected <= set(REGISTRY)
    for name, cls in REGISTRY.items():
        assert cls.kind == name
        assert isinstance(make_regressor(name), cls)


def test_unknown_name_suggests_close_name() -> None:
    with pytest.raises(InputError, match="random_forest"):
        make_regressor("random_forrest")


def test_unknown_parameter_is_input_error() -> None:
    with pytest.raises(InputError, match="n_estimators"):
        make_regressor("random_forest", n_estimator=10)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_sklearn_contract(name: str) -> None:
    reg = make_regressor(name)
    params = reg.get_params()
    assert "log_target" in params
    additive = {"roofline", "gianniti_e2e", "gianniti_layer", "memory_sim", "composed", "composed_optime"}
    blends = {"composed_blend", "memory_blend"}  # each member has its own target transform
    assert params["log_target"] is (name not in additive | blends)  # additive models
    assert clone(reg).get_params() == params
    assert not [k for k in vars(reg) if k.endswith("_")], "constructor must only store parameters"


# --------------------------------------------------------------------------- learned models


@pytest.mark.parametrize("name", LEARNED)
def test_learns_power_law(name: str, power_law, fitted) -> None:
    X, y = power_law
    reg = fitted[name]
    assert reg.feature_names_ == ["x1", "x2"]
    assert mape(y[400:], reg.predict(X.iloc[400:])) < MAPE_BOUND[name]


@pytest.mark.parametrize("name", LEARNED)
def test_round_trip_is_exact_and_pickle_free(name: str, power_law, fitted, tmp_path: Path) -> None:
    X, _ = power_law
    reg = fitted[name]
    path = tmp_path / f"{name}.json"
    save_regressor(reg, path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "one output file, no temp leftovers"
    doc = json.loads(path.read_text())
    assert doc["kind"] == name
    loaded = load_regressor(path)
    assert type(loaded) is type(reg)
    assert normalised(loaded.get_params()) == normalised(reg.get_params())
    assert np.array_equal(loaded.predict(X), reg.predict(X))
    assert np.array_equal(type(reg).load(path).predict(X.iloc[:7]), reg.predict(X.iloc[:7]))
    payload = doc["payload"]
    if payload is not None:
        assert payload["encoding"] == "xgboost-json"
        assert json.loads(payload["data"])["learner"]
    assert "pickle" not in path.read_text()


def test_forest_and_mlp_predict_as_scikit_learn_does(power_law, fitted) -> None:
    """The numpy evaluation of stored trees and weights equals scikit-learn's own predict."""
    from sklearn.ensemble import ExtraTreesRegressor as SkExtraTrees
    from sklearn.ensemble import RandomForestRegressor as SkRandomForest
    from sklearn.neural_network import MLPRegressor as SkMLP

    X, y = power_law
    A = X[["x1", "x2"]].to_numpy(float)
    for name, sk_class in (("random_forest", SkRandomForest), ("extra_trees", SkExtraTrees)):
        reg = fitted[name]
        forest = sk_class(n_estimators=200, max_features=1.0, random_state=0).fit(A[:400], np.log(y[:400]))
        expected = np.stack([tree.predict(A[400:]) for tree in forest.estimators_])
        assert np.array_equal(reg._member_outputs(X.iloc[400:]), expected), name
        assert np.allclose(reg.feature_importances_, forest.feature_importances_), name
    reg = fitted["mlp"]
    Z = reg._log_features(X.iloc[:400])
    target = np.log(y[:400])
    sk = SkMLP(hidden_layer_sizes=(64, 64), early_stopping=False, random_state=0, max_iter=500).fit(
        Z, (target - reg.target_mean_) / reg.target_scale_
    )
    Zt = reg._log_features(X.iloc[400:])
    assert np.array_equal(reg._forward(Zt), sk.predict(Zt))


def test_document_without_fitted_arrays_is_refused(fitted, tmp_path: Path) -> None:
    save_regressor(fitted["random_forest"], tmp_path / "rf.json")
    doc = json.loads((tmp_path / "rf.json").read_text())
    del doc["state"]["trees_"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"old\.json: 'random_forest' regressor without fitted trees_.*refit"):
        load_regressor(tmp_path / "old.json")


def test_load_rejects_foreign_files(fitted, tmp_path: Path) -> None:
    save_regressor(fitted["linear"], tmp_path / "linear.json")
    with pytest.raises(InputError, match="linear"):
        RooflineRegressor.load(tmp_path / "linear.json")
    (tmp_path / "other.json").write_text('{"format": "something else"}')
    with pytest.raises(InputError, match="not a perfzoo regressor"):
        load_regressor(tmp_path / "other.json")
    doc = json.loads((tmp_path / "linear.json").read_text())
    doc["kind"] = "lineer"
    (tmp_path / "typo.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="'linear'"):
        load_regressor(tmp_path / "typo.json")


@pytest.mark.parametrize("name", LEARNED)
def test_missing_feature_column_is_named(name: str, power_law, fitted) -> None:
    X, _ = power_law
    with pytest.raises(InputError, match="x2"):
        fitted[name].predict(X.drop(columns=["x2"]))


def test_nan_and_inf_features_use_training_median(power_law, fitted) -> None:
    X, _ = power_law
    reg = fitted["linear"]
    row = X.iloc[[400]].copy()
    imputed = row.copy()
    imputed["x1"] = reg.medians_[0]
    for bad in (np.nan, np.inf):
        row["x1"] = bad
        assert np.array_equal(reg.predict(row), reg.predict(imputed))


def test_non_positive_target_with_log_target_is_input_error(power_law) -> None:
    X, y = power_law
    with pytest.raises(InputError, match="positive"):
        make_regressor("linear").fit(X.iloc[:10], np.r_[0.0, y[1:10]])


def test_forest_members(power_law, fitted) -> None:
    X, _ = power_law
    for name in ("random_forest", "extra_trees"):
        reg = fitted[name]
        members = reg.predict_members(X.iloc[400:410])
        assert members.shape == (200, 10)
        assert np.allclose(np.exp(np.log(members).mean(axis=0)), reg.predict(X.iloc[400:410]))


def test_feature_importances(fitted) -> None:
    for name in ("linear", "random_forest", "extra_trees", "xgboost"):
        imp = feature_importances(fitted[name])
        assert list(imp.index) == ["x1", "x2"], name  # x1 spans three decades: it dominates
    assert feature_importances(fitted["poly_lasso"]).index[0] == "x1"
    assert feature_importances(fitted["mlp"]) is None


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_refit_is_deterministic(power_law) -> None:
    X, y = power_law
    for name in ("extra_trees", "xgboost", "mlp"):
        params = {"n_estimators": 20} if name != "mlp" else {"max_iter": 50}
        first = make_regressor(name, **params).fit(X.iloc[:200], y[:200]).predict(X.iloc[400:])
        second = make_regressor(name, **params).fit(X.iloc[:200], y[:200]).predict(X.iloc[400:])
        assert np.array_equal(first, second), name


# --------------------------------------------------------------------------- XGBoost grid search


def test_xgboost_grid_matches_panner_selvam() -> None:
    assert XGBoostRegressor.param_grid == {
        "n_estimators": [100, 500, 1000, 2000],
        "learning_rate": [0.1, 0.01, 0.001],
        "max_depth": [3, 5, 8, 10, 30],
        "subsample": [0.5, 0.75, 1.0],
    }


def test_xgboost_grid_search_on_training_rows(power_law) -> None:
    X, y = power_law
    grid = {"n_estimators": [5, 100], "learning_rate": [0.1], "max_depth": [3], "subsample": [1.0]}
    reg = XGBoostRegressor.grid_search(X.iloc[:300], y[:300], cv=3, seed=0, param_grid=grid)
    assert reg.best_params_["n_estimators"] == 100  # 5 trees at lr 0.1 cannot reach the targets
    assert reg.get_params()["n_estimators"] == 100
    assert len(reg.cv_results_) == 2
    grouped = XGBoostRegressor.grid_search(X.iloc[:300], y[:300], groups="family", cv=3, param_grid=grid)
    assert grouped.best_params_["n_estimators"] == 100


def test_xgboost_search_param(power_law, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    X, y = power_law
    grid = {"n_estimators": [5, 50], "learning_rate": [0.1], "max_depth": [3], "subsample": [1.0]}
    monkeypatch.setattr(XGBoostRegressor, "param_grid", grid)
    reg = make_regressor("xgboost", search=True, search_cv=3).fit(X.iloc[:200], y[:200])
    assert reg.best_params_ == {"learning_rate": 0.1, "max_depth": 3, "n_estimators": 50, "subsample": 1.0}
    save_regressor(reg, tmp_path / "x.json")
    loaded = load_regressor(tmp_path / "x.json")
    assert loaded.best_params_ == reg.best_params_
    assert np.array_equal(loaded.predict(X), reg.predict(X))


# --------------------------------------------------------------------------- roofline


def test_roofline_recovers_device_factors(tmp_path: Path) -> None:
    X = roofline_frame()
    y = roofline_truth(X)
    reg = RooflineRegressor().fit(X, y)
    assert reg.factors_ == pytest.approx(ROOFLINE_FACTORS, rel=1e-12)
    assert np.allclose(reg.predict(X), y, rtol=1e-12)
    unseen = X.iloc[:5].assign(device="mi250")
    assert np.allclose(reg.predict(unseen), reg.roofline_ms(unseen) * reg.global_factor_)
    assert reg.global_factor_ == pytest.approx(np.median(y / reg.roofline_ms(X)))
    save_regressor(reg, tmp_path / "r.json")
    assert np.array_equal(load_regressor(tmp_path / "r.json").predict(X), reg.predict(X))


def test_roofline_names_missing_columns() -> None:
    X = roofline_frame()
    with pytest.raises(InputError, match="hw_mem_bw_gbs"):
        RooflineRegressor().fit(X.drop(columns=["hw_mem_bw_gbs"]), roofline_truth(X))
    reg = RooflineRegressor().fit(X, roofline_truth(X))
    with pytest.raises(InputError, match="device"):
        reg.predict(X.drop(columns=["device"]))


# --------------------------------------------------------------------------- Gianniti end-to-end


def test_gianniti_recovers_lines_and_extrapolates(tmp_path: Path) -> None:
    X, y = gianniti_frame([1, 2, 4, 8, 16])
    reg = GiannitiE2ERegressor().fit(X, y)
    coef = reg.coefficients().set_index(["model_id", "device"])
    for model, (a, b) in GIANNITI_LINES.items():
        assert coef.loc[(model, "k80"), "a"] == pytest.approx(a, rel=1e-9)
        assert coef.loc[(model, "k80"), "b"] == pytest.approx(b, rel=1e-9)
    X_train, y_train = gianniti_frame([1, 2, 4, 8, 16], noise=0.005)
    X_big, y_big = gianniti_frame([32, 64, 128])
    noisy = GiannitiE2ERegressor().fit(X_train, y_train)
    assert np.max(np.abs(noisy.predict(X_big) / y_big - 1.0)) < 0.02
    save_regressor(noisy, tmp_path / "g.json")
    assert np.array_equal(load_regressor(tmp_path / "g.json").predict(X_big), noisy.predict(X_big))


def test_gianniti_fallbacks() -> None:
    X, y = gianniti_frame([1, 2, 4, 8, 16])
    seen = X["model_id"] != "vgg16"
    reg = GiannitiE2ERegressor().fit(X[seen], y[seen.to_numpy()])
    # an unseen model uses the device's line in flops; here time is affine in flops per device
    unseen, truth = X[~seen], y[~seen.to_numpy()]
    assert np.all(np.isfinite(reg.predict(unseen)))
    single = X["batch"] == 4
    one_batch = GiannitiE2ERegressor().fit(X[single | seen], y[(single | seen).to_numpy()])
    pred = one_batch.predict(unseen)
    at_training_batch = (unseen["batch"] == 4).to_numpy()
    assert np.allclose(pred[at_training_batch], truth[at_training_batch])
    with pytest.raises(InputError, match="batch"):
        reg.predict(X.drop(columns=["batch"]))


def test_the_targets_a_method_models_come_from_its_class_and_a_blend_takes_its_members():
    from perfzoo.fitting import unsupported_reason

    assert "execution time" in unsupported_reason("composed_optime", "peak_mem_mb")  # inherited from composed
    assert unsupported_reason("xgboost", "peak_mem_mb") is None  # models any target
    assert "execution time" in unsupported_reason("composed_blend", "peak_mem_mb")  # composed is a member
    assert unsupported_reason("composed_blend", "latency_ms") is None
    assert unsupported_reason("composed_blend", "peak_mem_mb", {"members": ["linear", "xgboost"]}) is None
    assert "peak memory" in unsupported_reason("composed_blend", "latency_ms", {"members": ["memory_sim", "linear"]})
    assert "no target" in unsupported_reason("composed_blend", "latency_ms", {"members": ["memory_sim", "composed"]})


def test_a_fit_cell_is_skipped_with_its_reason_or_fitted():
    from perfzoo.fitting import PREDICTION_COLUMNS, fit_cell

    empty = pd.DataFrame()
    predictions, models, notes = fit_cell(empty, empty, "random", "peak_mem_mb", "composed")
    assert predictions.empty and list(predictions.columns) == PREDICTION_COLUMNS and models == {}
    assert "execution time" in notes["skipped_folds"]["all"]
    _, models, notes = fit_cell(empty, empty, "batch_extrapolation", "latency_ms", "xgboost_grid",
                                grid_search_splits=["random"])
    assert models == {} and notes == {"skipped_folds": {"all": "grid search runs on splits ['random']"}}
    with pytest.raises(InputError, match="no target column 'latency_ms'"):  # on a grid-search split it is fitted
        fit_cell(empty, empty, "random", "latency_ms", "xgboost_grid", grid_search_splits=["random"])


def test_missing_features_names_the_fitted_columns_a_row_has_no_value_for() -> None:
    from perfzoo.regressors.blend import BlendRegressor

    rng = np.random.default_rng(1)
    X = pd.DataFrame({"flops": rng.uniform(1e6, 1e8, 30), "graph_nodes": rng.uniform(10, 200, 30),
                      "params": rng.uniform(1e3, 1e6, 30)})
    y = 1e-6 * X["flops"] + 0.01 * X["graph_nodes"]
    new = pd.DataFrame({"flops": [2e7, 3e7, np.inf], "graph_nodes": [np.nan, 50.0, 60.0], "params": [1e4] * 3})
    linear = REGISTRY["linear"]().fit(X, y)
    assert linear.missing_features(new) == [["graph_nodes"], [], ["flops"]]
    assert linear.missing_features(new.drop(columns="params")) == [["graph_nodes"], [], ["flops"]]  # predict's error
    as_record = new.astype(object).where(new.notna(), None)  # a JSON record's None makes an object column
    assert linear.missing_features(as_record) == [["graph_nodes"], [], ["flops"]]
    keyed = clone(linear).set_params().fit(X, y)
    keyed.feature_names_ = [*keyed.feature_names_, "model_id"]  # the per-layer regressor keys its rows so
    assert keyed.missing_features(new.assign(model_id="m")) == [["graph_nodes"], [], ["flops"]]
    blend = BlendRegressor(members=("linear", "random_forest")).fit(X, y)
    assert blend.missing_features(new) == [["graph_nodes"], [], ["flops"]]


def test_a_fit_where_no_row_has_a_used_feature_is_refused_naming_it() -> None:
    """Fitted on filled-in values alone it would answer from them; it is refused instead."""
    from perfzoo.regressors.base import fit_on_complete_rows

    rng = np.random.default_rng(1)
    X = pd.DataFrame({"flops": rng.uniform(1e6, 1e8, 30), "graph_nodes": np.nan})
    y = 1e-6 * X["flops"]
    with pytest.raises(InputError, match=r"no training row has every feature .* uses \(graph_nodes missing\)"):
        fit_on_complete_rows(lambda: REGISTRY["linear"](features=["flops", "graph_nodes"]), X, y)
    X.loc[:9, "graph_nodes"] = 50.0  # ten complete rows: fitted on those
    model, incomplete = fit_on_complete_rows(lambda: REGISTRY["linear"](features=["flops", "graph_nodes"]), X, y)
    assert int(incomplete.sum()) == 20 and model.missing_features(X.iloc[:10]) == [[]] * 10


def test_the_config_schema_accepts_exactly_the_registered_regressors_and_presets() -> None:
    """The schema's list of regressor names is a second list; it must name every registered regressor and preset,
    and nothing else."""
    import yaml

    from perfzoo.fitting import PRESETS

    schema_file = Path(__file__).resolve().parents[1] / "src" / "perfzoo" / "schemas" / "config.schema.yaml"
    schema = yaml.safe_load(schema_file.read_text())
    names = schema["properties"]["fit"]["properties"]["regressors"]["items"]["enum"]
    assert len(names) == len(set(names)) and set(names) == set(REGISTRY) | set(PRESETS)
