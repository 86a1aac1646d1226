"""Multilayer perceptron regressor: scikit-learn's MLP trained on standardised log features, its weights
stored as arrays and evaluated with numpy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from sklearn.neural_network import MLPRegressor as SkMLP

from perfzoo.regressors.base import LogFeatureRegressor, register_regressor


@register_regressor
class MLPRegressor(LogFeatureRegressor):
    """scikit-learn multilayer perceptron on standardised log features and standardised target.

    Adam without early stopping, seeded by ``random_state``: deterministic for a given input. The
    fitted weights are kept as arrays and evaluated with numpy (scikit-learn's forward pass).
    """

    kind = "mlp"
    _required_state = ("feature_names_", "weights_", "biases_")

    def __init__(
        self,
        hidden_layer_sizes: Sequence[int] = (64, 64),
        alpha: float = 1e-4,
        learning_rate_init: float = 1e-3,
        max_iter: int = 500,
        random_state: int = 0,
        log_target: bool = True,
        features: Sequence[str] | None = None,
    ) -> None:
        self.hidden_layer_sizes = hidden_layer_sizes
        self.alpha = alpha
        self.learning_rate_init = learning_rate_init
        self.max_iter = max_iter
        self.random_state = random_state
        self.log_target = log_target
        self.features = features

    def fit(self, X: pd.DataFrame, y: pd.Series | np.ndarray) -> MLPRegressor:
        Z = self._fit_log_features(X)
        target = self._encode_target(y, len(X))
        self.target_mean_ = float(target.mean())
        self.target_scale_ = float(target.std()) or 1.0
        model = SkMLP(
            hidden_layer_sizes=tuple(int(h) for h in self.hidden_layer_sizes),
            alpha=self.alpha,
            learning_rate_init=self.learning_rate_init,
            max_iter=self.max_iter,
            activation="relu",
            early_stopping=False,
            random_state=self.random_state,
        ).fit(Z, (target - self.target_mean_) / self.target_scale_)
        self.weights_ = [np.asarray(w, dtype=np.float64) for w in model.coefs_]
        self.biases_ = [np.asarray(b, dtype=np.float64) for b in model.intercepts_]
        self.n_iter_ = int(model.n_iter_)
        return self

    def _forward(self, Z: np.ndarray) -> np.ndarray:
        """The network's output for standardised inputs ``Z``: scikit-learn's forward pass (ReLU hidden
        layers, identity output)."""
        out = Z
        for i, (w, b) in enumerate(zip(self.weights_, self.biases_, strict=True)):
            out = out @ w + b
            if i < len(self.weights_) - 1:
                out = np.maximum(out, 0.0)
        return out.ravel()

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        z = self._forward(self._log_features(X))
        return self._decode_target(z * self.target_scale_ + self.target_mean_)
