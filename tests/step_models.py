"""Small models whose step keeps state between calls, shared by the tests of the memory simulation and of the
operator trace (each replays a step and must follow the path a real second step takes)."""

from __future__ import annotations

import torch
from torch import nn

IN, HIDDEN, OUT = 8, 16, 4


class CachesOnFirstCall(nn.Module):
    """Keeps a tensor made in its first call and takes another path from then on."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(IN, HIDDEN)
        self.cache: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            self.cache = self.linear.weight.t() * 2
            return x @ self.cache
        return self.linear(x) + 1
