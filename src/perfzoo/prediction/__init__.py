"""Prediction of time, memory, energy, cost and carbon of a PyTorch model on the profiled devices, from
the workflow's fitted predictors (:func:`predict`), and the warm featuriser server that keeps torch
imported between predictions (:mod:`perfzoo.prediction.server`)."""

from perfzoo.prediction.advice import OBJECTIVES, PredictionContext, mig_advice, power_cap, recommend
from perfzoo.prediction.api import predict, predict_to_file, workflow_inputs
from perfzoo.prediction.bounds import RangeCheck, bound_predictions, range_check
from perfzoo.prediction.devices import DeviceSettings, device_settings
from perfzoo.prediction.featurise import Featuriser
from perfzoo.prediction.predictors import (
    TARGETS,
    Predictor,
    TargetPrediction,
    choose_file,
    load_predictors,
)
from perfzoo.prediction.quantities import QUANTITIES, UNITS, row_quantities, target_predictions, with_roofline
from perfzoo.prediction.record import Prediction
from perfzoo.prediction.spec import ModelSpec, parse_input, resolve_model

__all__ = [
    "OBJECTIVES",
    "QUANTITIES",
    "TARGETS",
    "UNITS",
    "DeviceSettings",
    "Featuriser",
    "ModelSpec",
    "Prediction",
    "PredictionContext",
    "Predictor",
    "RangeCheck",
    "TargetPrediction",
    "bound_predictions",
    "choose_file",
    "device_settings",
    "load_predictors",
    "mig_advice",
    "parse_input",
    "power_cap",
    "predict",
    "predict_to_file",
    "range_check",
    "recommend",
    "resolve_model",
    "row_quantities",
    "target_predictions",
    "with_roofline",
    "workflow_inputs",
]
