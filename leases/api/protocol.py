"""The HTTP lease protocol as a service: acquire, renew (check), update payload, release.

Everything is bound to the caller's API key: the key's tenant (and project, for a
project-bound key) is part of every holder and tombstone filter, so another tenant's token
answers exactly like a token that never existed (``STALE_LEASE``).

Renewal follows the server-issued lease: the server decides the interval, the deadline is
``expiresAt`` on MongoDB's clock, and a renewal moves it to ``max(previous, now + ttl)``.
The filter of the renewal compares ``expiresAt`` with the server time read from MongoDB
(``store.server_now()``), never with the client's clock and never with ``$$NOW`` (the
embedded server answers such comparisons wrongly). Unknown (``STALE_LEASE``) and ended
(``EXPIRED``) tokens are terminal and refresh nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pymongo.errors
from pymongo import ReturnDocument

from leases import metrics, reaper, service, store, validation
from leases.conf import lease_settings
from leases.errors import LeaseExpired, LeaseUnavailable, ProjectForbidden, StaleLease

from .models import ApiKey

log = logging.getLogger(__name__)

_GRANT_FIELDS = {"resource": 1, "leaseName": 1, "type": 1, "ttlSeconds": 1, "expiresAt": 1, "lastSeenAt": 1,
                 "intervalSeconds": 1}


def interval_bounds(ttl_seconds: int) -> tuple[int, int]:
    """The renewal intervals the server accepts for a lease of ``ttl_seconds``.

    ``[max(1, ttl // 10), max(lo, ttl // 2)]``: at most half the TTL, so one lost or late
    renewal never loses the lease; at least a tenth, so clients cannot hammer the store.
    """
    low = max(1, ttl_seconds // 10)
    return low, max(low, ttl_seconds // 2)


def choose_interval(ttl_seconds: int, proposed: int | None) -> int:
    """The server-issued interval: ``proposed`` clamped into :func:`interval_bounds`;
    without a proposal a third of the TTL (two renewals may be lost before expiry)."""
    low, high = interval_bounds(ttl_seconds)
    wanted = ttl_seconds // 3 if proposed is None else proposed
    return min(high, max(low, wanted))


def iso(moment: datetime) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2026-12-02T14:05:01.840Z``."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch_ms(moment: datetime) -> int:
    """Milliseconds since the epoch (naive datetimes are UTC, as pymongo returns them)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
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


def key_scope(key: ApiKey) -> dict[str, str]:
    """The filter part every holder/tombstone query of ``key`` carries (tenant isolation)."""
    scope = {"tenantId": key.tenant_id}
    if key.project_id:
        scope["projectId"] = key.project_id
    return scope


def _grant(doc: dict[str, Any], server_time: datetime) -> Grant:
    ttl = int(doc.get("ttlSeconds") or 0)
    interval = doc.get("intervalSeconds")
    if not isinstance(interval, int) or isinstance(interval, bool):
        interval = choose_interval(ttl, None)
    return Grant(
        token=doc["_id"], lease_name=doc.get("leaseName"), resource=doc.get("resource"),
        type=doc.get("type", ""), ttl_seconds=ttl, interval_seconds=interval,
        expires_at=doc["expiresAt"], server_time=server_time,
    )


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
    )
    held = service.acquire(request) if wait_ms == 0 else service.acquire_or_ticket(request, keep_ms=ticket_keep_ms())
    if isinstance(held, service.Ticket):
        _issue_interval_to_ticket(held, key, proposed_interval)
        return held
    if held.is_noop:
        return Grant(token=None, lease_name=lease or (inline or {}).get("name"), resource=None, type=type,
                     ttl_seconds=None, interval_seconds=None, expires_at=None, server_time=None, noop=True)
    interval = choose_interval(held.definition.ttl_seconds, proposed_interval)
    try:
        # The issued interval is stored on the holder so every renewal answers the same one
        # (until a renewal proposes another); the same command reads the server deadline.
        doc = store.holders().find_one_and_update(
            {"_id": held.token, **key_scope(key)}, {"$set": {"intervalSeconds": interval}},
            projection=_GRANT_FIELDS, return_document=ReturnDocument.AFTER)
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(f"lease store unreachable after acquire: {exc.__class__.__name__}") from None
    if doc is None:
        raise LeaseUnavailable("the lease was reaped right after it was acquired; acquire again")
    return _grant(doc, doc["lastSeenAt"])


def _issue_interval_to_ticket(ticket: "service.Ticket", key: ApiKey, proposed: int | None) -> None:
    """Store the interval a later grant of ``ticket`` issues, clamped by the holder's own TTL
    (the proposal came with the acquire; the polls that grant it carry none)."""
    if proposed is None:
        return  # the grant issues the default (ttl / 3)
    ttl = {"$ifNull": ["$ttlSeconds", 1]}
    low = {"$max": [1, {"$floor": {"$divide": [ttl, 10]}}]}
    high = {"$max": [low, {"$floor": {"$divide": [ttl, 2]}}]}
    try:
        store.holders().update_one(
            {"_id": ticket.id, **key_scope(key), "state": "PENDING"},
            [{"$set": {"intervalSeconds": {"$toInt": {"$min": [high, {"$max": [low, int(proposed)]}]}}}}])
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(f"lease store unreachable after queueing: {exc.__class__.__name__}") from None


def granted(held: "service.Lease", scope: dict[str, str]) -> Grant:
    """The acquire answer for a lease granted through a ticket poll: the interval the
    acquire's proposal chose, else the default one, stored on the holder as acquire does.

    Raises:
        StaleLease / LeaseExpired: the lease ended right after the grant.
        LeaseUnavailable: the store is unreachable.
    """
    interval = choose_interval(held.definition.ttl_seconds, None)
    try:
        doc = store.holders().find_one_and_update(
            {"_id": held.token, **scope, "state": "HELD"},
            [{"$set": {"intervalSeconds": {"$ifNull": ["$intervalSeconds", interval]}}}],
            projection=_GRANT_FIELDS, return_document=ReturnDocument.AFTER)
        if doc is None:
            raise _ended(held.token, scope, store.server_now())
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(f"lease store unreachable after the grant: {exc.__class__.__name__}") from None
    return _grant(doc, doc["lastSeenAt"])


def _ended(token: str, scope: dict[str, str], now: datetime) -> LeaseExpired | StaleLease:
    """Why a renewal matched nothing: past its deadline or tombstoned → EXPIRED, else STALE."""
    holder = store.holders().find_one({"_id": token, **scope}, {"state": 1, "expiresAt": 1})
    if holder is not None and holder.get("state") == "HELD":
        # Past its deadline but not reaped yet: the reaper (or the next acquire's lazy reap)
        # removes it and dispatches the handler; the renewal must not revive it.
        return LeaseExpired(f"lease {token} passed its expiry deadline", reason="deadline")
    tombstone = store.tombstones().find_one({"_id": token, **scope}, {"reason": 1})
    if tombstone is not None:
        return LeaseExpired(f"lease {token} has ended ({tombstone.get('reason', 'ended')})",
                            reason=tombstone.get("reason"))
    return StaleLease(f"unknown lease token {token}")


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
    scope = key_scope(key)
    try:
        now = store.server_now()
        ttl_ms = {"$multiply": ["$ttlSeconds", 1000]}
        update: dict[str, Any] = {
            # Comparisons are against ``now`` (a literal read from the server), never $$NOW;
            # the values written come from $$NOW, which is >= now.
            "lastSeenAt": {"$cond": [{"$gt": ["$lastSeenAt", now]}, "$lastSeenAt", "$$NOW"]},
            "expiresAt": {"$cond": [{"$gt": ["$expiresAt", {"$add": [now, ttl_ms]}]},
                                    "$expiresAt", {"$add": ["$$NOW", ttl_ms]}]},
        }
        if payload is not None:
            update["payload"] = {"$literal": payload}
        if proposed_interval is not None:
            # A new proposal re-negotiates the interval, clamped by the holder's own TTL.
            ttl = {"$ifNull": ["$ttlSeconds", 1]}
            low = {"$max": [1, {"$floor": {"$divide": [ttl, 10]}}]}
            high = {"$max": [low, {"$floor": {"$divide": [ttl, 2]}}]}
            update["intervalSeconds"] = {"$toInt": {"$min": [high, {"$max": [low, int(proposed_interval)]}]}}
        doc = store.holders().find_one_and_update(
            {"_id": token, **scope, "state": "HELD", "expiresAt": {"$gte": now}},
            [{"$set": update}],
            projection=_GRANT_FIELDS,
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            error = _ended(token, scope, now)
            metrics.CHECK.labels(resource="unknown", outcome="lost").inc()
            raise error
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(f"lease store unreachable during renew: {exc.__class__.__name__}") from None
    metrics.CHECK.labels(resource=metrics.resource_tag(doc.get("resource", "unknown")), outcome="ok").inc()
    return _grant(doc, doc["lastSeenAt"])


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
        # Tenant (and project) binding is part of the delete filter.
        doc = service.release_holder({"_id": token, **scope})
        if doc is None:
            tombstone = store.tombstones().find_one({"_id": token, **scope}, {"reason": 1, "resource": 1})
            if tombstone is None:
                raise StaleLease(f"unknown lease token {token}")
            # The tombstone's resource came from a definition, never from the request.
            metrics.RELEASE.labels(resource=metrics.resource_tag(tombstone.get("resource") or "unknown"),
                                   outcome="already-released").inc()
            return ReleaseResult(token=token, released=False, reason=tombstone.get("reason"))
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(f"lease store unreachable during release: {exc.__class__.__name__}") from None
    # A lost tombstone only turns a later EXPIRED answer into STALE_LEASE.
    try:
        reaper.record_tombstone(doc, "release")
    except pymongo.errors.PyMongoError as exc:
        log.warning("release of %s: tombstone not written (%s)", token, exc)
    return ReleaseResult(token=token, released=True, reason="release")
