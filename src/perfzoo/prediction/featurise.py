"""Where ``predict`` featurises its model: in the warm featuriser server of this environment, in a child
process started at once (forked, or a fresh interpreter) so that featurising overlaps with loading the
predictors, or in this process.

The three ways share one request (:func:`perfzoo.prediction.spec.featurisation_request`) and one answer
(``{"ok": result}``, ``{"error": one line}``; see :func:`perfzoo.prediction.metamodel.featurise_request`),
read back by :meth:`Featuriser.result`. Torch is imported only by the process that featurises.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import types
from pathlib import Path
from typing import IO, Any

from perfzoo.io import InputError
from perfzoo.prediction.server import ServerRequest, socket_path, submit
from perfzoo.prediction.spec import LIBRARY_BUILDERS, ModelSpec, featurisation_request
from perfzoo.prediction.timing import timing

#: the folder holding the perfzoo package, put first on a spawned child's path
SRC_ROOT = str(Path(__file__).resolve().parents[2])
#: model sources a warm featuriser server may build (instances and callables live in the caller only)
SERVER_BUILDERS = (*LIBRARY_BUILDERS, "python")

FeaturiseArgs = tuple[ModelSpec, int, str, int]  # spec, batch, mode, num_classes


def _metamodel() -> types.ModuleType:
    """The module that featurises (it imports torch)."""
    # lazy: torch costs 4-5 s CPU; only the process that featurises imports it
    import perfzoo.prediction.metamodel as metamodel

    return metamodel


def child_strategy(spec: ModelSpec) -> str:
    """How to featurise: ``fork`` (a forked child featurises while this process loads the predictors),
    ``spawn`` (a fresh interpreter does it), or ``inline`` (here, later).

    Instances and build callables, and processes that imported torch before (API users, who may have
    run torch threads), featurise inline; ``PERFZOO_PREDICT_CHILD=spawn|inline`` overrides.
    """
    forced = os.environ.get("PERFZOO_PREDICT_CHILD", "")
    if spec.builder in ("instance", "callable") or "torch" in sys.modules or forced == "inline":
        return "inline"
    if forced != "spawn" and hasattr(os, "fork") and threading.active_count() == 1:
        return "fork"
    return "spawn"


class ForkedChild:
    """A forked child featurising ``args`` (Popen-like: wait, poll, kill, returncode).

    The child inherits numpy, pandas and perfzoo instead of starting an interpreter and importing them
    again; it imports torch and timm/torchvision, featurises, writes ``out`` and leaves with ``os._exit``
    (no cleanup of the parent's state). The parent has not imported torch: it imports it later, through
    scikit-learn when loading the predictors, in parallel with the child.
    """

    def __init__(self, args: FeaturiseArgs, out: Path, log: IO[bytes]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            code = 1
            try:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
                # also where Python writes, should the caller have redirected sys.stdout/sys.stderr
                sys.stdout = sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                result = _metamodel().featurise_request(featurisation_request(*args))
                tmp = out.with_suffix(".tmp")
                tmp.write_text(json.dumps(result))
                tmp.replace(out)
                code = 0
            except BaseException:  # noqa: BLE001 - reported through the log and the exit status
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)


class ChildProcess:
    """One child process featurising a request, forked or spawned, with a private folder for its
    request, answer and log; :meth:`answer` waits for it."""

    def __init__(self, args: FeaturiseArgs, fork: bool) -> None:
        self.args = args
        self.tmp = tempfile.TemporaryDirectory(prefix="perfzoo-predict-")
        folder = Path(self.tmp.name)
        self.out, self.log_path = folder / "out.json", folder / "log.txt"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        try:
            if fork:
                timing("featurisation: forking")
                self.proc: subprocess.Popen[bytes] | ForkedChild = ForkedChild(args, self.out, self.log)
            else:
                self.proc = self._spawn(folder / "request.json")
        except OSError:
            self.close()
            raise

    def _spawn(self, request: Path) -> subprocess.Popen[bytes]:
        request.write_text(json.dumps(featurisation_request(*self.args)))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (SRC_ROOT, os.environ.get("PYTHONPATH")) if p),
        }
        code = "from perfzoo.prediction.metamodel import worker_main; worker_main()"
        return subprocess.Popen(
            [sys.executable, "-c", code, str(request), str(self.out)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    def answer(self) -> dict[str, Any]:
        """The child's answer; for a child that died without one (a crash, or killed for memory), an
        error naming its exit status and the last line it wrote. Removes its files."""
        try:
            self.proc.wait()
            out = json.loads(self.out.read_text()) if self.out.exists() else {}
            self.log.flush()
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        finally:
            self.close()
        if "ok" not in out and "error" not in out:
            out["error"] = (
                f"model {self.args[0].text}: featurisation failed (exit {self.proc.returncode}): "
                f"{lines[-1] if lines else 'no output'}"
            )
        return out

    def close(self) -> None:
        """Stop the child if it still runs (an error elsewhere) and remove its files; idempotent."""
        if self.log.closed:
            return
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.log.close()
        self.tmp.cleanup()


class Featuriser:
    """Featurise through the warm server (see :mod:`perfzoo.prediction.server`), in a child process
    started now (parallel to loading predictors), or in-process later.

    ``use_server``: send the request to this environment's server when one runs; when none does,
    featurise in a child and set ``start_server_after`` so the caller can start one for next time, with
    ``environ``, this process's environment as the request carried it: loading the predictors afterwards
    imports scikit-learn, which sets ``KMP_*`` variables in this process, and a server started with them
    would refuse every later call from a shell without them (:func:`perfzoo.prediction.server.context_mismatch`).
    """

    def __init__(
        self,
        spec: ModelSpec,
        batch: int,
        mode: str,
        num_classes: int,
        strategy: str,
        use_server: bool = False,
    ) -> None:
        self.args: FeaturiseArgs = (spec, batch, mode, num_classes)
        self.child: ChildProcess | None = None
        self.server: ServerRequest | None = None
        self.server_path: Path | None = None  # where this environment's server listens (or should)
        self.start_server_after = False  # no server answered: the caller may start one for next time
        self.environ = dict(os.environ)  # the environment a request from here carries, for that server
        self.method = strategy
        if use_server and spec.builder in SERVER_BUILDERS:  # even when this process imported torch
            self.server_path = socket_path()
            self.server = submit(featurisation_request(*self.args), self.server_path)
            timing(f"featurisation: {'sent to the warm server' if self.server else 'no warm server'}")
            if self.server is not None:
                self.method = "server"
                return
            self.start_server_after = True
        self._start_child(strategy)

    @property
    def proc(self) -> subprocess.Popen[bytes] | ForkedChild | None:
        return self.child.proc if self.child is not None else None

    @property
    def tmp(self) -> tempfile.TemporaryDirectory[str] | None:
        return self.child.tmp if self.child is not None else None

    def _start_child(self, strategy: str) -> None:
        self.method = strategy
        if strategy == "inline":
            return
        try:
            self.child = ChildProcess(self.args, fork=strategy == "fork")
        except OSError:  # no child process: featurise in this one
            self.child = None

    def _server_answer(self) -> dict[str, Any]:
        """The server's answer; ``{}`` when it refused or broke off."""
        assert self.server is not None
        timing("featurisation: waiting for the warm server")
        out = self.server.result()
        self.server = None
        if "ok" not in out and "error" not in out:
            return {}
        timing(f"featurisation: server done ({out.get('cpu_s', math.nan):.2f} s CPU in its fork)")
        return out

    def result(self) -> dict[str, Any]:
        """The featurisation result (features, class name, dtype); InputError for a model that fails."""
        out: dict[str, Any] = self._server_answer() if self.server is not None else {}
        if not out and self.method == "server":
            self._start_child(child_strategy(self.args[0]))  # the server broke off: featurise here
        if not out and self.child is None:
            self.method = "inline"
            return _metamodel().featurise_model(*self.args)
        if not out:
            timing("featurisation: waiting for the child process")
            out = self.child.answer()  # type: ignore[union-attr]
            timing(f"featurisation: child done ({out.get('cpu_s', math.nan):.2f} s CPU in the child)")
        if "error" in out:
            raise InputError(out["error"])
        return out["ok"]

    def close(self) -> None:
        """Stop the server request or child if still running (an error elsewhere); idempotent."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.child is not None:
            self.child.close()
