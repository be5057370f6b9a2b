"""A real HTTP server process (gunicorn, production-style) for client and contract tests.

The server is a separate OS process on a free port, talking to this test run's database
(``tests.helpers.child_env``); it is stopped (process group) when the fixture ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import requests

from leases.store.embedded import free_port
from tests.helpers import REPO, child_env

START_TIMEOUT_SECONDS = 30.0


def gunicorn_command(port: int, workers: int, threads: int = 1) -> list[str]:
    """gunicorn serving ``config.wsgi`` (the venv's gunicorn, next to this interpreter)."""
    exe = Path(sys.executable).with_name("gunicorn")
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "gunicorn"]
    return [*base, "config.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
            "--threads", str(threads), "--timeout", "30", "--graceful-timeout", "5", "--access-logfile", "-",
            # gthread's default keep-alive is 2 s: a client that polls every 2 s (a ticket's
            # interval) would now and then send on a connection the server is just closing
            # (ECONNRESET). Idle connections are kept longer than any poll interval here.
            "--keep-alive", "30"]


@contextmanager
def running_server(*, workers: int = 2, threads: int = 1, env: dict[str, str] | None = None):
    """Start gunicorn, wait until it answers, yield its base URL, stop it."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix=f"gunicorn-{port}-", suffix=".log", delete=False)
    environment = child_env(DJANGO_DEBUG="0", LEASES_POD_AUTOSTART="0", DJANGO_LOG_LEVEL="WARNING", **(env or {}))
    process = subprocess.Popen(gunicorn_command(port, workers, threads), cwd=REPO, env=environment,
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {process.returncode}:\n{Path(log.name).read_text()[-4000:]}")
            try:
                if requests.get(f"{base_url}/api/v1/openapi.json", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not answer within {START_TIMEOUT_SECONDS}s:\n"
                                   f"{Path(log.name).read_text()[-4000:]}")
            time.sleep(0.1)
        yield base_url
    finally:
        stop(process)
        log.close()
        os.unlink(log.name)


def stop(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM the server's process group (master and workers), SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)
    except ProcessLookupError:
        pass
