"""Tree-ensemble regressors: random forest and extremely randomised trees (stored as node arrays and
evaluated with numpy) and gradient-boosted trees (XGBoost, stored as its native JSON model)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import xgboost
from sklearn.ensemble import ExtraTreesRegressor as SkExtraTrees
from sklearn.ensemble import RandomForestRegressor as SkRandomForest

from perfzoo.io import InputError
from perfzoo.regressors.base import (
    Regressor,
    check_frame,
    register_regressor,
    require_columns,
    sorted_importances,
)
from perfzoo.regressors.selection import cross_validated_grid


def _pack_trees(trees: Sequence[Any]) -> dict[str, np.ndarray]:
    """Node arrays of fitted scikit-learn trees, concatenated; child indices point into the whole.

    ``left``/``right`` are -1 at leaves; ``roots[t]`` is the first node of tree ``t``.
    """
    sizes = [tree.tree_.node_count for tree in trees]
    roots = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    left, right, feature, threshold, value = [], [], [], [], []
    for root, tree in zip(roots, trees, strict=True):
        t = tree.tree_
        leaf = t.children_left < 0
        left.append(np.where(leaf, -1, t.children_left + root))
        right.append(np.where(leaf, -1, t.children_right + root))
        feature.append(np.where(leaf, 0, t.feature))
        threshold.append(t.threshold)
        value.append(t.value.reshape(t.node_count))
    return {
        "roots": roots,
        "left": np.concatenate(left).astype(np.int64),
        "right": np.concatenate(right).astype(np.int64),
        "feature": np.concatenate(feature).astype(np.int64),
        "threshold": np.concatenate(threshold).astype(np.float64),
        "value": np.concatenate(value).astype(np.float64),
    }


def _tree_outputs(trees: Mapping[str, np.ndarray], A: np.ndarray) -> np.ndarray:
    """Leaf value of every packed tree for every row of ``A``, shape ``(n_trees, n_rows)``.

    Compares as scikit-learn does: features rounded to float32, thresholds in float64.
    """
    X = np.asarray(A, dtype=np.float32).astype(np.float64)
    left, right, feature, threshold = trees["left"], trees["right"], trees["feature"], trees["threshold"]
    node = np.repeat(trees["roots"][:, None], X.shape[0], axis=1)
    rows = np.broadcast_to(np.arange(X.shape[0]), node.shape)
    inner = left[node] >= 0
    while inner.any():
        go_left = X[rows, feature[node]] <= threshold[node]
        node = np.where(inner, np.where(go_left, left[node], right[node]), node)
        inner = left[node] >= 0
    return trees["value"][node]


class _ForestRegressor(Regressor):
    """Tree ensemble on the numeric features (trees need no scaling), stored as node arrays."""

    _required_state = ("feature_names_", "trees_", "feature_importances_")

    def __init__(
        self,
        n_estimators: int = 200,
        max_features: float | str | None = 1.0,
        min_samples_leaf: int = 1,
        random_state: int = 0,
        n_jobs: int = 1,
        log_target: bool = True,
        features: Sequence[str] | None = None,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_features = max_features
        self.min_samples_leaf = min_samples_leaf
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.log_target = log_target
        self.features = features

    def _make_estimator(self) -> Any:
        raise NotImplementedError

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> _ForestRegressor:
        A = self._fit_matrix(check_frame(X), self._feature_columns(X))
        forest = self._make_estimator().fit(A, self._encode_target(y, len(X)))
        self.trees_ = _pack_trees(forest.estimators_)
        self.feature_importances_ = np.asarray(forest.feature_importances_, dtype=np.float64)
        return self

    def _member_outputs(self, X: pd.DataFrame) -> np.ndarray:
        return _tree_outputs(self.trees_, self._matrix(X))

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        """Ensemble mean in target space (geometric mean of members with ``log_target``)."""
        return self._decode_target(self._member_outputs(X).mean(axis=0))

    def predict_members(self, X: pd.DataFrame) -> np.ndarray:
        """Per-tree predictions in original units, shape ``(n_members, n_rows)``."""
        return self._decode_target(self._member_outputs(X))

    def _importances(self) -> pd.Series:
        return sorted_importances(self.feature_names_, self.feature_importances_)


@register_regressor
class RandomForestRegressor(_ForestRegressor):
    """scikit-learn random forest (bootstrap samples, best splits)."""

    kind = "random_forest"

    def _make_estimator(self) -> Any:
        return SkRandomForest(
            n_estimators=self.n_estimators,
            max_features=self.max_features,
            min_samples_leaf=self.min_samples_leaf,
            random_state=self.random_state,
            n_jobs=self.n_jobs,
        )


@register_regressor
class ExtraTreesRegressor(_ForestRegressor):
    """scikit-learn extremely randomised trees, the model of Sponner, Waschneck and Kumar, "AI-Driven
    Performance Modeling for AI Inference Workloads"."""

    kind = "extra_trees"

    def _make_estimator(self) -> Any:
        return SkExtraTrees(
            n_estimators=self.n_estimators,
            max_features=self.max_features,
            min_samples_leaf=self.min_samples_leaf,
            random_state=self.random_state,
            n_jobs=self.n_jobs,
        )


# --------------------------------------------------------------------------- XGBoost


@register_regressor
class XGBoostRegressor(Regressor):
    """Gradient-boosted trees (XGBoost ``hist``), deterministic for fixed ``random_state``/``nthread``.

    Defaults fit quickly without search. ``search=True`` (or :meth:`grid_search`) first picks
    ``n_estimators``, ``learning_rate``, ``max_depth`` and ``subsample`` from :attr:`param_grid` by
    ``search_cv``-fold cross-validation on the training rows only (grouped by the
    ``search_groups`` column when given), then refits on all of them; the choice is in
    ``best_params_`` and the per-point validation MAPE (percent) in ``cv_results_``.
    """

    kind = "xgboost"
    _required_state = ("feature_names_",)
    _payload_attrs = ("booster_",)
    _payload_modules = ("xgboost",)
    #: hyper-parameter grid of the tabular XGBoost predictor of Panner Selvam, "Performance Prediction
    #: Models for Deep Learning: A Graph Neural Network and Large Language Model Approach" (§6.5.3)
    param_grid: ClassVar[dict[str, list[Any]]] = {
        "n_estimators": [100, 500, 1000, 2000],
        "learning_rate": [1e-1, 1e-2, 1e-3],
        "max_depth": [3, 5, 8, 10, 30],
        "subsample": [0.5, 0.75, 1.0],
    }

    def __init__(
        self,
        n_estimators: int = 500,
        learning_rate: float = 0.1,
        max_depth: int = 6,
        subsample: float = 1.0,
        colsample_bytree: float = 1.0,
        min_child_weight: float = 1.0,
        reg_lambda: float = 1.0,
        random_state: int = 0,
        nthread: int = 1,
        search: bool = False,
        search_cv: int = 5,
        search_groups: str | None = None,
        log_target: bool = True,
        features: Sequence[str] | None = None,
    ) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.reg_lambda = reg_lambda
        self.random_state = random_state
        self.nthread = nthread
        self.search = search
        self.search_cv = search_cv
        self.search_groups = search_groups
        self.log_target = log_target
        self.features = features

    def _fit_booster(self, X: pd.DataFrame, y: pd.Series | np.ndarray, params: Mapping[str, Any]) -> None:
        A = self._fit_matrix(check_frame(X), self._feature_columns(X))
        model = xgboost.XGBRegressor(
            n_estimators=int(params["n_estimators"]),
            learning_rate=float(params["learning_rate"]),
            max_depth=int(params["max_depth"]),
            subsample=float(params["subsample"]),
            colsample_bytree=float(self.colsample_bytree),
            min_child_weight=float(self.min_child_weight),
            reg_lambda=float(self.reg_lambda),
            tree_method="hist",
            random_state=int(self.random_state),
            n_jobs=int(self.nthread),
        )
        model.fit(A, self._encode_target(y, len(X)))
        self.booster_ = model.get_booster()

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> XGBoostRegressor:
        params = self.get_params(deep=False)
        if self.search:
            X = check_frame(X)
            groups = None
            if self.search_groups is not None:
                require_columns(X, [self.search_groups], what="search group")
                groups = X[self.search_groups].astype(str).to_numpy()
            best, results = self._search(X, y, groups, self.search_cv, self.random_state)
            self.best_params_, self.cv_results_ = best, results
            params.update(self.best_params_)
        self._fit_booster(X, y, params)
        return self

    def _search(
        self,
        X: pd.DataFrame,
        y: pd.Series | np.ndarray,
        groups: np.ndarray | None,
        cv: int,
        seed: int,
        grid: Mapping[str, Sequence[Any]] | None = None,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        base = {**self.get_params(deep=False), "search": False, "random_state": seed}

        def make(point: dict[str, Any]) -> Regressor:
            return type(self)(**{**base, **point})

        target = np.asarray(y, dtype=np.float64).ravel()
        return cross_validated_grid(make, X, target, grid or self.param_grid, groups, cv, seed)

    @classmethod
    def grid_search(
        cls,
        X: pd.DataFrame,
        y: pd.Series | np.ndarray,
        groups: np.ndarray | pd.Series | str | None = None,
        cv: int = 5,
        seed: int = 0,
        param_grid: Mapping[str, Sequence[Any]] | None = None,
        **params: Any,
    ) -> XGBoostRegressor:
        """Search ``param_grid`` (default :attr:`param_grid`) by K-fold CV on ``X, y`` and refit.

        ``groups`` (array or column name of ``X``) switches to grouped folds. Returns a regressor
        whose parameters are the best grid point, with ``best_params_`` and ``cv_results_`` set.
        """
        X = check_frame(X)
        if isinstance(groups, str):
            require_columns(X, [groups], what="group")
            groups = X[groups]
        group_array = None if groups is None else np.asarray(groups).astype(str)
        searcher = cls(**{**params, "random_state": seed})
        best, results = searcher._search(X, y, group_array, cv, seed, param_grid)
        reg = cls(**{**params, **best, "random_state": seed})
        reg.fit(X, y)
        reg.best_params_, reg.cv_results_ = best, results
        return reg

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        A = self._matrix(X)
        self.booster_.set_param({"nthread": int(self.nthread)})
        return self._decode_target(np.asarray(self.booster_.inplace_predict(A), dtype=np.float64))

    def _dump_payload(self) -> dict[str, str]:
        text = bytes(self.booster_.save_raw(raw_format="json")).decode("utf-8")
        return {"encoding": "xgboost-json", "data": text}

    def _load_payload(self, payload: dict[str, str] | None, source: str) -> None:
        if not payload or payload.get("encoding") != "xgboost-json":
            raise InputError(f"{source}: missing or unknown XGBoost payload")
        booster = xgboost.Booster()
        try:
            booster.load_model(bytearray(payload["data"].encode("utf-8")))
        except xgboost.core.XGBoostError as exc:
            raise InputError(f"{source}: corrupted XGBoost model ({exc})") from None
        self.booster_ = booster

    def _importances(self) -> pd.Series:
        gain = self.booster_.get_score(importance_type="total_gain")
        values = np.array([gain.get(f"f{i}", 0.0) for i in range(len(self.feature_names_))])
        total = values.sum()
        return sorted_importances(self.feature_names_, values / total if total > 0 else values)
