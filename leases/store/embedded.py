"""Run SecantusDB's Python server as a separate OS process (dev and tests without MONGODB_URI).

SecantusDB advertises itself as a single-node replica set named ``secantus``; clients must
connect with ``directConnection=true`` (the ``uri`` below does).

Known SecantusDB 0.7 defect: ``$expr`` comparisons against ``$$NOW`` always answer false.
Pipeline updates that *set* fields from ``$$NOW`` work, and ``hello`` returns ``localTime``.

Usage::

    with start_server(":memory:") as server:
        os.environ["MONGODB_URI"] = server.uri
        ...
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from ..errors import EmbeddedServerError

START_TIMEOUT_SECONDS = 20.0
# The set name SecantusDB advertises in its single-node replica-set mode.
REPLICA_SET_NAME = "secantus"

__all__ = [
    "EmbeddedServer",
    "EmbeddedServerError",
    "free_port",
    "start_server",
    "ensure_test_server",
    "stop_test_server",
]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _server_executable() -> list[str]:
    """``secantusd-py`` next to the running interpreter (the venv), else on PATH, else -m."""
    candidate = Path(sys.executable).with_name("secantusd-py")
    if candidate.exists():
        return [str(candidate)]
    from shutil import which

    found = which("secantusd-py")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from secantus.cli import main; sys.exit(main())"]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: have the kernel SIGTERM the server if the spawning process dies (even SIGKILL)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:  # noqa: BLE001 - best effort, other platforms rely on stop()/atexit
        pass


class EmbeddedServer:
    """A running ``secantusd-py`` subprocess. Stop it with :meth:`stop` or a ``with`` block."""

    def __init__(self, process: subprocess.Popen, host: str, port: int, storage_path: str,
                 log_path: str, *, replica_set: bool = False):
        self.replica_set = replica_set
        self.process = process
        self.host = host
        self.port = port
        self.storage_path = storage_path
        self.log_path = log_path
        self._log_file: IO[bytes] | None = None  # the server's stdout, closed on stop

    @property
    def uri(self) -> str:
        """How to reach it: a direct connection, or (``replica_set=True``) replica-set discovery."""
        if self.replica_set:
            return f"mongodb://{self.host}:{self.port}/?replicaSet={REPLICA_SET_NAME}"
        return f"mongodb://{self.host}:{self.port}/?directConnection=true"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server; kill it if it does not exit within ``timeout`` seconds."""
        proc = self.process
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        log = self._log_file
        if log is not None and not log.closed:
            log.close()

    def __enter__(self) -> "EmbeddedServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<EmbeddedServer pid={self.process.pid} uri={self.uri!r} storage={self.storage_path!r}>"


def _log_tail(path: str, limit: int = 4000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def _wait_ready(server: EmbeddedServer, timeout: float) -> None:
    import pymongo

    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise EmbeddedServerError(
                f"secantusd-py exited with code {server.process.returncode} before answering "
                f"(port {server.port}); log {server.log_path}:\n{_log_tail(server.log_path)}"
            )
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(server.uri, serverSelectionTimeoutMS=500,
                                     connectTimeoutMS=500, socketTimeoutMS=2000)
        try:
            client.admin.command("hello")
            return
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last_error = exc
        finally:
            client.close()
        time.sleep(0.1)
    raise EmbeddedServerError(
        f"secantusd-py did not answer 'hello' on {server.uri} within {timeout:.0f}s "
        f"(last error: {last_error!r}); log {server.log_path}:\n{_log_tail(server.log_path)}"
    )


def start_server(storage_path: str, port: int = 0, *, host: str = "127.0.0.1",
                 log_path: str | None = None,
                 timeout: float = START_TIMEOUT_SECONDS, replica_set: bool = False) -> EmbeddedServer:
    """Spawn ``secantusd-py`` and return once it answers ``hello``.

    ``replica_set=True`` runs it as a single-node replica set (named ``secantus``, with an
    oplog) and its :attr:`~EmbeddedServer.uri` uses replica-set discovery, the way a
    production URI reaches a real replica set; the default is a standalone server.

    ``storage_path`` is a directory (created if missing, reopened intact) or ``":memory:"``.
    ``port=0`` picks a free port. stdout/stderr go to ``log_path`` (default: a file in the
    system temp dir, named after the port). Raises :class:`EmbeddedServerError` on failure.
    """
    if storage_path != ":memory:":
        Path(storage_path).mkdir(parents=True, exist_ok=True)
    attempts = 3 if port == 0 else 1
    last_error: EmbeddedServerError | None = None
    for _ in range(attempts):
        chosen = port or free_port(host)
        log = log_path or os.path.join(tempfile.gettempdir(), f"secantusd-{chosen}.log")
        log_file = open(log, "ab")  # noqa: SIM115 - closed by EmbeddedServer.stop
        cmd = [*_server_executable(), "--host", host, "--port", str(chosen),
               "--storage-path", storage_path,
               # Standalone: the single-node replica-set mode keeps an oplog whose cost per
               # write grows with its length (measured: 0.9 ms → 6 ms per update after a test
               # suite's worth of writes); nothing here needs change streams or transactions.
               *([] if replica_set else ["--standalone"])]
        try:
            process = subprocess.Popen(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                # Own process group: a Ctrl-C in the parent's terminal is handled by the
                # parent, which then stops the server cleanly.
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as exc:
            log_file.close()
            raise EmbeddedServerError(f"could not run {cmd[0]}: {exc}") from exc
        server = EmbeddedServer(process, host, chosen, storage_path, log, replica_set=replica_set)
        server._log_file = log_file
        try:
            _wait_ready(server, timeout)
            return server
        except EmbeddedServerError as exc:
            server.stop()
            last_error = exc
        except BaseException:
            server.stop()
            raise
    assert last_error is not None
    raise last_error


# --- One server per test process tree ------------------------------------------------------

_test_server: EmbeddedServer | None = None


def ensure_test_server() -> EmbeddedServer | None:
    """Start an in-memory server for tests unless ``MONGODB_URI`` is already set.

    Exports ``MONGODB_URI`` so Django settings (and any child process, which inherits the
    environment) use it. Returns the server this call started, or ``None`` when an external
    or already-started server is in use. Stopped by :func:`stop_test_server` or at exit.
    """
    global _test_server
    if os.environ.get("MONGODB_URI", "").strip():
        return None
    _test_server = start_server(":memory:")
    os.environ["MONGODB_URI"] = _test_server.uri
    atexit.register(stop_test_server)
    return _test_server


def stop_test_server() -> None:
    """Stop the server :func:`ensure_test_server` started (idempotent)."""
    global _test_server
    server, _test_server = _test_server, None
    if server is not None:
        server.stop()
        if os.environ.get("MONGODB_URI") == server.uri:
            del os.environ["MONGODB_URI"]


def current_test_server() -> EmbeddedServer | None:
    """The server started by :func:`ensure_test_server` in this process, if any."""
    return _test_server
