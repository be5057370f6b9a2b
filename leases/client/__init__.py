"""Python client of the HTTP lease API: the service module's ``Lease`` interface over HTTP.

::

    from leases.client import HttpLeaseClient

    client = HttpLeaseClient("https://brain.example", api_key)
    with client.acquire(type="tex", lease="tex", project_id="docs", user_id="alice") as lease:
        lease.update_payload({"jobId": job_id})
        while not done:
            lease.check()   # renews at the server-issued interval; LeaseLost once it ended

Same exceptions as the engine: :class:`~leases.errors.LeaseBusy` (with resource, level,
scope, count, cap and ``retry_after``), :class:`~leases.errors.LeaseUnavailable` (also for
network failures: fail closed), :class:`~leases.errors.LeaseLost` — precisely its
subclasses :class:`~leases.errors.StaleLease` / :class:`~leases.errors.LeaseExpired` for
``410 STALE_LEASE`` / ``410 EXPIRED``. There is no background renewal unless you ask for
one with :meth:`HttpLease.keepalive`.

How an answer becomes a value or an error (status and problem code to the engine's
exceptions, ``Retry-After``) is :mod:`leases.client.answers`.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.parse
from datetime import datetime
from typing import Any

import requests

from ..errors import (
    ApiKeyRejected,
    HttpProblem,
    InvalidLeaseRequest,
    LeaseBusy,
    LeaseError,
    LeaseLost,
    LeaseUnavailable,
)
from ..service import NOOP
from .answers import error_from, parse_time, poll_pause

__all__ = ["HttpLeaseClient", "HttpLease", "KeepAlive", "HttpProblem", "ApiKeyRejected"]

USER_AGENT = "vance-leases-python/1"


class HttpLeaseClient:
    """Talks to ``/api/v1/`` of ``base_url`` with ``api_key``; one pooled HTTP session.

    ``timeout`` bounds every call (seconds); it must exceed the server's bounded wait
    (``LEASES_HTTP_MAX_WAIT_MS``, 5 s by default) for acquisitions to wait at all.
    """

    #: The wait bound of :meth:`acquire` when none is given (milliseconds).
    DEFAULT_WAIT_MS = 60_000
    #: The largest ``waitMs`` the server accepts; longer bounds wait through a ticket.
    MAX_SERVER_WAIT_MS = 600_000

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 15.0,
                 session: requests.Session | None = None):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session = session or requests.Session()
        self._session.headers.update({"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT,
                                      "Accept": "application/json, application/problem+json"})

    def __enter__(self) -> "HttpLeaseClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the pooled connections."""
        self._session.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._answer(method, path, body)[1]

    def _answer(self, method: str, path: str, body: dict[str, Any] | None = None
                ) -> tuple[requests.Response, dict[str, Any]]:
        """The response and its JSON body (``{}`` for 204).

        Raises:
            LeaseError: the mapped problem answer; LeaseUnavailable for network failures.
        """
        try:
            response = self._session.request(method, f"{self.base_url}/api/v1/{path}", json=body,
                                              timeout=self.timeout)
        except requests.RequestException as exc:
            # Fail closed: an unreachable lease server means the resource is not protected.
            # Its netloc without user info: which server, never a credential in the URL.
            where = urllib.parse.urlsplit(self.base_url).netloc.rpartition("@")[2]
            raise LeaseUnavailable(f"lease server unreachable at {where}: {exc.__class__.__name__}") from None
        if response.status_code >= 400:
            raise error_from(response)
        if response.status_code == 204:
            return response, {}
        try:
            return response, response.json()
        except ValueError:
            raise LeaseUnavailable(f"lease server answered {response.status_code} without JSON") from None

    def acquire(self, *, type: str, user_id: str, project_id: str | None = None, lease: str | None = None,
                inline: dict[str, Any] | None = None, holder_ref: str = "", pod_bound: bool = False,
                interval_seconds: int | None = None, wait_ms: int | None = None,
                retry_busy_for: float = 0.0, priority: str | None = None) -> "HttpLease":
        """Acquire a lease (``POST /api/v1/leases``).

        ``interval_seconds`` is a proposal; the server decides. ``wait_ms`` bounds the whole
        wait for a slot (default :attr:`DEFAULT_WAIT_MS`): the server waits part of it, and
        when it answers ``202`` with a ticket this call keeps the place by polling the
        ticket at ``Retry-After`` (each poll waits for the grant while it is near: a long
        poll, ``?waitMs=``) until it is granted — the
        same :class:`HttpLease` as a direct grant — or the bound has passed; then it gives
        the ticket up (``DELETE``) and raises ``LeaseBusy`` with the last position.
        ``wait_ms=0`` does not wait at all. ``retry_busy_for`` keeps retrying ``429``
        answers (after ``Retry-After`` plus jitter) for that many seconds. ``priority`` names
        a class of the lease's definition (None: its default class).

        Returns:
            An :class:`HttpLease`, or ``leases.NOOP`` when the resource is not limited.

        Raises:
            LeaseBusy: still busy (after the retries, or when the wait bound passed in the
                queue: ``position`` is the last place the ticket had).
            LeaseLost: the ticket was dropped while waiting (``LeaseExpired``: not polled
                in time, e.g. this process stalled) or is unknown (``StaleLease``).
            LeaseUnavailable: server or store unreachable, or broken configuration.
            InvalidLeaseRequest: refused input (``UnknownLeaseType``, ``InvalidDefinition``, an
                unknown priority class...).
            PriorityNotAllowed: the tenant may not use that priority class.
            ApiKeyRejected: the key is missing, wrong or revoked.
        """
        started = time.monotonic()
        bound_ms = self.DEFAULT_WAIT_MS if wait_ms is None else max(0, int(wait_ms))
        body: dict[str, Any] = {"type": type, "userId": user_id, "podBound": pod_bound,
                                "waitMs": min(bound_ms, self.MAX_SERVER_WAIT_MS)}
        for name, value in (("projectId", project_id), ("lease", lease), ("inline", inline),
                            ("holderRef", holder_ref or None), ("proposedIntervalSeconds", interval_seconds),
                            ("priority", priority)):
            if value is not None:
                body[name] = value
        give_up = started + retry_busy_for
        while True:
            try:
                response, answer = self._answer("POST", "leases", body)
                break
            except LeaseBusy as busy:
                pause = (busy.retry_after if busy.retry_after is not None else 1.0) * random.uniform(1.0, 1.5)
                if time.monotonic() + pause > give_up:
                    raise
                time.sleep(pause)
        if response.status_code == 202:
            return self._wait_through(response, answer, started + bound_ms / 1000.0)
        if answer.get("noop"):
            return NOOP  # type: ignore[return-value]
        return HttpLease(self, answer)

    def _wait_through(self, response: requests.Response, ticket: dict[str, Any], until: float) -> "HttpLease":
        """Poll the ticket of a ``202`` until it is granted or ``until`` (monotonic) passed."""
        path = f"tickets/{ticket['ticket']}"
        first = True
        try:
            while True:
                remaining = until - time.monotonic()
                if remaining <= 0:
                    raise self._give_up(path, ticket)
                if not first:
                    time.sleep(min(poll_pause(response, ticket), remaining))
                # The poll waits for the grant when it is near (the server decides): the slot
                # is taken when it frees, not at the next poll. So the first poll goes at
                # once: a ticket further back is answered at once, with its Retry-After.
                first = False
                wait = max(0, min(int((until - time.monotonic()) * 1000), self.MAX_SERVER_WAIT_MS))
                response, answer = self._answer("GET", f"{path}?waitMs={wait}" if wait else path)
                if response.status_code == 201:
                    return HttpLease(self, answer)
                ticket = answer
        except LeaseError as error:
            if not isinstance(error, LeaseLost):
                # The place is lost to this call either way: free it now rather than at its deadline.
                self._abandon(path)
            raise

    def _give_up(self, path: str, ticket: dict[str, Any]) -> LeaseBusy:
        # DELETE also releases the lease if the last poll's turn came in between.
        self._abandon(path)
        estimate = ticket.get("estimatedWaitSeconds")
        return LeaseBusy(resource=ticket.get("resource", "?"), level=ticket.get("level", "?"), scope="?",
                         count=None, cap=0, position=ticket.get("position"),
                         retry_after=float(estimate if estimate is not None else ticket.get("pollIntervalSeconds") or 1))

    def _abandon(self, path: str) -> None:
        """Best effort: a ticket nobody polls is dropped at its deadline anyway."""
        try:
            self._answer("DELETE", path)
        except LeaseError:
            pass


class HttpLease:
    """A held lease over HTTP, with the interface of :class:`leases.service.Lease`."""

    is_noop = False

    def __init__(self, client: HttpLeaseClient, grant: dict[str, Any]):
        self._client = client
        self._lock = threading.Lock()
        self.token: str = grant["token"]
        self.type: str = grant.get("type", "")
        self.lease_name: str | None = grant.get("leaseName")
        self.resource: str | None = grant.get("resource")
        self._released = False
        self._lost: LeaseLost | None = None
        self._keepalive: KeepAlive | None = None
        self._apply(grant)

    def _apply(self, grant: dict[str, Any]) -> None:
        self.ttl_seconds: int = int(grant["ttlSeconds"])
        self.interval_seconds: int = int(grant["intervalSeconds"])
        self.expiry_deadline: datetime | None = parse_time(grant.get("expiryDeadline"))
        self.server_time: datetime | None = parse_time(grant.get("serverTime"))
        #: The grant's fence (as :attr:`leases.Lease.fence`), for the resource's guard.
        self.fence: str | None = grant.get("fence")
        # Only the cadence is measured locally; the deadline itself is the server's.
        self._renewed_at = time.monotonic()

    def __enter__(self) -> "HttpLease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<HttpLease {self.lease_name} {self.token[:8]}… on {self.resource}>"

    def _raise_if_ended(self) -> None:
        if self._released:
            raise LeaseLost(f"lease {self.token} was released")
        if self._lost is not None:
            raise self._lost

    def _post(self, method: str, path: str, body: dict[str, Any] | None) -> None:
        try:
            grant = self._client._call(method, f"leases/{self.token}/{path}", body)
        except LeaseLost as lost:
            self._lost = lost
            raise
        self._apply(grant)

    def renew(self) -> None:
        """Renew now (``POST .../renew``), whatever the interval says.

        Raises:
            LeaseLost: ``StaleLease`` or ``LeaseExpired``; terminal.
            LeaseUnavailable: the server or its store is unreachable.
        """
        with self._lock:
            self._raise_if_ended()
            self._post("POST", "renew", {})

    def check(self) -> None:
        """Check-at-use: renews when the server-issued interval has passed since the last
        renewal, otherwise answers from the last renewal without a request.

        Raises:
            LeaseLost: the lease ended (released, or a renewal answered 410).
            LeaseUnavailable: the server or its store is unreachable.
        """
        with self._lock:
            self._raise_if_ended()
            if time.monotonic() - self._renewed_at < self.interval_seconds:
                return
            self._post("POST", "renew", {})

    def update_payload(self, payload: dict[str, Any]) -> None:
        """Replace the payload the revocation handler gets (also a renewal).

        Raises:
            InvalidLeaseRequest: the server refused the payload.
            LeaseLost: the lease ended.
            LeaseUnavailable: the server or its store is unreachable.
        """
        if not isinstance(payload, dict):
            raise InvalidLeaseRequest("payload must be a dict")
        with self._lock:
            self._raise_if_ended()
            self._post("PUT", "payload", {"payload": payload})

    def release(self) -> bool:
        """Give the slots back (``DELETE``). Idempotent; True only for the call that released.

        A failed release (server unreachable) is not raised: the idle reap returns the slot
        after the TTL, exactly as for the in-process engine.
        """
        if self._keepalive is not None:
            self._keepalive.stop()
        with self._lock:
            if self._released:
                return False
            self._released = True
            try:
                answer = self._client._call("DELETE", f"leases/{self.token}")
            except (LeaseLost, LeaseUnavailable, HttpProblem):
                return False
            return bool(answer.get("released"))

    def keepalive(self) -> "KeepAlive":
        """Start a background thread renewing at the server-issued interval.

        For callers without a natural usage loop. Stops on release, on ``stop()`` or when the
        lease is lost (the next ``check()`` then raises). Use as a context manager.
        """
        with self._lock:
            self._raise_if_ended()
            if self._keepalive is None or not self._keepalive.running:
                self._keepalive = KeepAlive(self)
                self._keepalive.start()
            return self._keepalive


class KeepAlive:
    """A daemon thread renewing one :class:`HttpLease` at its (server-issued) interval."""

    # After a transient failure retry sooner than the interval, but never in a tight loop.
    RETRY_SECONDS = 1.0

    def __init__(self, lease: HttpLease):
        self.lease = lease
        self.renewals = 0
        self.error: LeaseError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-keepalive-{lease.token[:8]}", daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop renewing (the lease stays held until its TTL or release)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __enter__(self) -> "KeepAlive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        wait: float = self.lease.interval_seconds
        while not self._stop.wait(wait):
            try:
                self.lease.renew()
                self.renewals += 1
                self.error = None
                wait = self.lease.interval_seconds
            except LeaseLost as lost:
                self.error = lost
                return
            except LeaseError as error:
                # Transient (server unreachable): the deadline is still ahead of us.
                self.error = error
                wait = min(self.RETRY_SECONDS * random.uniform(1.0, 1.5), self.lease.interval_seconds)
