"""Test helpers: requests and definitions with the suite's defaults, command counting over a real client,
child-process environments, waiters and pods."""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager

import pymongo
import pytest
from pymongo import monitoring

from leases.revocation import handlers
from leases.store import client as store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CommandCounter(monitoring.CommandListener):
    """Counts commands sent to MongoDB (pymongo command monitoring is exact)."""

    def __init__(self, *, all_threads: bool = False) -> None:
        self.commands: list[str] = []
        # Command events fire in the calling thread: count only the test's own thread, not
        # background threads (pod renewal, dispatch) that share the process's client —
        # unless the work under test runs in threads of its own (waiters).
        self.thread = None if all_threads else threading.get_ident()
        # The process's gate watcher and heartbeat (leases.queue.watch, .presence) cost a
        # read a gate and a write a process per period, whatever the number of waiters and
        # grants: counted apart from the work under test.
        self.background: list[str] = []
        # (name, collection) of each command counted in ``commands``.
        self.on: list[tuple[str, str | None]] = []

    PER_PROCESS = ("lease-watch", "lease-presence", "lease-presence-read")

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        # Handshakes and heartbeats are not command events; endSessions is client cleanup.
        if event.command_name == "endSessions" or self.thread not in (None, threading.get_ident()):
            return
        if threading.current_thread().name in self.PER_PROCESS:
            self.background.append(event.command_name)
        else:
            self.commands.append(event.command_name)
            target = event.command.get(event.command_name)
            self.on.append((event.command_name, target if isinstance(target, str) else None))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@contextmanager
def counted_commands(*, all_threads: bool = False, listener: monitoring.CommandListener | None = None):
    """Route the engine through a monitored client; yields the counter. ``listener``: one
    more listener on that client, for a test that tells commands apart its own way."""
    from django.conf import settings

    counter = CommandCounter(all_threads=all_threads)
    client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[counter] + ([listener] if listener else []))
    store.set_client(client)
    try:
        store.ensure_indexes(client[store.database_name()])
        counter.commands.clear()
        counter.on.clear()
        yield counter
    finally:
        store.set_client(None)
        client.close()


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child OS process that talks to this test run's database."""
    from django.conf import settings

    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "MONGODB_URI": settings.MONGODB_URI,
        "MONGODB_DB": store.database_name(),
        "PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", ""),
    })
    env.update(extra)
    return env


PYTHON = sys.executable


@contextmanager
def private_redis():
    """A redis-server of this test alone on a free port (no persistence); yields (url, process).

    The test may SIGSTOP it; it is continued and terminated on the way out.
    """
    import signal
    import socket
    import subprocess
    import time

    import redis

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url, socket_timeout=1).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.02)  # redis-server gives no readiness event but its port
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def discard_server(server) -> None:
    """Stop a private in-memory store server of one test (``start_server(":memory:")``) whose
    data is thrown away: SIGKILL (works on a SIGSTOPped one too), not its graceful stop, which
    waits up to 2 s for its accept thread, up to 5 s for connections to drain and, past the 10 s
    of ``EmbeddedServer.stop``, is killed anyway. Nothing of an in-memory server outlives it."""
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait(timeout=10)
    server.stop()  # closes its log file


def lease_request(lease: str = "res", *, lease_type: str = "test", tenant: str = "acme", project: str = "p1",
                  user: str = "u1", **fields):
    """A :class:`leases.LeaseRequest` with the suite's defaults: the caller passes only what differs.

    ``fields`` are the request's other fields (``pod``, ``wait_ms``, ``priority``, ``holder_ref`` …);
    a module whose requests all differ the same way binds it once
    (``req = partial(lease_request, pod="")``).
    """
    import leases

    return leases.LeaseRequest(type=lease_type, lease=lease, tenant_id=tenant, project_id=project, user_id=user,
                               **fields)


def define(name: str, text: str, *, tenant: str = "_vance", project: str = "_tenant"):
    """Write the YAML ``text`` as the definition of lease ``name`` in the layer (tenant, project):
    the operator's layer by default."""
    from leases.definitions import layers as config
    from leases.definitions.model import document_path

    return config.put_document(tenant, project, document_path(name), text)


def ensure_tenant(slug: str, *projects: str):
    """The Insights tenant ``slug`` with ``projects`` (API keys must name an existing scope)."""
    from insights.models import Project, Tenant

    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": slug.title()})
    for project in projects:
        Project.objects.get_or_create(tenant=tenant, slug=project, defaults={"name": project})
    return tenant


def wait_for(predicate, timeout: float, step: float = 0.05):
    """Poll ``predicate`` until it is truthy or ``timeout`` passes; its last value."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def queued_ids(gate_key: str) -> list[str]:
    """The ticket ids waiting in the queue of the gate counter ``gate_key``."""
    return [t["id"] for t in (store.counters().find_one({"_id": gate_key}) or {}).get("queue") or ()]


class Waiter(threading.Thread):
    """An acquire in a thread of this process (a real ticket in the queue); ``lease`` or
    ``error`` once it ends, ``ticket`` once :func:`queue_up` saw it queue."""

    def __init__(self, request) -> None:
        super().__init__(daemon=True)
        self.request = request
        self.lease = self.error = self.ticket = None

    def run(self) -> None:
        import leases

        try:
            self.lease = leases.acquire(self.request)
        except leases.LeaseError as exc:
            self.error = exc


def queue_up(request, gate_key: str, timeout: float = 10.0) -> Waiter:
    """Start a waiter for ``request``; return it once its ticket is in the gate's queue, so
    the order of arrivals is the order of calls, and it sleeps until woken or its poll: its
    first decision after queueing (at a full gate, a repair check that reads the holders and
    may pull an entry whose holder is gone) is over — on a loaded machine it would otherwise
    run at any moment of the test that follows."""
    before = set(queued_ids(gate_key))
    waiter = Waiter(request)
    waiter.start()
    new = wait_for(lambda: set(queued_ids(gate_key)) - before, timeout, step=0.01)
    assert new, "the waiter never queued"
    (waiter.ticket,) = new
    wait_for(lambda: asleep(waiter) or not waiter.is_alive(), timeout, step=0.005)
    return waiter


def release_as_granted(waiters: list[Waiter]) -> list[Waiter]:
    """Release each waiter's lease as soon as it is granted, in grant order (a waiter granted
    later may wait for one granted earlier); returns that order."""
    order: list[Waiter] = []
    while len(order) < len(waiters):
        granted = wait_for(lambda: [w for w in waiters if w.lease is not None and w not in order], 20)
        assert granted, [w.error for w in waiters]
        order.append(granted[0])
        granted[0].lease.release()
    return order


def asleep(thread: threading.Thread) -> bool:
    """Whether a waiter's ``thread`` is between two decisions: its innermost frame of the
    engine is the waiting loop's sleep (``Waiter.wait`` on its wake-up event), not a decision
    or a store command."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/leases/" in path:
            return path.endswith("/leases/engine/waiter.py") and frame.f_code.co_name == "wait"
        frame = frame.f_back
    return False


CELERY_TEST_REDIS_DB = 13  # a developer's broker on DB 0 stays untouched


class CeleryWorker:
    """A real ``celery -A config worker`` OS process consuming a queue of its own."""

    def __init__(self, process, queue: str, log_path: str):
        self.process = process
        self.queue = queue
        self.log_path = log_path

    def diagnosis(self) -> str:
        """The tail of the worker's log, for assertion messages."""
        with open(self.log_path, errors="replace") as log:
            text = log.read()
        state = "running" if self.process.poll() is None else f"exited {self.process.returncode}"
        return f"worker {state}; log tail:\n{text[-4000:]}"


@contextmanager
def celery_worker(pod_id: str, *, pool: str = "solo", concurrency: int = 1, loglevel: str = "WARNING",
                  extra_args: tuple[str, ...] = (), **env: str):
    """Run a Celery worker (``POD_ID=pod_id``) on Redis DB 13 and a fresh queue; yields a :class:`CeleryWorker`.

    The queue is unique per call, so tasks sent to it reach this worker only, whatever else
    runs on the broker. Stopped with SIGTERM (warm shutdown) on the way out, killed after 20 s.
    """
    import signal
    import subprocess
    import tempfile
    import uuid

    from django.conf import settings

    queue = f"lease-test-{uuid.uuid4().hex[:12]}"
    log_file = tempfile.NamedTemporaryFile(prefix="lease-worker-", suffix=".log", delete=False)
    child = child_env(
        POD_ID=pod_id, LEASES_POD_AUTOSTART="0", LEASES_INTERNAL_SECRET=settings.LEASES_INTERNAL_SECRET,
        CELERY_BROKER_URL=f"redis://127.0.0.1:6379/{CELERY_TEST_REDIS_DB}", DJANGO_LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1", **env)
    process = subprocess.Popen(
        [PYTHON, "-m", "celery", "-A", "config", "worker", f"--pool={pool}", f"--concurrency={concurrency}",
         f"--loglevel={loglevel}", "--without-gossip", "--without-mingle", "--without-heartbeat",
         "-Q", queue, "-n", f"{queue}@%h", *extra_args],
        cwd=REPO, env=child, stdout=log_file, stderr=subprocess.STDOUT)
    log_file.close()
    try:
        yield CeleryWorker(process, queue, log_file.name)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        os.unlink(log_file.name)


class RecordingHandler(handlers.LeaseHandler):
    """A handler that records each revoked holder: the ``optest`` lease type's for the operator
    tests, or ``lease_type``'s."""

    type = "optest"

    def __init__(self, lease_type: str | None = None):
        if lease_type is not None:
            self.type = lease_type
        self.revoked = []

    def on_revoked(self, holder):
        self.revoked.append(holder)


@contextmanager
def operator_leases():
    """Register :class:`RecordingHandler` and the ``oplease`` definition (resource ``opres``); yields the handler."""
    handler = handlers.register_handler(RecordingHandler())
    define("oplease", "resource: opres\nlevels: {global: 50, tenant: 20, project: 10, user: 5}\nttlSeconds: 60")
    try:
        yield handler
    finally:
        handlers.unregister_handler("optest")


def hold(tenant="acme", project="docs", user="alice", pod=None, ref=""):
    """Acquire an ``oplease`` lease (see :func:`operator_leases`)."""
    import leases

    return leases.acquire(lease_request("oplease", lease_type="optest", tenant=tenant, project=project, user=user,
                                        pod=pod, holder_ref=ref))


class QuietHandler(handlers.LeaseHandler):
    """A handler that takes every revocation and does nothing: for tests that only need a
    lease type to exist."""

    def __init__(self, lease_type: str = "test") -> None:
        self.type = lease_type

    def on_revoked(self, holder) -> None:
        pass


def quiet_handler_fixture(lease_type: str = "test"):
    """An autouse fixture registering a :class:`QuietHandler` for ``lease_type`` around each
    test of the module that assigns it (``handler = quiet_handler_fixture("x")``)."""

    @pytest.fixture(autouse=True)
    def handler():
        registered = handlers.register_handler(QuietHandler(lease_type))
        yield registered
        handlers.unregister_handler(lease_type)

    return handler


def stored_pod(pod_id: str):
    """The pod document as stored (None if there is none)."""
    return store.pods().find_one({"_id": pod_id})
