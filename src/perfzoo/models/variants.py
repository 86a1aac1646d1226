"""Generated variants of a zoo family: a grid over builder arguments and/or seeded random samples.

A family may declare, next to ``models:``::

    grid:                        # cartesian product, in the order written
      depth: [6, 12]
      embed_dim: [192, 384]
    sample:                      # n distinct random draws, reproducible from the seed
      n: 8
      seed: 3
      kwargs:
        depth: {int: [2, 12]}            # integer, both ends included (optional step: 2)
        mlp_ratio: {choice: [2, 4]}      # one of the listed values (any YAML values)
        width_mult: {float: [0.25, 1.0]}  # real number, rounded to `digits` significant digits (3)

Every model entry of the family is expanded into one variant per grid point (times each sample draw
when both are given; every entry gets the same draws): its kwargs are the entry's own plus the variant's, and its variant name is the
entry's variant followed by ``key`` + value parts in the order written (``depth6-embed_dim192``).
Draws use a numpy ``Generator`` (PCG64) seeded with ``seed`` and only its uniform doubles, so the same
config gives the same variants, and therefore the same model ids, on every machine and Python version.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfzoo.io import InputError, suggest

DISTRIBUTIONS = ("int", "float", "choice")
OPTIONS = {"int": ("step",), "float": ("digits",), "choice": ()}
FLOAT_DIGITS = 3
MAX_DRAWS_PER_SAMPLE = 100  # draws tried per wanted variant before the space counts as too small


@dataclass(frozen=True)
class Variant:
    """One generated point: its readable name and the builder arguments it sets."""

    name: str
    kwargs: dict[str, Any]


def has_variants(family: dict[str, Any]) -> bool:
    return "grid" in family or "sample" in family


def family_variants(family: dict[str, Any], where: str) -> list[Variant]:
    """The family's variants: grid points, sample draws, or their product (grid-major) when both are given."""
    grid = grid_variants(family["grid"], f"{where}.grid") if "grid" in family else [Variant("", {})]
    sample = sample_variants(family["sample"], f"{where}.sample") if "sample" in family else [Variant("", {})]
    both = set(family.get("grid", {})) & set(family.get("sample", {}).get("kwargs", {}))
    if both:
        raise InputError(f"{where}: {sorted(both)[0]!r} is both in grid and in sample.kwargs; keep it in one")
    return [Variant(_join(g.name, s.name), {**g.kwargs, **s.kwargs}) for g in grid for s in sample]


def grid_variants(grid: Any, where: str) -> list[Variant]:
    """Every combination of the grid's value lists, the first key varying slowest."""
    if not isinstance(grid, dict) or not grid:
        raise InputError(f"{where}: expected a mapping of argument -> list of values, got {grid!r}")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise InputError(f"{where}.{key}: expected a non-empty list of values, got {values!r}")
        seen: set[str] = set()
        for value in values:
            if _canonical(value) in seen:
                raise InputError(f"{where}.{key}: value {value!r} is listed twice")
            seen.add(_canonical(value))
    keys = list(grid)
    return [_variant(dict(zip(keys, point))) for point in itertools.product(*grid.values())]


def sample_variants(sample: Any, where: str) -> list[Variant]:
    """``sample.n`` distinct draws of ``sample.kwargs`` from ``numpy.random.default_rng(sample.seed)``."""
    n, seed, spaces = _sample_spec(sample, where)
    draws = {key: _sampler(space, f"{where}.kwargs.{key}") for key, space in spaces.items()}
    rng = np.random.default_rng(seed)
    found: dict[str, Variant] = {}
    for _ in range(n * MAX_DRAWS_PER_SAMPLE):
        variant = _variant({key: draw(float(rng.random())) for key, draw in draws.items()})
        found.setdefault(_canonical(variant.kwargs), variant)
        if len(found) == n:
            return list(found.values())
    raise InputError(f"{where}: only {len(found)} distinct variants in {n * MAX_DRAWS_PER_SAMPLE} draws, "
                     f"fewer than n = {n}; widen the ranges or lower n")


def _sample_spec(sample: Any, where: str) -> tuple[int, int, dict[str, Any]]:
    if not isinstance(sample, dict):
        raise InputError(f"{where}: expected a mapping with n, seed and kwargs, got {sample!r}")
    unknown = sorted(set(sample) - {"n", "seed", "kwargs"})
    if unknown:
        raise InputError(f"{where}.{unknown[0]}: unknown key{suggest(unknown[0], ['n', 'seed', 'kwargs'])}")
    n, seed, spaces = sample.get("n"), sample.get("seed", 0), sample.get("kwargs")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"{where}.n: expected a positive integer, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"{where}.seed: expected a non-negative integer, got {seed!r}")
    if not isinstance(spaces, dict) or not spaces:
        raise InputError(f"{where}.kwargs: expected a mapping of argument -> distribution, got {spaces!r}")
    return n, seed, spaces


def _sampler(space: Any, where: str) -> Callable[[float], Any]:
    """A map from a uniform draw u in [0, 1) to a value of the distribution ``space``."""
    if not isinstance(space, dict):
        raise InputError(f"{where}: expected {{int: [low, high]}}, {{float: [low, high]}} or "
                         f"{{choice: [values]}}, got {space!r}")
    kinds = [k for k in space if k in DISTRIBUTIONS]
    unknown = [k for k in space if k not in DISTRIBUTIONS]
    if len(kinds) != 1:
        name = unknown[0] if unknown else "+".join(kinds)
        raise InputError(f"{where}: unknown distribution {name!r} (expected one of {', '.join(DISTRIBUTIONS)})"
                         f"{suggest(name, DISTRIBUTIONS)}")
    kind = kinds[0]
    extra = [k for k in unknown if k not in OPTIONS[kind]]
    if extra:
        raise InputError(f"{where}.{extra[0]}: not an option of a {kind} distribution"
                         f"{' (options: ' + ', '.join(OPTIONS[kind]) + ')' if OPTIONS[kind] else ''}")
    if kind == "choice":
        return _choice_sampler(space["choice"], where)
    return _int_sampler(space, where) if kind == "int" else _float_sampler(space, where)


def _choice_sampler(values: Any, where: str) -> Callable[[float], Any]:
    if not isinstance(values, list) or not values:
        raise InputError(f"{where}.choice: expected a non-empty list of values, got {values!r}")
    return lambda u: values[min(int(u * len(values)), len(values) - 1)]


def _range(space: dict[str, Any], kind: str, where: str) -> tuple[Any, Any]:
    bounds = space[kind]
    types = (int,) if kind == "int" else (int, float)
    if (not isinstance(bounds, list) or len(bounds) != 2
            or any(isinstance(b, bool) or not isinstance(b, types) for b in bounds)):
        raise InputError(f"{where}.{kind}: expected [low, high] ({kind} numbers), got {bounds!r}")
    low, high = bounds
    if low > high or (kind == "float" and low == high):
        raise InputError(f"{where}.{kind}: empty range [{low}, {high}]")
    return low, high


def _int_sampler(space: dict[str, Any], where: str) -> Callable[[float], int]:
    low, high = _range(space, "int", where)
    step = space.get("step", 1)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise InputError(f"{where}.step: expected a positive integer, got {step!r}")
    count = (high - low) // step + 1
    return lambda u: int(low + min(int(u * count), count - 1) * step)


def _float_sampler(space: dict[str, Any], where: str) -> Callable[[float], float]:
    low, high = _range(space, "float", where)
    digits = space.get("digits", FLOAT_DIGITS)
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 1:
        raise InputError(f"{where}.digits: expected a positive integer, got {digits!r}")
    return lambda u: _round_significant(low + u * (high - low), digits)


def _round_significant(value: float, digits: int) -> float:
    if value == 0:
        return 0.0
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def _variant(kwargs: dict[str, Any]) -> Variant:
    return Variant("-".join(f"{key}{_format(value)}" for key, value in kwargs.items()), kwargs)


def _format(value: Any) -> str:
    """A short readable form of a value for variant names: 6, 0.5, true, 512x512, {...} as JSON."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "x".join(_format(v) for v in value)
    if isinstance(value, int | str):
        return str(value)
    return _canonical(value)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _join(*names: str) -> str:
    return "-".join(n for n in names if n)


def expand_entry(entry: dict[str, Any], variants: list[Variant], where: str) -> list[dict[str, Any]]:
    """The model entry ``{name, variant, kwargs}`` once per variant (kwargs merged, names joined)."""
    expanded = []
    for variant in variants:
        both = set(entry["kwargs"]) & set(variant.kwargs)
        if both:
            raise InputError(f"{where}: {sorted(both)[0]!r} is set both in the model's kwargs and by "
                             "the family's grid or sample; keep it in one")
        expanded.append({"name": entry["name"], "variant": _join(entry["variant"], variant.name),
                         "kwargs": {**entry["kwargs"], **variant.kwargs}})
    return expanded
