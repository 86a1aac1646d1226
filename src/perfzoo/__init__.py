"""perfzoo: predict time, memory and energy of PyTorch models on GPUs, MIG slices and power caps."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def predict(*args: Any, **kwargs: Any) -> Any:
    """Lazy re-export of :func:`perfzoo.predict.predict` (torch is imported only when it is called).

    Once the submodule is imported, ``perfzoo.predict`` is that module, which is callable the same way.
    """
    from perfzoo.predict import predict as _predict

    return _predict(*args, **kwargs)


def audit(*args: Any, **kwargs: Any) -> Any:
    """Lazy re-export of :func:`perfzoo.audit.audit` (re-hash the provenance chain of a file)."""
    from perfzoo.audit import audit as _audit

    return _audit(*args, **kwargs)
