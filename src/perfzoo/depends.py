"""The package files a rule script depends on, computed from its imports (never listed by hand).

A rule's inputs include every perfzoo module its script imports, directly or through other perfzoo
modules (module-level and function-local imports alike, read from the source with :mod:`ast`, so
nothing is executed), plus the package data those modules declare in a module-level
``PACKAGE_DATA`` tuple of paths relative to the package folder. Editing any of them reruns the rule.

A package's ``__init__.py`` is read at module level only: its functions are lazy re-exports for users
(``perfzoo.predict(...)`` imports torch only when called), which no rule script calls.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = "perfzoo"


def _module_file(root: Path, module: str) -> Path | None:
    """The file of a dotted perfzoo module under ``root`` (the folder holding ``perfzoo/``)."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(root: Path, path: Path) -> str:
    """The dotted package a file belongs to (the module itself for an ``__init__.py``)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1])


def _resolve_relative(package: str, level: int, module: str | None) -> str:
    base = package.split(".")
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, module] if module else base)


def _import_nodes(tree: ast.Module, module_level_only: bool) -> list[ast.stmt]:
    """Import statements of a module; with ``module_level_only`` those inside functions are skipped."""
    if not module_level_only:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    found: list[ast.stmt] = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))
    return found


@functools.cache
def _parse(path: Path) -> ast.Module:
    """A source file's syntax tree, parsed once per process (every rule's script shares most modules)."""
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def _imported_names(root: Path, path: Path) -> tuple[tuple[str, bool], ...]:
    """Dotted perfzoo names a file imports, each with whether it must be a module; read once per process, like
    :func:`_parse` (walking every module's tree for every rule's script was most of a Snakefile's parse).

    ``import x`` and the ``x`` of ``from x import y`` must be modules; the ``x.y`` may be a function.
    """
    names: dict[str, bool] = {}
    for node in _import_nodes(_parse(path), path.name == "__init__.py"):
        if isinstance(node, ast.Import):
            names.update({alias.name: True for alias in node.names})
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = _resolve_relative(_package_of(root, path), node.level, node.module)
            names.update({f"{source}.{alias.name}": False for alias in node.names})
            names[source] = True
    return tuple((n, must) for n, must in names.items() if n == PACKAGE or n.startswith(PACKAGE + "."))


def _with_parents(module: str) -> list[str]:
    """``a.b.c`` → ``a``, ``a.b``, ``a.b.c``: importing a submodule runs its packages' ``__init__``."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _declared_data(root: Path, path: Path) -> list[Path]:
    """Files named by a module-level ``PACKAGE_DATA = (...)`` (folders give all their files)."""
    files: list[Path] = []
    for node in _parse(path).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "PACKAGE_DATA" for t in targets):
            for entry in ast.literal_eval(node.value):
                data = root / PACKAGE / entry
                files += sorted(p for p in data.rglob("*") if p.is_file()) if data.is_dir() else [data]
    return files


@functools.cache
def package_files_of(script: str | Path, src: str | Path) -> tuple[Path, ...]:
    """Every perfzoo file (sources and declared data) that ``script`` imports, transitively, sorted.

    ``src`` is the folder holding the ``perfzoo`` package. A name that is not a module (``from
    perfzoo.io import write_json``) is skipped; a module that cannot be found is an error of the
    package, not of the workflow, and raises.
    """
    root = Path(src).resolve()
    seen: dict[Path, None] = {}
    pending = [Path(script).resolve()]
    while pending:
        path = pending.pop()
        for name, must_be_module in _imported_names(root, path):
            for module in _with_parents(name):
                found = _module_file(root, module)
                if found is None and must_be_module:
                    raise ModuleNotFoundError(f"{path}: imports {name}, which is not a module under {root}")
                if found is not None and found not in seen:
                    seen[found] = None
                    pending.append(found)
    data = [d for f in seen for d in _declared_data(root, f)]
    return tuple(sorted({*seen, *data}))
