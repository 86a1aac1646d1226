"""A user model for `perfzoo predict examples/my_model.py:build` (the README's example)."""

from torch import nn


def build(num_classes: int = 100) -> nn.Module:
    """A two-layer MLP on flattened 28 x 28 inputs, like the default zoo's `mlp` family."""
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, num_classes))
