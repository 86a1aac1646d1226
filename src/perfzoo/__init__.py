"""perfzoo: predict time, memory and energy of PyTorch models on GPUs, MIG slices and power caps."""

from __future__ import annotations

__version__ = "0.1.0"
