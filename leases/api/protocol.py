"""The HTTP lease protocol as a service: acquire, renew (check), update payload, release.

Everything is bound to the caller's API key: the key's tenant (and project, for a
project-bound key) is part of every holder and tombstone filter, so another tenant's token
answers exactly like a token that never existed (``STALE_LEASE``).

Renewal follows the server-issued lease: the server decides the interval, the deadline is
``expiresAt`` on MongoDB's clock, and a renewal moves it to ``max(previous, now + ttl)`` —
the rule of every path, :mod:`leases.engine.holders`, which this module only translates to HTTP
answers. Unknown (``STALE_LEASE``) and ended (``EXPIRED``) tokens are terminal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pymongo.errors

from leases import service
from leases.conf import lease_settings
from leases.engine import holders
from leases.engine.intervals import choose_interval, interval_bounds
from leases.errors import LeaseUnavailable, ProjectForbidden, StaleLease
from leases.ids import validation
from leases.store import client as store
from leases.store.documents import HolderDoc
from leases.telemetry import metrics

from .models import ApiKey

__all__ = ["Grant", "ReleaseResult", "acquire", "choose_interval", "grant_of", "interval_bounds", "iso",
           "epoch_ms", "key_scope", "release", "renew", "ticket_keep_ms", "ticket_poll_seconds"]

log = logging.getLogger(__name__)


def iso(moment: datetime) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2026-12-02T14:05:01.840Z``."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch_ms(moment: datetime) -> int:
    """Milliseconds since the epoch (naive datetimes are UTC, as pymongo returns them)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class Grant:
    """What acquire and renew answer: the lease and its server-decided deadline."""

    token: str | None
    lease_name: str | None
    resource: str | None
    type: str
    ttl_seconds: int | None
    interval_seconds: int | None
    expires_at: datetime | None
    server_time: datetime | None
    noop: bool = False
    fence: str | None = None  # the grant's fence (leases.fencing); None for a holder from before fences

    def to_json(self) -> dict[str, Any]:
        """The response body (see the OpenAPI ``Grant`` / ``NoopGrant`` schemas)."""
        if self.noop:
            return {"noop": True, "token": None, "type": self.type, "leaseName": self.lease_name}
        assert self.expires_at is not None and self.server_time is not None
        return {
            "noop": False,
            "token": self.token,
            "type": self.type,
            "leaseName": self.lease_name,
            "resource": self.resource,
            "ttlSeconds": self.ttl_seconds,
            "intervalSeconds": self.interval_seconds,
            "expiryDeadline": iso(self.expires_at),
            "expiryDeadlineMs": epoch_ms(self.expires_at),
            "serverTime": iso(self.server_time),
            "fence": self.fence,
        }


@dataclass(frozen=True)
class ReleaseResult:
    """``released``: this call returned the slots; ``already_released``: it had ended before."""

    token: str
    released: bool
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"token": self.token, "released": self.released, "alreadyReleased": not self.released}
        if self.reason is not None:
            body["reason"] = self.reason
        return body


def key_scope(key: ApiKey) -> holders.Scope:
    """The filter part every holder/tombstone query of ``key`` carries (tenant isolation)."""
    return holders.scope(key.tenant_id, key.project_id or None)


def _interval(value: Any, ttl: int) -> int:
    # Holders written before the interval was stored at creation answer the default.
    if not isinstance(value, int) or isinstance(value, bool):
        return choose_interval(ttl, None)
    return value


def _grant(doc: HolderDoc) -> Grant:
    ttl = int(doc.get("ttlSeconds") or 0)
    return Grant(
        token=doc["_id"], lease_name=doc.get("leaseName"), resource=doc.get("resource"),
        type=doc.get("type", ""), ttl_seconds=ttl, interval_seconds=_interval(doc.get("intervalSeconds"), ttl),
        expires_at=doc["expiresAt"], server_time=holders.server_time(doc), fence=doc.get("fence"),
    )


def grant_of(held: "service.Lease") -> Grant:
    """The acquire answer for a lease the engine granted (directly or through a ticket
    poll): everything comes with the grant's own command, nothing is read again."""
    ttl = held.definition.ttl_seconds
    assert held.expires_at is not None and held.last_seen_at is not None
    return Grant(token=held.token, lease_name=held.definition.name, resource=held.resource,
                 type=held.request.type, ttl_seconds=ttl, interval_seconds=_interval(held.interval_seconds, ttl),
                 expires_at=held.expires_at, server_time=held.last_seen_at, fence=held.fence)


def ticket_poll_seconds() -> int:
    """The poll interval the server issues with a wait ticket (``LEASES_TICKET_POLL_SECONDS``)."""
    return int(lease_settings.TICKET_POLL_SECONDS)


def ticket_keep_ms() -> int:
    """How long a ticket survives without a poll: three issued intervals, so one lost or
    late poll never costs the place."""
    return 3 * ticket_poll_seconds() * 1000


def acquire(*, key: ApiKey, type: str, user_id: str, project_id: str, lease: str | None = None,
            inline: dict[str, Any] | None = None, holder_ref: str = "", pod_bound: bool = False,
            proposed_interval: int | None = None, wait_ms: int | None = None,
            priority: str | None = None) -> "Grant | service.Ticket":
    """Acquire a detached lease (``pod=""``: only the idle reap applies) for ``key``'s tenant.

    The wait for a slot is ``min(definition waitMs, LEASES_HTTP_MAX_WAIT_MS, wait_ms)`` so a
    web worker is never held for long. When that wait ends without a slot, a named lease
    keeps its place: the answer is a :class:`leases.service.Ticket` the client polls
    (:func:`leases.api.tickets.poll`). ``wait_ms=0`` asks not to wait at all, so it never queues
    (busy at once); inline definitions never queue either.

    Raises:
        ProjectForbidden: a project-bound key named another project.
        InvalidLeaseRequest: bad ids (also the reserved ``_tenant`` / ``_vance``), names,
            inline definition, unknown type or a priority class the lease does not define.
        PriorityNotAllowed: a class the tenant may not use (never downgraded silently).
        LeaseBusy: a level stayed full for the bounded wait.
        LeaseUnavailable: the store is unreachable or the configuration is broken.
    """
    # A reserved layer id is refused here, at the request boundary: the layer code itself
    # uses them to address the System and Tenant documents.
    validation.request_id(project_id, "project id")
    if key.project_id and project_id != key.project_id:
        raise ProjectForbidden(f"this API key is bound to project {key.project_id!r}")
    bound = int(lease_settings.HTTP_MAX_WAIT_MS)
    request = service.LeaseRequest(
        type=type, tenant_id=key.tenant_id, project_id=project_id, user_id=user_id, lease=lease,
        inline=inline, holder_ref=holder_ref, pod="", pod_bound=pod_bound,
        wait_ms=bound if wait_ms is None else min(bound, wait_ms), priority=priority,
        interval_seconds=proposed_interval,
    )
    held = service.acquire(request) if wait_ms == 0 else service.acquire_or_ticket(request, keep_ms=ticket_keep_ms())
    if isinstance(held, service.Ticket):
        # The holder already carries the interval a later grant issues (chosen at creation).
        return held
    if not isinstance(held, service.Lease):  # the NOOP lease of an unlimited resource
        return Grant(token=None, lease_name=lease or (inline or {}).get("name"), resource=None, type=type,
                     ttl_seconds=None, interval_seconds=None, expires_at=None, server_time=None, noop=True)
    return grant_of(held)


def renew(*, key: ApiKey, token: str, proposed_interval: int | None = None,
          payload: dict[str, Any] | None = None) -> Grant:
    """Check-at-use over HTTP: keep the lease alive, optionally replacing its payload.

    Idempotent: the new deadline is ``max(previous deadline, now + ttl)`` on MongoDB's
    clock, so duplicate, delayed or replayed renewals never move it backwards.

    Raises:
        InvalidLeaseRequest: malformed token or payload; nothing was written.
        StaleLease: no such token for this key (including other tenants' tokens).
        LeaseExpired: the lease ended (reaped, revoked, released or past its deadline).
        LeaseUnavailable: the store is unreachable.
    """
    validation.token(token)
    if payload is not None:
        validation.payload(payload)
    return _grant(holders.renew(token, bound=key_scope(key), payload=payload, proposed_interval=proposed_interval))


def release(*, key: ApiKey, token: str) -> ReleaseResult:
    """Release ``token``: delete the holder (tenant-bound filter), return its slots, tombstone it.

    Idempotent: a second release answers ``released=False`` (``alreadyReleased``) with the
    reason the lease ended (``release``, ``idle``, ``pod``, ``revoke``), as long as the
    tombstone lives (7 days). A regular release never calls the type's handler.

    Raises:
        InvalidLeaseRequest: malformed token.
        StaleLease: no such token for this key (never issued, another tenant's, or so old
            that its tombstone expired).
        LeaseUnavailable: the store is unreachable.
    """
    validation.token(token)
    scope = key_scope(key)
    try:
        # Tenant (and project) binding is part of the delete filter; the tombstone is
        # written by the release itself.
        doc = holders.release(token, bound=scope)
        if doc is None:
            tombstone = store.tombstones().find_one(holders.scoped(token, scope), {"reason": 1, "resource": 1})
            if tombstone is None:
                raise StaleLease(f"unknown lease token {token}")
            # The tombstone's resource came from a definition, never from the request.
            metrics.RELEASE.labels(resource=metrics.resource_tag(tombstone.get("resource") or "unknown"),
                                   outcome="already-released").inc()
            return ReleaseResult(token=token, released=False, reason=tombstone.get("reason"))
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("lease store", exc, " during release")) from None
    return ReleaseResult(token=token, released=True, reason="release")
