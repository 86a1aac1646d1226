"""A warm featuriser: one background process per environment that has imported torch, torchvision,
timm and PyTorch's compiler stack once, and featurises each request of ``perfzoo predict`` in a fresh
fork of itself.

Why. Importing torch, ``torch._dynamo`` (pulled in by torchvision and by ``FlopCounterMode``) and timm
costs 4-5 s of CPU on a laptop core, more than the rest of ``perfzoo predict`` together. The server pays
it once; every later request only builds the model on the meta device and counts its step (~0.3 s for
ResNet-50).

Lifecycle.
- ``perfzoo predict`` (the CLI) looks for the server of its environment: a Unix socket in a private
  folder (``$XDG_RUNTIME_DIR/perfzoo-UID`` or ``/tmp/perfzoo-UID``, mode 0700, owned by the user)
  named by :func:`server_key` — a hash of the Python executable, ``sys.path``, the size and mtime of
  every perfzoo source file, and the installed torch, torchvision and timm versions. Any change there
  means another key, so a server never featurises with stale code.
- No server: the CLI featurises in its own child process, as without a server, and once its answer is
  printed starts a server in the background (``start_server``) for the next call.
- The server exits after ``PERFZOO_SERVER_IDLE_S`` seconds (default 900) without a request, on
  SIGTERM, or when its socket file is removed (``perfzoo server stop``). It records its pid as soon as it
  holds its lock, before its imports, so ``perfzoo server stop`` right after a ``perfzoo predict`` also
  stops a server still starting (which would otherwise come up seconds later and idle for 15 minutes).
- Each request runs in a fork: a factory in a user's Python file is imported by that fork, in the
  caller's context (working directory, environment variables replaced whole, ``sys.path``), never by
  the server itself. A caller whose variables read at torch's import (``TORCH*``, ``OMP_*``, ``MKL*``,
  ...) differ from the server's is refused and featurises in its own child. Connections from other
  users are refused (``SO_PEERCRED``).
- ``PERFZOO_FEATURISER=local`` turns the server off (the tests do); the Python API never uses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

DEFAULT_IDLE_S = 900.0
CONNECT_TIMEOUT_S = 0.5
ENV_SWITCH = "PERFZOO_FEATURISER"  # "local": never use or start a server
ENV_IDLE = "PERFZOO_SERVER_IDLE_S"
LIBRARIES = ("torch", "torchvision", "timm")
SERVER_ENVIRON = dict(os.environ)  # the environment this process started with
PACKAGE = Path(__file__).resolve().parents[1]  # the perfzoo package, whose sources the key covers
MODULE = "perfzoo.prediction.server"  # the server process runs main() of this module


# --------------------------------------------------------------------------- where and who


def enabled() -> bool:
    """Whether the CLI may use and start a server (not with ``PERFZOO_FEATURISER=local``)."""
    return os.environ.get(ENV_SWITCH, "auto").strip().lower() != "local" and hasattr(os, "fork")


def server_dir() -> Path | None:
    """The user's private socket folder, created 0700; None when it is not safely private."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    folder = base / f"perfzoo-{os.getuid()}"
    with contextlib.suppress(FileExistsError, OSError):
        os.mkdir(folder, 0o700)
    return folder if _is_private_folder(folder) else None


def _is_private_folder(folder: Path) -> bool:
    """Whether ``folder`` itself (not a symlink's target) is a directory owned by this user, mode 0700,
    checked through a file descriptor opened without following links. In a sticky shared folder such as
    ``/tmp`` no other user can rename or replace it afterwards."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:  # a symlink (ELOOP), not a directory, or gone
        return False
    try:
        info, named = os.fstat(fd), os.lstat(folder)
    except OSError:
        return False
    finally:
        os.close(fd)
    return (
        stat.S_ISDIR(info.st_mode)
        and (info.st_dev, info.st_ino) == (named.st_dev, named.st_ino)
        and info.st_uid == os.getuid()
        and not info.st_mode & 0o077
    )


def server_key() -> str:
    """A hash of everything that decides what featurisation computes in this environment."""
    h = hashlib.sha256()
    h.update(os.path.realpath(sys.executable).encode())
    h.update("\0".join(sys.path[1:]).encode())
    package = PACKAGE
    for path in sorted(package.rglob("*.py")):
        info = path.stat()
        h.update(f"{path.relative_to(package)}:{info.st_size}:{info.st_mtime_ns}".encode())
    for name in LIBRARIES:
        try:
            h.update(f"{name}={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{name}=missing".encode())
    return h.hexdigest()[:16]


def socket_path(key: str | None = None) -> Path | None:
    folder = server_dir()
    return None if folder is None else folder / f"featuriser-{key or server_key()}.sock"


# --------------------------------------------------------------------------- client side


class ServerRequest:
    """One featurisation sent to a running server; :meth:`result` waits for its answer."""

    def __init__(self, conn: socket.socket, path: Path) -> None:
        self.conn = conn
        self.path = path

    def result(self, timeout_s: float = 900.0) -> dict[str, Any]:
        """The server's answer: ``{"ok": ...}`` or ``{"error": ...}``; ``{}`` when it broke off."""
        self.conn.settimeout(timeout_s)
        chunks = []
        try:
            while chunk := self.conn.recv(1 << 16):
                chunks.append(chunk)
        except OSError:
            return {}
        finally:
            self.conn.close()
        try:
            return json.loads(b"".join(chunks))
        except ValueError:
            return {}

    def close(self) -> None:
        self.conn.close()


#: prefixes of environment variables that torch and its libraries read once, at import or start-up: a
#: warm server started with other values cannot featurise as a fresh process would, so it refuses
IMPORT_TIME_ENV = ("TORCH", "PYTORCH", "CUDA", "OMP_", "MKL", "KMP_", "OPENBLAS", "LD_", "PYTHON", "TIMM")


def caller_context() -> dict[str, Any]:
    """What a fresh process started here would featurise with: working folder, environment, ``sys.path``."""
    return {"cwd": os.getcwd(), "environ": dict(os.environ), "sys_path": list(sys.path)}


def context_mismatch(environ: dict[str, str], server_environ: dict[str, str]) -> list[str]:
    """Import-time variables (see IMPORT_TIME_ENV) whose value differs between caller and server."""
    names = {k for k in (*environ, *server_environ) if k.startswith(IMPORT_TIME_ENV)}
    names.discard("PYTHONPATH")  # applied through sys.path; the server key covers the rest
    return sorted(k for k in names if environ.get(k) != server_environ.get(k))


def apply_caller_context(request: dict[str, Any]) -> None:
    """In the fork: take the caller's working folder, environment (replaced whole) and ``sys.path``."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["environ"])
    sys.path[:] = request["sys_path"]


def submit(request: dict[str, Any], path: Path | None = None) -> ServerRequest | None:
    """Send ``request`` to this environment's server; None when no server answers."""
    path = path or socket_path()
    if path is None or not path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_TIMEOUT_S)
    try:
        conn.connect(str(path))
        conn.sendall(json.dumps({**request, **caller_context()}).encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
    except OSError:
        conn.close()
        return None
    return ServerRequest(conn, path)


def start_server(path: Path | None = None, environ: dict[str, str] | None = None) -> int | None:
    """Start a server on ``path`` (this environment's socket by default) in the background, detached, with
    ``environ`` (default: this process's environment), which must be what the callers' requests carry: the
    server refuses a request whose import-time variables differ from its own; its pid, or None if it cannot."""
    path = path or socket_path()
    if path is None:
        return None
    src, base = str(PACKAGE.parent), dict(os.environ if environ is None else environ)
    env = {**base, "PYTHONPATH": os.pathsep.join(p for p in (src, base.get("PYTHONPATH")) if p)}
    with open(path.with_suffix(".log"), "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys; from {MODULE} import main; sys.exit(main())", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    return proc.pid


def server_process(path: Path | None = None) -> int | None:
    """The pid of the live server process of ``path`` (this environment's by default), starting or running;
    None when there is none (no pid file, or one left by a server that was killed: its pid no longer runs this
    module on this socket)."""
    path = path or socket_path()
    if path is None:
        return None
    try:
        pid = int(path.with_suffix(".pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if any(MODULE.encode() in part for part in cmdline) and str(path).encode() in cmdline else None


def running(path: Path | None = None) -> bool:
    """Whether a server accepts connections on ``path`` (this environment's by default)."""
    path = path or socket_path()
    if path is None or not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(CONNECT_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def stop_server(path: Path | None = None) -> bool:
    """Ask this environment's server to stop, a running one or one still making its imports (SIGTERM, and its
    socket removed); whether there was one."""
    path = path or socket_path()
    if path is None:
        return False
    pid = server_process(path)
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    had_socket = path.exists()
    with contextlib.suppress(OSError):
        path.unlink()
    return pid is not None or had_socket


# --------------------------------------------------------------------------- server side


def _peer_uid(conn: socket.socket) -> int | None:
    if not hasattr(socket, "SO_PEERCRED"):
        return os.getuid()
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _answer(conn: socket.socket, featurise_request: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """In a fork of the server: read one request, featurise it, send the result, exit."""
    code = 0
    try:
        data = b""
        while chunk := conn.recv(1 << 16):
            data += chunk
        if not data.strip():  # a probe (`running`): nothing to answer
            return
        request = json.loads(data)
        differing = context_mismatch(request.get("environ", {}), SERVER_ENVIRON)
        if "environ" not in request or "sys_path" not in request or differing:  # the caller featurises
            conn.sendall(json.dumps({"refused": f"caller's environment differs in {differing}"}).encode())
            return
        apply_caller_context(request)
        answer = {**featurise_request(request), "server_pid": os.getppid()}
        conn.sendall(json.dumps(answer).encode())
    except BaseException:  # noqa: BLE001 - the client sees a broken-off answer and featurises itself
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(OSError):
            conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _warm_up() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Import everything featurisation needs, including what ``FlopCounterMode`` loads on first use;
    the function that answers a request."""
    # lazy: torch, torch._dynamo, torchvision and timm cost 4-5 s CPU; only the server process imports them
    import timm  # noqa: F401 - imports torchvision too
    import torch
    import torch._dynamo  # noqa: F401
    import torchvision  # noqa: F401

    from perfzoo.models.builders import library_model_names
    from perfzoo.prediction.metamodel import featurise_request

    for builder in ("timm", "torchvision"):
        library_model_names(builder)
    torch.set_num_threads(1)
    return featurise_request


def serve(path: Path, idle_s: float) -> int:
    """Listen on ``path`` until idle for ``idle_s`` seconds, SIGTERM, or the socket file is removed."""
    lock = open(path.with_suffix(".lock"), "w")  # noqa: SIM115 - held for the server's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"featuriser server: another server holds {path}", file=sys.stderr)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # also while importing: `perfzoo server stop`
    pid_file = path.with_suffix(".pid")
    pid_file.write_text(str(os.getpid()))  # before the imports, so that a starting server can be stopped
    try:
        return _serve_warm(path, idle_s)
    finally:
        with contextlib.suppress(OSError):
            pid_file.unlink()
        print(f"featuriser server {os.getpid()}: stopped", file=sys.stderr)


def _serve_warm(path: Path, idle_s: float) -> int:
    """Make the imports, then listen on ``path`` until idle for ``idle_s`` seconds or the socket file is
    removed (:func:`serve` holds the lock and the pid file)."""
    started = time.monotonic()
    featurise_request = _warm_up()
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(16)
    inode = path.stat().st_ino
    print(
        f"featuriser server {os.getpid()}: ready on {path} in {time.monotonic() - started:.1f} s",
        file=sys.stderr,
    )
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forks are reaped by the kernel
    listener.settimeout(min(idle_s, 30.0))
    last = time.monotonic()
    try:
        while time.monotonic() - last < idle_s:
            try:
                if path.stat().st_ino != inode:
                    break
            except FileNotFoundError:
                break
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            last = time.monotonic()
            if _peer_uid(conn) != os.getuid():
                conn.close()
                continue
            conn.settimeout(60.0)
            if os.fork() == 0:
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the fork may run subprocesses of its own
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                _answer(conn, featurise_request)
            conn.close()
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            if path.stat().st_ino == inode:
                path.unlink()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {MODULE} SOCKET_PATH", file=sys.stderr)
        return 2
    try:
        idle_s = float(os.environ.get(ENV_IDLE, DEFAULT_IDLE_S))
    except ValueError:
        print(f"{ENV_IDLE}: expected seconds, got {os.environ[ENV_IDLE]!r}", file=sys.stderr)
        return 2
    return serve(Path(args[0]), idle_s)


if __name__ == "__main__":
    sys.exit(main())
