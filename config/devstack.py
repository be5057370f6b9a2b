"""The main job on embedded defaults: ``python -m config.devstack``.

Starts, as separate OS processes: the embedded MongoDB-compatible server (data kept in
``var/secantus-data``) unless ``MONGODB_URI`` is set, migrations and demo data, two web
pods (runserver on :8000 and :8001), one Celery worker, exactly one Celery beat, and the
demo consumers. Ctrl-C (or SIGTERM) stops everything, the database last.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VAR = REPO / "var"


def _run(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, check=True)


def main() -> int:
    """Run the stack until interrupted; returns the exit code."""
    VAR.mkdir(exist_ok=True)
    sys.path.insert(0, str(REPO))
    server = None
    if not os.environ.get("MONGODB_URI"):
        from leases.embedded import start_server

        server = start_server(str(VAR / "secantus-data"), log_path=str(VAR / "secantusd.log"))
        os.environ["MONGODB_URI"] = server.uri
        print(f"embedded MongoDB-compatible server: {server.uri} (data in var/secantus-data)", flush=True)
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings", PYTHONUNBUFFERED="1")
    children: list[tuple[str, subprocess.Popen]] = []
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        _run(env, "migrate", "--noinput", "-v", "0")
        _run(env, "seed_demo")
        web_port = int(os.environ.get("DEV_WEB_PORT", "8000"))
        specs = []
        for index, port in enumerate((web_port, web_port + 1), start=1):
            specs.append((f"web-{index}", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
                          {"POD_ID": f"web-{index}", "LEASES_POD_ENDPOINT": f"http://127.0.0.1:{port}"}))
        specs.append(("worker", [sys.executable, "-m", "celery", "-A", "config", "worker", "-l", "info",
                                 "--pool", "threads", "--concurrency", "2", "-n", "worker-1@%h"],
                      {"POD_ID": "worker-1"}))
        specs.append(("beat", [sys.executable, "-m", "celery", "-A", "config", "beat", "-l", "info",
                               "--schedule", str(VAR / "celerybeat-schedule")], {"LEASES_POD_AUTOSTART": "0"}))
        # The reference consumers loop in globex, so its admin sees live, pod-bound holders.
        specs.append(("consumers", [sys.executable, "manage.py", "run_demo_consumers", "--tenant", "globex",
                                    "--project", "labs", "--user", "frank"], {"POD_ID": "consumers-1"}))
        for name, cmd, extra in specs:
            children.append((name, subprocess.Popen(cmd, cwd=REPO, env={**env, **extra})))
        print(f"\nInsights: http://127.0.0.1:{web_port}/  (demo logins: acme-admin / globex-admin, "
              f"password demo-pass-123; Django admin: /admin/ as ops-admin / demo-pass-123)\n"
              f"Metrics:  http://127.0.0.1:{web_port}/metrics\nCtrl-C stops everything.\n", flush=True)
        while not stopping:
            for name, proc in children:
                if proc.poll() is not None:
                    print(f"{name} exited with {proc.returncode}; stopping the stack", flush=True)
                    stopping = True
            time.sleep(0.5)
    finally:
        for _, proc in reversed(children):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in children:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
