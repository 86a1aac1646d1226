"""Regressors that predict latency, memory and energy of a model on a device from tabular features.

The public API of the package, re-exported from its modules:

- :mod:`~perfzoo.regressors.base`: the :class:`Regressor` base class (input handling, JSON persistence),
  the registry (:func:`make_regressor`, :func:`register_regressor`) and :func:`save_regressor` /
  :func:`load_regressor`;
- :mod:`~perfzoo.regressors.linear`: roofline, ridge on log features, sparse polynomial (Lasso);
- :mod:`~perfzoo.regressors.trees`: random forest, extra trees, XGBoost;
- :mod:`~perfzoo.regressors.mlp`: multilayer perceptron;
- :mod:`~perfzoo.regressors.memory`: peak memory from the meta-device simulation, calibrated per device;
- :mod:`~perfzoo.regressors.gianniti`: the end-to-end and per-layer models of Gianniti et al.;
- :mod:`~perfzoo.regressors.composed`: per-kind operator costs summed over a model's meta-device operator trace;
- :mod:`~perfzoo.regressors.blend`: the geometric mean of several regressors (``composed`` with ``poly_lasso``;
  ``memory_sim`` with ``poly_lasso`` within the profiled batches);
- :mod:`~perfzoo.regressors.transfer`: predicting an unprofiled GPU from other GPUs;
- :mod:`~perfzoo.regressors.selection`: cross-validated grid search;
- :mod:`~perfzoo.regressors.baselines`: rule-of-thumb baselines scored beside the regressors.

Importing the package registers every estimator, so ``make_regressor(name)`` and ``load_regressor(path)``
know all of them.
"""

from perfzoo.regressors.base import (
    REGISTRY,
    Regressor,
    feature_importances,
    load_regressor,
    make_regressor,
    register_regressor,
    regressor_from_document,
    save_regressor,
)
from perfzoo.regressors.baselines import BASELINES, baseline_predictions
from perfzoo.regressors.blend import BlendRegressor, MemoryBlendRegressor
from perfzoo.regressors.composed import ComposedRegressor
from perfzoo.regressors.gianniti import GiannitiE2ERegressor, GiannitiLayerRegressor
from perfzoo.regressors.linear import LinearRegressor, PolyLassoRegressor, RooflineRegressor
from perfzoo.regressors.memory import MemorySimRegressor
from perfzoo.regressors.mlp import MLPRegressor
from perfzoo.regressors.selection import cross_validated_grid
from perfzoo.regressors.transfer import DeviceTransferRegressor
from perfzoo.regressors.trees import ExtraTreesRegressor, RandomForestRegressor, XGBoostRegressor

__all__ = [
    "BASELINES",
    "REGISTRY",
    "BlendRegressor",
    "ComposedRegressor",
    "DeviceTransferRegressor",
    "ExtraTreesRegressor",
    "GiannitiE2ERegressor",
    "GiannitiLayerRegressor",
    "LinearRegressor",
    "MLPRegressor",
    "MemoryBlendRegressor",
    "MemorySimRegressor",
    "PolyLassoRegressor",
    "RandomForestRegressor",
    "Regressor",
    "RooflineRegressor",
    "XGBoostRegressor",
    "baseline_predictions",
    "cross_validated_grid",
    "feature_importances",
    "load_regressor",
    "make_regressor",
    "register_regressor",
    "regressor_from_document",
    "save_regressor",
]
