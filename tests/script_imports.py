"""What each rule script's import statements load: run by tests/test_depends.py in a process of its own.

    python tests/script_imports.py LIBRARY[,LIBRARY...] SCRIPT [SCRIPT ...]

Imports the comma-separated libraries once, then runs each script's import statements (all of them, wherever they
stand in the script) in a fork of that process, and prints a JSON object: script -> the files of the perfzoo modules
loaded. A library loaded beforehand speeds the forks up and does not change which perfzoo modules a script loads.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import sys
import traceback


def import_statements(script: str) -> str:
    """The source of every import statement of ``script``, one per line."""
    source = open(script).read()
    return "\n".join(ast.get_source_segment(source, node) for node in ast.walk(ast.parse(source))
                     if isinstance(node, (ast.Import, ast.ImportFrom)))


def perfzoo_files() -> list[str]:
    """The files of the perfzoo modules this process has loaded."""
    return [m.__file__ for n, m in list(sys.modules.items())
            if n.split(".")[0] == "perfzoo" and getattr(m, "__file__", None)]


def loaded_by(script: str) -> list[str]:
    """The perfzoo files ``script``'s import statements load, run in a forked child of this process."""
    read, write = os.pipe()
    if os.fork() == 0:  # the child: what the script's imports load, on top of the libraries alone
        try:
            os.close(read)
            exec(import_statements(script), {})
            with os.fdopen(write, "w") as pipe:
                pipe.write(json.dumps(perfzoo_files()))
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    if os.waitpid(-1, 0)[1] != 0:
        sys.exit(f"the imports of {script} failed")
    return json.loads(text)


def main(libraries: str, scripts: list[str]) -> None:
    for name in libraries.split(","):
        importlib.import_module(name)
    print(json.dumps({script: loaded_by(script) for script in scripts}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
