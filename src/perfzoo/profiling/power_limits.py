"""Power-limit sweeps on one GPU: checked limits, a reproducible random order per repetition, and the
original limit restored on every exit path (normal, exception, SIGTERM). NVML is reached only through
:class:`perfzoo.profiling.nvml.GpuHandle`."""

from __future__ import annotations

import math
import random
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Self

from perfzoo.io import InputError
from perfzoo.profiling.nvml import GpuHandle, NvmlError, NvmlNoPermission, NvmlNotSupported

def validate_power_limits(device: str, limits: Sequence[float], min_w: float, max_w: float) -> list[float]:
    """Check that ``limits`` (W) are finite, distinct and within the device's [min_w, max_w]."""
    values = [float(x) for x in limits]
    if not values:
        raise InputError(f"device '{device}': the power-limit sweep lists no limits")
    bad = [x for x in values if not math.isfinite(x) or x < min_w or x > max_w]
    if bad:
        raise InputError(
            f"device '{device}': power limits {bad} W are outside the allowed range {min_w:g}-{max_w:g} W"
        )
    if len(set(values)) != len(values):
        raise InputError(f"device '{device}': power limits {values} W contain duplicates")
    return values


def sweep_orders(limits: Sequence[float], repetitions: int, seed: int) -> list[list[float]]:
    """A fresh random order of ``limits`` for each repetition, reproducible from ``seed``."""
    rng = random.Random(seed)
    orders = []
    for _ in range(repetitions):
        order = list(limits)
        rng.shuffle(order)
        orders.append(order)
    return orders


@dataclass
class PowerLimitSweep:
    """Set each power limit once per repetition, in a random order per repetition, and always restore.

    Use as ``with PowerLimitSweep(gpu, [150, 200, 250, 300], repetitions=3) as sweep:`` and iterate
    ``for repetition, limit_w in sweep:``. The original limit is restored on normal exit, on an
    exception and on SIGTERM (the handler restores, then exits with status 128 + SIGTERM, or hands the
    signal on to a previously installed Python handler). If the limit cannot be set (no permission, not
    supported), a warning names the reason and the iteration yields nothing more: the run goes on.
    """

    gpu: GpuHandle
    limits_w: Sequence[float]
    repetitions: int = 1
    seed: int = 0
    device: str = "gpu"
    handle_sigterm: bool = True
    orders: list[list[float]] = field(init=False)
    original_mw: int | None = field(init=False, default=None)
    skipped_reason: str = field(init=False, default="")
    visited: list[tuple[int, float]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.repetitions < 1:
            raise InputError(
                f"device '{self.device}': sweep repetitions must be >= 1, got {self.repetitions}"
            )
        self.orders = sweep_orders(self.limits_w, self.repetitions, self.seed)
        self._entered = False
        self._changed = False
        self._previous_handler: Any = None
        self._handler_installed = False

    # -- context ---------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        lib, h = self.gpu.lib, self.gpu.handle
        try:
            low_mw, high_mw = lib.power_limit_constraints_mw(h)
            self.original_mw = lib.power_limit_mw(h)
        except NvmlError as exc:
            self._skip(f"cannot read the power limit or its allowed range: {exc}")
        else:
            validate_power_limits(self.device, self.limits_w, low_mw / 1000.0, high_mw / 1000.0)
            self._install_sigterm_handler()
        self._entered = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.restore()
        finally:
            self._uninstall_sigterm_handler()

    def __iter__(self) -> Iterator[tuple[int, float]]:
        if not self._entered:
            raise RuntimeError("iterate a PowerLimitSweep inside its 'with' block, so the limit is restored")
        if self.skipped_reason:
            return
        for repetition, order in enumerate(self.orders):
            for limit_w in order:
                changed_before, self._changed = self._changed, True  # set first: SIGTERM may come mid-call
                try:
                    self.gpu.lib.set_power_limit_mw(self.gpu.handle, round(limit_w * 1000))
                except (NvmlNoPermission, NvmlNotSupported) as exc:
                    self._changed = changed_before
                    self._skip(f"setting the power limit is not permitted: {exc}")
                    return
                self.visited.append((repetition, limit_w))
                yield repetition, limit_w

    # -- restore ---------------------------------------------------------------------------------
    def restore(self) -> None:
        """Set the original limit again if this sweep changed it (idempotent)."""
        if not self._changed or self.original_mw is None:
            return
        try:
            self.gpu.lib.set_power_limit_mw(self.gpu.handle, self.original_mw)
        except NvmlError as exc:
            warnings.warn(
                f"device '{self.device}': could not restore the original power limit "
                f"{self.original_mw / 1000:g} W: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self._changed = False

    def _skip(self, reason: str) -> None:
        self.skipped_reason = reason
        warnings.warn(
            f"device '{self.device}': power-limit sweep skipped: {reason}", RuntimeWarning, stacklevel=3
        )

    # -- SIGTERM ---------------------------------------------------------------------------------
    def _install_sigterm_handler(self) -> None:
        if not self.handle_sigterm or threading.current_thread() is not threading.main_thread():
            return
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._handler_installed = True

    def _uninstall_sigterm_handler(self) -> None:
        if self._handler_installed:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._handler_installed = False

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.restore()
        previous = self._previous_handler
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            sys.stderr.write(f"perfzoo: SIGTERM: power limit of device '{self.device}' restored; exiting\n")
            raise SystemExit(128 + signum)
