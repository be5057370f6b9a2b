"""The web app as a real server process (``manage.py runserver --noreload``) that is a pod.

Used by the CLI tests (revocations go through a pod's internal admin API) and the browser
tests. The process talks to this test run's database; it is stopped (process group) when
the context ends. Because every test empties the store, :func:`register_pod` re-registers
the server's pod lease from the test (the same registry call the server's renewer makes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from leases.store.embedded import free_port
from tests.helpers import PYTHON, REPO, child_env

START_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class LiveApp:
    url: str
    pod_id: str
    process: subprocess.Popen
    log_path: str

    def log_tail(self, limit: int = 4000) -> str:
        return Path(self.log_path).read_text(errors="replace")[-limit:]


def register_pod(app: LiveApp) -> None:
    """Make the server's pod alive in the (freshly emptied) registry."""
    from leases.pods import leases as pod_leases

    pod_leases.register(app.pod_id, app.url)


@contextmanager
def running_app(pod_id: str):
    """Start the app on a free port as pod ``pod_id``; yield a :class:`LiveApp`."""
    from django.conf import settings

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix=f"runserver-{port}-", suffix=".log", delete=False)
    env = child_env(
        DJANGO_DEBUG="0", DJANGO_LOG_LEVEL="INFO", POD_ID=pod_id, LEASES_POD_ENDPOINT=url,
        LEASES_INTERNAL_SECRET=settings.LEASES_INTERNAL_SECRET,
    )
    process = subprocess.Popen(
        [PYTHON, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", "--skip-checks"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    app = LiveApp(url, pod_id, process, log.name)
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"runserver exited with {process.returncode}:\n{app.log_tail()}")
            try:
                with urllib.request.urlopen(f"{url}/accounts/login/", timeout=1) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"runserver did not answer within {START_TIMEOUT_SECONDS}s:\n{app.log_tail()}")
            time.sleep(0.1)
        yield app
    finally:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
            except ProcessLookupError:
                pass
        log.close()
        os.unlink(log.name)
