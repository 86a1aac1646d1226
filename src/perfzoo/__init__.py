"""perfzoo: predict time, memory and energy of PyTorch models on GPUs, MIG slices and power caps."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def predict(*args: Any, **kwargs: Any) -> Any:
    """:func:`perfzoo.prediction.predict`, imported when called."""
    # lazy: perfzoo.prediction imports pandas and pyarrow (~0.8 s CPU) and, when called, torch;
    # `import perfzoo` and `perfzoo --help` import neither
    from perfzoo.prediction import predict as _predict

    return _predict(*args, **kwargs)


def audit(*args: Any, **kwargs: Any) -> Any:
    """:func:`perfzoo.auditing.audit` (re-hash the provenance chain of a file), imported when called."""
    from perfzoo.auditing import audit as _audit  # lazy: perfzoo.auditing imports pandas (~0.6 s CPU)

    return _audit(*args, **kwargs)
