"""The user's files a model is built from: ``python`` builder files and the local modules they import.

Such files change the numbers a rule produces, so they are rule inputs (editing one reruns the rules
that build models) and provenance links (``perfzoo audit`` re-hashes them). Local imports are found
statically, from the AST of each file: ``import a.b`` and ``from a import b`` resolved against the
file's folder and the working folder, relative imports against the importing file's package. Imports
made dynamically (``importlib``, ``__import__``, strings) cannot be seen this way.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from perfzoo.models.zoo import model_entries


def factory_file(ref: str) -> str:
    """The file part of a ``path/to/file.py:function`` reference."""
    return ref.rpartition(":")[0]


def _candidates(base: Path, parts: list[str]) -> list[Path]:
    """Files a dotted module ``parts`` may live in under ``base`` (its packages' ``__init__`` too)."""
    found = []
    for i in range(1, len(parts) + 1):
        stem = base.joinpath(*parts[:i])
        found += [stem.with_suffix(".py"), stem / "__init__.py"]
    return [p for p in found if p.is_file()]


def _imported(tree: ast.AST) -> Iterable[tuple[int, list[str]]]:
    """(relative level, dotted parts) of every module an AST imports, names of ``from`` imports included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield 0, alias.name.split(".")
        elif isinstance(node, ast.ImportFrom):
            base = node.module.split(".") if node.module else []
            yield node.level, base
            for alias in node.names:  # ``from pkg import module`` names a module, not only a symbol
                yield node.level, [*base, alias.name]


def local_imports(path: Path, roots: Iterable[Path]) -> list[Path]:
    """Files under ``roots`` (or relative to ``path``) that the Python file ``path`` imports directly."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):  # reported by the model-name check
        return []
    found: list[Path] = []
    for level, parts in _imported(tree):
        bases = [path.parents[level - 1]] if level else list(roots)
        for base in bases:
            found += [p for p in _candidates(base, parts) if p != path]
    return found


def user_module_files(files: Iterable[str], cwd: Path | None = None) -> list[str]:
    """``files`` and every local module they import, transitively, as sorted relative-when-possible paths."""
    cwd = Path.cwd() if cwd is None else cwd
    seen: set[Path] = set()
    pending = [Path(f).absolute() for f in files if Path(f).is_file()]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        pending += [p.absolute() for p in local_imports(path, [path.parent, cwd])]
    return sorted({_display(p, cwd) for p in seen})


def _display(path: Path, cwd: Path) -> str:
    try:
        return str(path.resolve().relative_to(cwd.resolve()))
    except ValueError:
        return str(path)


def zoo_model_files(config: Mapping[str, Any]) -> list[str]:
    """User files behind every ``python`` family of the zoo (the factories and what they import)."""
    refs = [
        factory_file(entry["name"])
        for spec in config.get("zoo", {}).get("families", {}).values()
        if spec.get("builder") == "python"
        for entry in model_entries(spec)
    ]
    return user_module_files(refs)


def predict_model_files(entry: Mapping[str, Any]) -> list[str]:
    """User files behind one ``predict:`` entry (none unless its model is a ``file.py:function``)."""
    model = str(entry.get("model", ""))
    ref = model.removeprefix("python:")
    if ref.count(":") != 1 or not factory_file(ref).endswith(".py"):
        return []
    return user_module_files([factory_file(ref)])
