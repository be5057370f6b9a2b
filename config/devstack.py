"""The main job on embedded defaults: ``python -m config.devstack``.

Starts, as separate OS processes: the embedded MongoDB-compatible server (data kept in
``var/secantus-data``) unless ``MONGODB_URI`` is set, migrations and demo data, two web
pods (runserver on ``DEV_WEB_PORT`` and the port after it, default :8000 and :8001), one
Celery worker, exactly one Celery beat, and the demo consumers. Every process writes its
metrics to ``var/prometheus-multiproc`` (emptied at start), so either web pod's ``/metrics``
shows the whole stack's lease metrics, the worker's sweeps and tasks included. Ctrl-C (or SIGTERM) stops
everything, the database last.

While it runs, the stack records where its server is in ``var/devstack.json`` (path
overridable with ``LEASES_DEVSTACK_RECORD``): the MongoDB URI and database, the web pods'
URLs and the stack's pid. ``config.settings`` falls back to that record when
``MONGODB_URI`` is unset, so ``manage.py`` commands typed in a second terminal reach the
running stack's server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VAR = REPO / "var"
RECORD_ENV = "LEASES_DEVSTACK_RECORD"


@dataclass(frozen=True)
class DevstackRecord:
    """Where a running dev stack's server is (the content of ``var/devstack.json``)."""

    mongodb_uri: str
    mongodb_db: str
    web_urls: tuple[str, ...]
    pid: int


def record_path() -> Path:
    """The record file: ``$LEASES_DEVSTACK_RECORD``, else ``var/devstack.json``."""
    raw = os.environ.get(RECORD_ENV, "").strip()
    return Path(raw) if raw else VAR / "devstack.json"


def write_record(record: DevstackRecord, path: Path | None = None) -> Path:
    """Write ``record`` atomically (readers never see half a file), readable by the owner only.

    Raises:
        OSError: the file cannot be written.
    """
    path = path or record_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"mongodbUri": record.mongodb_uri, "mongodbDb": record.mongodb_db,
            "webUrls": list(record.web_urls), "pid": record.pid, "pidStartTicks": _start_ticks(record.pid)}
    # The URI may carry credentials of an external server.
    fd, tmp = tempfile.mkstemp(prefix=".devstack-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(body, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def remove_record(pid: int, path: Path | None = None) -> None:
    """Delete the record if it is the one process ``pid`` wrote (a newer stack's is kept)."""
    path = path or record_path()
    try:
        if json.loads(path.read_text()).get("pid") != pid:
            return
        path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux), ``None`` where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # The command name (field 2) may hold spaces and parentheses; fields after it are plain.
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether ``pid`` runs and is still the process that wrote the record (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start_ticks is None or _start_ticks(pid) in (None, start_ticks)


def _read_raw(path: Path) -> dict | None:
    """The record's JSON object, or ``None`` when there is no record file.

    Raises:
        django.core.exceptions.ImproperlyConfigured: the file exists but is not a valid record.
    """
    from django.core.exceptions import ImproperlyConfigured

    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ImproperlyConfigured(f"dev stack record {path} cannot be read: {exc}") from exc
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ImproperlyConfigured(f"dev stack record {path} is not JSON ({exc}); delete it "
                                   f"or set MONGODB_URI") from exc
    valid = (isinstance(body, dict) and isinstance(body.get("mongodbUri"), str) and body["mongodbUri"].strip()
             and isinstance(body.get("mongodbDb"), str) and body["mongodbDb"].strip()
             and type(body.get("pid")) is int and body["pid"] > 0
             and isinstance(body.get("webUrls", []), list))
    if not valid:
        raise ImproperlyConfigured(f"dev stack record {path} lacks a valid mongodbUri, mongodbDb or pid; "
                                   f"delete it or set MONGODB_URI")
    return body


def recorded_server(path: Path | None = None) -> DevstackRecord | None:
    """The running dev stack's record, or ``None`` if there is none or its stack has exited.

    A stack killed with SIGKILL leaves its record behind; its pid no longer runs (or now
    names another process, told apart by its start time), so the record is ignored rather
    than pointing commands at a server that died with it.

    Raises:
        django.core.exceptions.ImproperlyConfigured: the record file is unreadable or malformed.
    """
    body = _read_raw(path or record_path())
    ticks = body.get("pidStartTicks") if body is not None else None
    if body is None or not _pid_alive(body["pid"], ticks if type(ticks) is int else None):
        return None
    return DevstackRecord(mongodb_uri=body["mongodbUri"].strip(), mongodb_db=body["mongodbDb"].strip(),
                          web_urls=tuple(str(url) for url in body.get("webUrls", [])), pid=body["pid"])


def no_server_message(path: Path | None = None) -> str:
    """What to do when neither ``MONGODB_URI`` nor a running dev stack names a server."""
    path = path or record_path()
    from django.core.exceptions import ImproperlyConfigured

    try:
        body = _read_raw(path)
    except ImproperlyConfigured:
        body = None  # reported by recorded_server(); this message is about the missing server
    if body is None:
        found = f"no dev stack is running ({path} does not exist)"
    else:
        found = f"the dev stack that wrote {path} (pid {body['pid']}) is no longer running"
    return (f"MONGODB_URI is not set and {found}. Either start the dev stack with "
            f"`bash scripts/dev.sh` (commands typed in another terminal of this checkout then use "
            f"its server), or set MONGODB_URI to a MongoDB connection string, e.g. "
            f"MONGODB_URI='mongodb://127.0.0.1:27017/?directConnection=true'. "
            f"(Tests start their own embedded server.)")


def _run(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env, check=True)


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _startup_problem() -> str | None:
    """Why the stack cannot start here (bad DEV_WEB_PORT, port taken, already running), or None."""
    raw = os.environ.get("DEV_WEB_PORT", "8000").strip()
    if not raw.isdigit() or not 1 <= int(raw) <= 65534:
        return f"DEV_WEB_PORT must be a port number (the second web pod takes the next one), got {raw!r}"
    from django.core.exceptions import ImproperlyConfigured

    try:
        running = recorded_server()
    except ImproperlyConfigured:
        running = None  # a broken record is overwritten once the stack is up
    if running is not None:
        return (f"a dev stack of this checkout is already running (pid {running.pid}, "
                f"{', '.join(running.web_urls)}; recorded in {record_path()})")
    for port in (int(raw), int(raw) + 1):
        if not _port_free(port):
            return f"port {port} on 127.0.0.1 is in use; set DEV_WEB_PORT to a free pair of ports"
    return None


ProcessSpec = tuple[str, list[str], dict[str, str]]


def stack_environment(var: Path = VAR) -> dict[str, str]:
    """The environment every process of the stack starts with (``var``: the stack's state directory).

    All processes of the stack share one host, so they share one Prometheus multiprocess
    directory, emptied here (once per stack start, before any process writes to it): the
    sweeps and ``@leased`` tasks run in Celery pool children, and only web pods serve
    ``/metrics``, which adds up every process's files (:mod:`leases.telemetry.multiprocess`).

    Raises:
        OSError: the metrics directory cannot be emptied or created.
    """
    from leases.telemetry.multiprocess import ENV, prepare

    metrics_dir = prepare(var / "prometheus-multiproc")
    return dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings", PYTHONUNBUFFERED="1", **{ENV: str(metrics_dir)})


def process_specs(web_port: int, var: Path = VAR) -> list[ProcessSpec]:
    """The stack's long-running processes: (name, command, environment on top of :func:`stack_environment`)."""
    specs: list[ProcessSpec] = []
    for index, port in enumerate((web_port, web_port + 1), start=1):
        specs.append((f"web-{index}", [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
                      {"POD_ID": f"web-{index}", "LEASES_POD_ENDPOINT": f"http://127.0.0.1:{port}"}))
    specs.append(("worker", [sys.executable, "-m", "celery", "-A", "config", "worker", "-l", "info",
                             "--pool", "prefork", "--concurrency", "2", "-n", "worker-1@%h"],
                  {"POD_ID": "worker-1"}))
    specs.append(("beat", [sys.executable, "-m", "celery", "-A", "config", "beat", "-l", "info",
                           "--schedule", str(var / "celerybeat-schedule")], {"LEASES_POD_AUTOSTART": "0"}))
    # The reference consumers loop in globex, so its admin sees live, pod-bound holders.
    specs.append(("consumers", [sys.executable, "manage.py", "run_demo_consumers", "--tenant", "globex",
                                "--project", "labs", "--user", "frank"], {"POD_ID": "consumers-1"}))
    return specs


def main() -> int:
    """Run the stack until interrupted; returns the exit code."""
    VAR.mkdir(exist_ok=True)
    sys.path.insert(0, str(REPO))
    problem = _startup_problem()
    if problem:
        print(f"dev stack not started: {problem}", file=sys.stderr, flush=True)
        return 1
    server = None
    if not os.environ.get("MONGODB_URI"):
        from leases.store.embedded import start_server

        server = start_server(str(VAR / "secantus-data"), log_path=str(VAR / "secantusd.log"))
        os.environ["MONGODB_URI"] = server.uri
        print(f"embedded MongoDB-compatible server: {server.uri} (data in var/secantus-data)", flush=True)
    env = stack_environment()
    children: list[tuple[str, subprocess.Popen]] = []
    stopping = False
    record_file: Path | None = None

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        _run(env, "migrate", "--noinput", "-v", "0")
        _run(env, "seed_demo")
        web_port = int(os.environ.get("DEV_WEB_PORT", "8000"))
        for name, cmd, extra in process_specs(web_port):
            children.append((name, subprocess.Popen(cmd, cwd=REPO, env={**env, **extra})))
        web_urls = tuple(f"http://127.0.0.1:{port}" for port in (web_port, web_port + 1))
        record_file = write_record(DevstackRecord(
            mongodb_uri=os.environ["MONGODB_URI"],
            mongodb_db=os.environ.get("MONGODB_DB", "").strip() or "leases",
            web_urls=web_urls, pid=os.getpid()))
        print(f"\nInsights: http://127.0.0.1:{web_port}/  (demo logins: acme-admin / globex-admin, "
              f"password demo-pass-123; Django admin: /admin/ as ops-admin / demo-pass-123)\n"
              f"Metrics:  http://127.0.0.1:{web_port}/metrics\n"
              f"Server recorded in {record_file}: `.venv/bin/python manage.py …` in another "
              f"terminal uses it.\nCtrl-C stops everything.\n", flush=True)
        while not stopping:
            for name, proc in children:
                if proc.poll() is not None:
                    print(f"{name} exited with {proc.returncode}; stopping the stack", flush=True)
                    stopping = True
            time.sleep(0.5)
    finally:
        if record_file is not None:
            remove_record(os.getpid(), record_file)
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
