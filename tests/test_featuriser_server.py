"""The warm featuriser server: `perfzoo predict` starts it, later calls featurise in its forks with the
same result, a broken server falls back to a local child, and `perfzoo server stop` ends it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT
from test_predict import run_dir, workflow_dir  # noqa: F401 - the fixtures

pytest.importorskip("torch")


@pytest.fixture
def server_env() -> Iterator[dict[str, str]]:
    """An environment with the server on, its socket in a private short folder, stopped afterwards."""
    folder = tempfile.mkdtemp(prefix="pz-")
    env = {
        **shell_environ(),
        "PYTHONPATH": str(ROOT / "src"),
        "PERFZOO_FEATURISER": "auto",
        "XDG_RUNTIME_DIR": folder,
        "PERFZOO_SERVER_IDLE_S": "300",
    }
    yield env
    subprocess.run([sys.executable, "-m", "perfzoo", "server", "stop"], env=env, capture_output=True, timeout=60)
    shutil.rmtree(folder, ignore_errors=True)


def shell_environ() -> dict[str, str]:
    """This process's environment as the shell that started it had it: without the ``KMP_*`` variables that
    scikit-learn and joblib set in a process that imports them (as this one has)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("KMP_")}


def cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perfzoo", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def socket_of(env: dict[str, str]) -> Path:
    code = "from perfzoo.prediction import server as f; print(f.socket_path())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def wait_until(condition, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def test_first_call_starts_server_and_later_calls_use_it(run_dir: Path, server_env, tmp_path: Path) -> None:
    from perfzoo.prediction.server import running, server_process

    first = cli("predict", "mlp:mlp_small", "--input", "64", "--batch", "4", "--json", cwd=run_dir, env=server_env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["featurised_by"] == "fork"
    path = socket_of(server_env)
    assert wait_until(lambda: running(path)), f"no server on {path}: {path.with_suffix('.log').read_text()}"
    pid = server_process(path)
    assert pid is not None, "the running server has a process"

    second = cli("predict", "mlp:mlp_small", "--input", "64", "--batch", "4", "--json", cwd=run_dir, env=server_env)
    assert second.returncode == 0, second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert b["featurised_by"] == "server"
    assert a["features"] == b["features"] and a["devices"] == b["devices"]

    # a factory in a user's file, named relative to the caller's folder, is imported by the fork
    (tmp_path / "net.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))\n"
    )
    (tmp_path / "config.yaml").symlink_to(run_dir / "config.yaml")
    (tmp_path / "results").symlink_to(run_dir / "results")
    user = cli("predict", "net.py:build", "--input", "64", "--json", cwd=tmp_path, env=server_env)
    assert user.returncode == 0, user.stderr
    assert json.loads(user.stdout)["featurised_by"] == "server"
    assert json.loads(user.stdout)["features"]["params"] == 64 * 16 + 16 + 16 * 10 + 10
    (tmp_path / "net.py").write_text("def build():\n    raise KeyError('no such layer')\n")
    broken = cli("predict", "net.py:build", "--input", "64", cwd=tmp_path, env=server_env)
    assert broken.returncode == 2 and broken.stderr.count("\n") == 1
    assert "net.py:2: KeyError: 'no such layer'" in broken.stderr
    assert server_process(path) == pid, "one server served every call"

    stop = cli("server", "stop", cwd=tmp_path, env=server_env)
    assert "stopped" in stop.stdout
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), 30), "the server did not exit"
    assert not path.exists()


def test_server_that_breaks_off_falls_back_to_a_child(run_dir: Path, server_env) -> None:
    path = socket_of(server_env)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)

    def hang_up() -> None:
        conn, _ = listener.accept()
        conn.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        proc = cli("predict", "mlp:mlp_small", "--input", "64", "--json", cwd=run_dir, env=server_env)
    finally:
        listener.close()
        path.unlink()
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["featurised_by"] == "fork"


def test_server_key_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from perfzoo.prediction.server import server_key

    before = server_key()
    monkeypatch.setattr(sys, "path", [*sys.path, "/elsewhere"])
    assert server_key() != before


def test_server_is_off_for_local(monkeypatch: pytest.MonkeyPatch) -> None:
    from perfzoo.prediction.server import enabled

    monkeypatch.setenv("PERFZOO_FEATURISER", "local")
    assert not enabled()
    monkeypatch.setenv("PERFZOO_FEATURISER", "auto")
    assert enabled()


def test_server_featurises_in_the_callers_environment(run_dir: Path, server_env, tmp_path: Path) -> None:
    """A model reading its width from an environment variable: server and --no-server agree."""
    from perfzoo.prediction.server import running

    (tmp_path / "envnet.py").write_text(
        "import os\nfrom torch import nn\n\nWIDTH = int(os.environ.get('NET_WIDTH', '4'))\n\n"
        "def build():\n    return nn.Sequential(nn.Linear(64, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10))\n"
    )
    (tmp_path / "config.yaml").symlink_to(run_dir / "config.yaml")
    (tmp_path / "results").symlink_to(run_dir / "results")
    first = cli("predict", "envnet.py:build", "--input", "64", "--json", cwd=tmp_path, env=server_env)
    assert first.returncode == 0, first.stderr
    path = socket_of(server_env)
    assert wait_until(lambda: running(path)), f"no server on {path}"
    wide = {**server_env, "NET_WIDTH": "512"}
    served = cli("predict", "envnet.py:build", "--input", "64", "--json", cwd=tmp_path, env=wide)
    fresh = cli("predict", "envnet.py:build", "--input", "64", "--json", "--no-server", cwd=tmp_path, env=wide)
    assert served.returncode == 0 and fresh.returncode == 0, served.stderr + fresh.stderr
    served_out, fresh_out = json.loads(served.stdout), json.loads(fresh.stdout)
    assert served_out["featurised_by"] == "server" and fresh_out["featurised_by"] != "server"
    assert served_out["features"]["params"] == fresh_out["features"]["params"] == 64 * 512 + 512 + 512 * 10 + 10
    # a variable torch reads at import cannot be applied to a warm server: it refuses, the caller featurises
    threads = cli("predict", "envnet.py:build", "--input", "64", "--json", cwd=tmp_path,
                  env={**server_env, "OMP_NUM_THREADS": "3"})
    assert threads.returncode == 0, threads.stderr
    assert json.loads(threads.stdout)["featurised_by"] != "server"


def test_planted_symlink_is_not_used_as_the_socket_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's symlink at the fallback folder's name (pointing at a folder of theirs) is refused."""
    from perfzoo.prediction import server as featuriser_server

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    target = tmp_path / "attacker"
    target.mkdir(mode=0o700)
    (tmp_path / f"perfzoo-{os.getuid()}").symlink_to(target)
    assert featuriser_server.server_dir() is None
    assert featuriser_server.socket_path("k") is None
    (tmp_path / f"perfzoo-{os.getuid()}").unlink()
    folder = featuriser_server.server_dir()  # now created afresh, private
    assert folder == tmp_path / f"perfzoo-{os.getuid()}" and not folder.is_symlink()
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o755)  # readable by others: refused too
    assert featuriser_server.server_dir() is None


def test_stop_reaches_a_server_still_making_its_imports(server_env) -> None:
    """`perfzoo server stop` right after the predict that started the server: the server has recorded its pid but
    is still importing torch (not listening); it is stopped then, and never comes up to idle for 15 minutes."""
    from perfzoo import cli as perfzoo_cli
    from perfzoo.prediction import server as featuriser_server

    path = socket_of(server_env)
    pid = featuriser_server.start_server(path)
    assert wait_until(lambda: featuriser_server.server_process(path) == pid, 60), path.with_suffix(".log").read_text()
    assert not featuriser_server.running(path)  # its imports take seconds: not listening yet
    assert perfzoo_cli._server_state(featuriser_server, path) == f"starting, pid {pid}"
    assert featuriser_server.stop_server(path)
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists() or b"Z" in _proc_state(pid), 30), "it did not exit"
    assert not path.exists() and not path.with_suffix(".pid").exists()
    assert perfzoo_cli._server_state(featuriser_server, path) == "not running"
    # a pid file naming a process that is not this socket's server (a stale file, a reused pid) is never signalled
    path.with_suffix(".pid").write_text(str(os.getpid()))
    assert featuriser_server.server_process(path) is None and not featuriser_server.stop_server(path)


def _proc_state(pid: int) -> bytes:
    """The state field of /proc/PID/stat (Z: ended, not yet collected by its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return b"Z"
