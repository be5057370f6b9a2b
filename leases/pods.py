"""Pod registry: server-issued pod leases in MongoDB and the one definition of "pod alive".

Every web process and every Celery worker is a pod. On start it registers in
``lease_pods`` and receives a pod lease (seed 004, registration-lease-v1 applied to pods):

* ``leaseId`` — identity of the agreement; renewals must present it.
* ``intervalSeconds`` — decided by the server: the pod's proposal clamped into
  ``LEASES_POD_INTERVAL_MIN`` … ``LEASES_POD_INTERVAL_MAX``.
* ``expiryDeadline`` — server receipt time + ``LEASES_POD_EXPIRY_FACTOR`` × interval.

Every time here is MongoDB's clock (``hello.localTime``), never the pod's: a pod with a
skewed clock renews exactly like one with a correct clock. Renewal is idempotent — the new
deadline is ``max(previous, receipt + factor × interval)`` (an atomic ``$max``), so a
duplicate, delayed or replayed renewal never moves it backwards nor beyond the last
receipt. An unknown ``leaseId`` is answered ``STALE_LEASE``, a renewal after the deadline
``EXPIRED``; both are terminal and refresh nothing. Registering with a blank ``leaseId``
attaches to the pod's current lease (deadline untouched) or, once it has expired or the
pod stopped, grants a fresh one: the only way back for an expired pod.

Unlike the in-memory reference, the leases live in MongoDB, so restarting any one process
invalidates nothing.
"""

from __future__ import annotations

import atexit
import enum
import logging
import os
import random
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable

import pymongo.errors

from leases.conf import lease_settings

from . import store, validation
from .errors import InvalidLeaseRequest, LeaseError
from .identity import self_pod_id

log = logging.getLogger(__name__)

ENDPOINT_MAX = 1024


class PodLeaseError(LeaseError):
    """A pod-lease request that was refused because its input was bad; nothing was written."""

    code = "POD_LEASE_INVALID"


class Outcome(str, enum.Enum):
    """Answer of :func:`register` / :func:`renew` (the seed's ``code`` field)."""

    GRANTED = "GRANTED"      # a fresh lease (first registration, or after expiry / stop)
    ATTACHED = "ATTACHED"    # blank-id re-registration joined the current, unexpired lease
    RENEWED = "RENEWED"
    STALE_LEASE = "STALE_LEASE"
    EXPIRED = "EXPIRED"


@dataclass(frozen=True)
class PodLease:
    """The server's answer; ``lease_id``/``deadline`` are None for terminal answers."""

    outcome: Outcome
    pod_id: str
    lease_id: str | None
    interval_seconds: int | None
    expiry_deadline: datetime | None
    received_at: datetime

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.GRANTED, Outcome.ATTACHED, Outcome.RENEWED)


def _settings() -> Any:
    return lease_settings


def clamp_interval(proposed: Any) -> int:
    """The server-decided interval: ``proposed`` clamped into the configured bounds.

    ``None`` (or anything not a positive int) takes ``LEASES_POD_INTERVAL_SECONDS``.
    """
    s = _settings()
    low = max(1, int(s.POD_INTERVAL_MIN))
    high = max(low, int(s.POD_INTERVAL_MAX))
    if isinstance(proposed, bool) or not isinstance(proposed, int) or proposed <= 0:
        proposed = int(s.POD_INTERVAL_SECONDS)
    return min(high, max(low, proposed))


def expiry_factor() -> int:
    """How many intervals a pod may miss before it is dead (at least 1)."""
    return max(1, int(_settings().POD_EXPIRY_FACTOR))


def _valid_endpoint(endpoint: Any) -> str:
    if endpoint is None:
        return ""
    if not isinstance(endpoint, str) or len(endpoint) > ENDPOINT_MAX or "\x00" in endpoint:
        raise PodLeaseError("pod endpoint must be a string URL")
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise PodLeaseError(f"pod endpoint must be an http(s) URL, got {endpoint!r}")
    return endpoint.rstrip("/")


def _valid_pod(pod_id: Any) -> str:
    try:
        return validation.pod_id(pod_id)
    except InvalidLeaseRequest as exc:
        raise PodLeaseError(str(exc)) from None


def _deadline(received_at: datetime, interval: int) -> datetime:
    return received_at + timedelta(seconds=interval * expiry_factor())


def register(pod_id: str, endpoint: str | None, *, proposed_interval: int | None = None,
             lease_id: str | None = None) -> PodLease:
    """Register (or re-register) ``pod_id``; a non-blank ``lease_id`` is a renewal.

    A blank ``lease_id`` attaches to the pod's current lease without touching its deadline,
    or grants a fresh lease when there is none, it expired, or the pod stopped.

    Raises:
        PodLeaseError: a bad pod id or endpoint (nothing written).
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    pod_id = _valid_pod(pod_id)
    endpoint = _valid_endpoint(endpoint)
    if lease_id:
        return renew(pod_id, lease_id)
    pods = store.pods()
    for _ in range(5):
        now = store.server_now()
        current = pods.find_one({"_id": pod_id})
        if (current is not None and current.get("leaseId") and not current.get("stopped")
                and current.get("expiryDeadline") is not None and current["expiryDeadline"] > now):
            # Attach: same lease, same deadline; the endpoint may have moved (restart).
            if current.get("endpoint") != endpoint:
                pods.update_one({"_id": pod_id, "leaseId": current["leaseId"]}, {"$set": {"endpoint": endpoint}})
            return PodLease(Outcome.ATTACHED, pod_id, current["leaseId"], current.get("intervalSeconds"),
                            current["expiryDeadline"], now)
        interval = clamp_interval(proposed_interval)
        fresh = {
            "leaseId": secrets.token_urlsafe(18),
            "endpoint": endpoint,
            "intervalSeconds": interval,
            "expiryDeadline": _deadline(now, interval),
            "lastReceiptAt": now,
            "registeredAt": now,
            "stopped": False,
            "stoppedAt": None,
        }
        if current is None:
            try:
                pods.insert_one({"_id": pod_id, **fresh})
            except pymongo.errors.DuplicateKeyError:
                continue  # a twin process registered the same id at this moment: look again
        else:
            # Compare-and-set on the lease we judged expired, so a concurrent grant wins once.
            if not pods.update_one({"_id": pod_id, "leaseId": current.get("leaseId")}, {"$set": fresh}).matched_count:
                continue
        return PodLease(Outcome.GRANTED, pod_id, fresh["leaseId"], interval, fresh["expiryDeadline"], now)
    raise pymongo.errors.OperationFailure(f"pod {pod_id} registration kept racing; try again")


def renew(pod_id: str, lease_id: str) -> PodLease:
    """Renew the pod lease ``lease_id`` of ``pod_id`` on server time.

    Returns ``RENEWED`` with ``deadline = max(previous, receipt + factor × interval)``;
    ``STALE_LEASE`` for an unknown lease id or a stopped pod; ``EXPIRED`` when the deadline
    has passed. Terminal answers write nothing.

    Raises:
        PodLeaseError: a bad pod id or lease id (nothing written).
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    pod_id = _valid_pod(pod_id)
    if not isinstance(lease_id, str) or not lease_id or len(lease_id) > 64 or validation.TOKEN_RE.fullmatch(lease_id) is None:
        raise PodLeaseError("pod lease id must be a token string")
    pods = store.pods()
    now = store.server_now()
    current = pods.find_one({"_id": pod_id}, {"leaseId": 1, "intervalSeconds": 1, "stopped": 1, "expiryDeadline": 1})
    if current is None or current.get("leaseId") != lease_id or current.get("stopped"):
        return PodLease(Outcome.STALE_LEASE, pod_id, None, None, None, now)
    interval = int(current.get("intervalSeconds") or clamp_interval(None))
    candidate = _deadline(now, interval)
    # The filter re-checks lease id and "deadline not passed" at write time; $max keeps the
    # deadline monotonic under duplicate, delayed and replayed renewals.
    doc = pods.find_one_and_update(
        {"_id": pod_id, "leaseId": lease_id, "stopped": False, "expiryDeadline": {"$gt": now}},
        {"$max": {"expiryDeadline": candidate, "lastReceiptAt": now}},
        projection={"expiryDeadline": 1, "intervalSeconds": 1},
        return_document=pymongo.ReturnDocument.AFTER,
    )
    if doc is None:
        again = pods.find_one({"_id": pod_id}, {"leaseId": 1, "stopped": 1})
        if again is None or again.get("leaseId") != lease_id or again.get("stopped"):
            return PodLease(Outcome.STALE_LEASE, pod_id, None, None, None, now)
        return PodLease(Outcome.EXPIRED, pod_id, None, None, None, now)
    return PodLease(Outcome.RENEWED, pod_id, lease_id, interval, doc["expiryDeadline"], now)


def stop(pod_id: str, lease_id: str | None = None) -> bool:
    """Graceful shutdown: mark the pod stopped, so it is dead at once (not after its deadline).

    Returns True if a pod document was marked.

    Raises:
        PodLeaseError: a bad pod id.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    pod_id = _valid_pod(pod_id)
    query: dict[str, Any] = {"_id": pod_id}
    if lease_id:
        query["leaseId"] = lease_id  # a replaced lease (twin process) is not ours to stop
    result = store.pods().update_one(query, {"$set": {"stopped": True}, "$currentDate": {"stoppedAt": True}})
    return result.matched_count == 1


class LeasePodLiveness:
    """The one definition of "pod alive", shared by sweepers, the dispatcher and the views.

    Alive = registered, not stopped, ``expiryDeadline`` later than MongoDB's now, endpoint
    known. The own pod is always alive: it is obviously doing the check, and a missing or
    late own registration must neither make its leases reap targets nor fail its handlers.
    """

    def __init__(self, self_pod: str | None = None):
        self._self_pod = self_pod

    @property
    def self_pod(self) -> str:
        return self._self_pod or self_pod_id()

    @staticmethod
    def doc_alive(doc: dict[str, Any] | None, now: datetime) -> bool:
        """The criterion applied to one ``lease_pods`` document at server time ``now``."""
        return bool(
            doc is not None
            and not doc.get("stopped")
            and doc.get("expiryDeadline") is not None
            and doc["expiryDeadline"] > now
            and doc.get("endpoint")
        )

    def endpoint(self, pod_id: str, *, now: datetime | None = None) -> str | None:
        """The endpoint of ``pod_id`` if it is alive and foreign, else None.

        For the own pod this returns its registered endpoint (or ``""``): callers treat the
        own pod as alive and never POST to themselves.

        Raises:
            pymongo.errors.PyMongoError: the store is unreachable.
        """
        if not pod_id:
            return None
        doc = store.pods().find_one({"_id": pod_id})
        if pod_id == self.self_pod:
            return (doc or {}).get("endpoint") or ""
        now = now if now is not None else store.server_now()
        return doc["endpoint"] if self.doc_alive(doc, now) else None

    def is_alive(self, pod_id: str, *, now: datetime | None = None) -> bool:
        """Whether ``pod_id`` is alive (the own pod always is; detached ``""`` never is).

        Raises:
            pymongo.errors.PyMongoError: the store is unreachable.
        """
        if not pod_id:
            return False
        if pod_id == self.self_pod:
            return True
        return self.endpoint(pod_id, now=now) is not None

    def alive_pods(self, *, now: datetime | None = None) -> set[str]:
        """Ids of all alive pods (plus the own pod).

        Raises:
            pymongo.errors.PyMongoError: the store is unreachable.
        """
        now = now if now is not None else store.server_now()
        alive = {self.self_pod}
        for doc in store.pods().find({"stopped": False, "expiryDeadline": {"$gt": now}},
                                     {"endpoint": 1, "stopped": 1, "expiryDeadline": 1}):
            if self.doc_alive(doc, now):
                alive.add(doc["_id"])
        return alive

    def dead_holder_pods(self, *, now: datetime | None = None) -> list[str]:
        """Pods that hold leases but are not alive (never registered counts as dead).

        Raises:
            pymongo.errors.PyMongoError: the store is unreachable.
        """
        now = now if now is not None else store.server_now()
        alive = self.alive_pods(now=now)
        # distinct on the indexed ``pod`` field: cost grows with the number of pods.
        return sorted(p for p in store.holders().distinct("pod") if p and p not in alive)


liveness = LeasePodLiveness()


def pod_view(*, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every registered pod with its liveness, for operator views (issue 4 reads this).

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    now = now if now is not None else store.server_now()
    me = liveness.self_pod
    rows = []
    for doc in store.pods().find({}).sort("_id", 1):
        rows.append({**doc, "podId": doc["_id"], "alive": doc["_id"] == me or LeasePodLiveness.doc_alive(doc, now),
                     "self": doc["_id"] == me})
    return rows


# --- Renewal thread --------------------------------------------------------------------


class PodRenewer:
    """Keeps this process's pod lease alive from a daemon thread (renews while idle).

    Registers on start, renews at the server-issued interval, re-registers after
    ``STALE_LEASE``/``EXPIRED``, and after a failed attempt retries within the interval
    with bounded jitter (so one lost round trip never costs the deadline).
    """

    def __init__(self, pod_id: str, endpoint: str | None, *, proposed_interval: int | None = None,
                 on_state: Callable[[PodLease], None] | None = None):
        self.pod_id = pod_id
        self.endpoint = endpoint or ""
        self.proposed_interval = proposed_interval
        self.lease: PodLease | None = None
        self._on_state = on_state
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0

    def step(self) -> float:
        """One registration/renewal attempt; returns seconds until the next one."""
        try:
            if self.lease is None or not self.lease.ok:
                answer = register(self.pod_id, self.endpoint, proposed_interval=self.proposed_interval)
            else:
                answer = renew(self.pod_id, self.lease.lease_id or "")
                if not answer.ok:
                    log.warning("pod %s lease answered %s; re-registering", self.pod_id, answer.outcome.value)
                    answer = register(self.pod_id, self.endpoint, proposed_interval=self.proposed_interval)
        except (pymongo.errors.PyMongoError, OSError) as exc:
            self.failures += 1
            interval = (self.lease.interval_seconds if self.lease and self.lease.interval_seconds else clamp_interval(None))
            delay = interval * 0.5 + random.uniform(0, interval * 0.25)
            log.warning("pod %s lease renewal failed (%s); retrying in %.1fs", self.pod_id, exc.__class__.__name__, delay)
            return delay
        self.lease = answer
        self.failures = 0
        if self._on_state is not None:
            self._on_state(answer)
        return float(answer.interval_seconds or clamp_interval(None))

    def _run(self) -> None:
        while not self._stop.is_set():
            delay = self.step()
            self._stop.wait(delay)

    def start(self) -> "PodRenewer":
        self._thread = threading.Thread(target=self._run, name=f"pod-lease-{self.pod_id}", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, *, mark_stopped: bool = True) -> None:
        """Stop renewing and (gracefully) mark the pod stopped."""
        self._stop.set()
        if mark_stopped:
            try:
                stop(self.pod_id, self.lease.lease_id if self.lease and self.lease.ok else None)
            except (pymongo.errors.PyMongoError, OSError, LeaseError) as exc:
                log.warning("pod %s could not mark itself stopped (%s); it dies at its deadline", self.pod_id, exc)


_start_lock = threading.Lock()
_renewer: PodRenewer | None = None
_renewer_pid: int | None = None


def current_renewer() -> PodRenewer | None:
    """This process's renewer, if started (and not inherited through ``fork``)."""
    return _renewer if _renewer_pid == os.getpid() else None


def start_pod(endpoint: str | None = None) -> PodRenewer:
    """Start this process's pod lease renewal once per process (idempotent, fork-aware).

    ``endpoint`` defaults to ``LEASES_POD_ENDPOINT``. The first registration happens
    synchronously when possible, so the pod is alive before it serves or acquires.
    """
    global _renewer, _renewer_pid
    with _start_lock:
        if _renewer is not None and _renewer_pid == os.getpid():
            return _renewer
        chosen = endpoint if endpoint is not None else (_settings().POD_ENDPOINT or "")
        renewer = PodRenewer(self_pod_id(), chosen, proposed_interval=int(_settings().POD_INTERVAL_SECONDS))
        _renewer, _renewer_pid = renewer, os.getpid()
    delay = renewer.step()

    def _loop() -> None:
        if not renewer._stop.wait(delay):
            renewer._run()

    renewer._thread = threading.Thread(target=_loop, name=f"pod-lease-{renewer.pod_id}", daemon=True)
    renewer._thread.start()
    atexit.register(renewer.shutdown)
    return renewer


def stop_pod() -> None:
    """Graceful shutdown of this process's pod (marks it stopped)."""
    renewer = current_renewer()
    if renewer is not None:
        renewer.shutdown()


def lazy_start_on_request(sender: Any = None, environ: dict[str, Any] | None = None, **_: Any) -> None:
    """``request_started`` receiver: a web process becomes a pod on its first request.

    Without ``LEASES_POD_ENDPOINT`` the endpoint is taken from that request's host, so a
    plain ``runserver`` is reachable by the other pods without extra configuration.
    """
    if current_renewer() is not None:
        return
    endpoint = _settings().POD_ENDPOINT or ""
    if not endpoint and environ:
        host = environ.get("HTTP_HOST") or f"{environ.get('SERVER_NAME', '127.0.0.1')}:{environ.get('SERVER_PORT', '80')}"
        endpoint = f"{environ.get('wsgi.url_scheme', 'http')}://{host}"
    try:
        start_pod(endpoint)
    except Exception:  # never fail a request because the pod registry is unreachable
        log.exception("could not start the pod lease of this web process")


# --- Internal endpoint of processes without a web server (Celery workers) ---------------

_server_lock = threading.Lock()
_server: Any = None
_server_pid: int | None = None


def serve_internal(bind: str | None = None) -> str:
    """Serve this process's Django app (for ``/internal/lease/revoked``) from a daemon thread.

    Celery workers are pods too and need an endpoint the other pods can POST revocations
    to. ``bind`` is ``host:port`` (port 0 = any free port); default: the host/port of
    ``LEASES_POD_ENDPOINT`` if set, else ``LEASES_WORKER_INTERNAL_BIND``. If that port is
    taken (prefork children share the parent's settings), a free port on the same host is
    used. Returns the endpoint URL. Idempotent per process.

    Raises:
        OSError: no port could be bound.
    """
    global _server, _server_pid
    import socketserver
    import urllib.parse
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from django.core.wsgi import get_wsgi_application

    with _server_lock:
        if _server is not None and _server_pid == os.getpid():
            host, port = _server.server_address[:2]
            return f"http://{host}:{port}"
        s = _settings()
        if bind is None:
            if s.POD_ENDPOINT:
                parsed = urllib.parse.urlsplit(s.POD_ENDPOINT)
                bind = f"{parsed.hostname}:{parsed.port or 80}"
            else:
                bind = s.WORKER_INTERNAL_BIND
        host, _, port_text = bind.rpartition(":")
        host = host or "127.0.0.1"

        class _Server(socketserver.ThreadingMixIn, WSGIServer):
            daemon_threads = True
            allow_reuse_address = True

        class _QuietHandler(WSGIRequestHandler):
            def log_message(self, *args: Any) -> None:  # access logs would drown the worker log
                pass

        app = get_wsgi_application()
        try:
            server = make_server(host, int(port_text or 0), app, server_class=_Server, handler_class=_QuietHandler)
        except OSError:
            server = make_server(host, 0, app, server_class=_Server, handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="pod-internal-http",
                         daemon=True).start()
        _server, _server_pid = server, os.getpid()
        bound_host, bound_port = server.server_address[:2]
    if s.POD_ENDPOINT and int(port_text or 0) == bound_port:
        return s.POD_ENDPOINT.rstrip("/")
    return f"http://{bound_host}:{bound_port}"
