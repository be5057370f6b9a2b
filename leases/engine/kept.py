"""Kept tickets: poll one (:func:`resume`) until it is granted, or give it up (:func:`abandon`).

A ticket kept by ``acquire_or_ticket`` is its holder document (PENDING) plus its place in
the gate's queue. Every filter carries the caller's tenant scope, so another tenant's
ticket is unknown; a poll keeps both alive and, on its turn, books the slot with the
waiter's own decision; a ticket not polled in time is dropped as the queue drops stale ones.
"""

from __future__ import annotations

import time
from typing import Any

import pymongo.errors
from pymongo import ReturnDocument

from ..definitions import model as definitions
from ..errors import LeaseExpired, LeaseUnavailable
from ..ids import validation
from ..queue import grants, shares, waiting
from ..store import client as store, holder_commands
from ..store.documents import CounterDoc, TicketDoc
from ..store.shapes import arrived_at, ticket_in
from ..telemetry import history, metrics
from . import holders
from .funnel import Attempt, _Vanished
from .lease import Lease
from .request import LeaseRequest
from .step import step, store_bound
from .ticket import Ticket
from .waiter import Waiter


def resume(ticket_id: str, *, scope: holders.Scope, keep_ms: int) -> "Lease | Ticket":
    """Poll a kept ticket: keep it alive, and book the slot when it is its turn.

    ``scope`` is the caller's tenant binding (``{"tenantId": …}``, plus ``projectId`` for a
    project-bound key): it is part of every filter, so another tenant's ticket is unknown.
    A ticket already granted answers its lease again (a lost answer can be fetched twice).
    Each poll also moves the waiting holder document's expiry past the ticket's own
    deadline, so the idle reap never takes a ticket that is being polled. Two commands.

    Raises:
        StaleLease: no such ticket in the caller's scope.
        LeaseExpired: the ticket was dropped (not polled within its deadline, or abandoned).
        LeaseUnavailable: the store failed or the configuration is broken.
    """
    validation.token(ticket_id)
    mine = holders.scoped(ticket_id, scope)
    try:
        with store_bound():
            holder = store.holders().find_one_and_update(*holder_commands.poll_ticket(mine, keep_ms),
                                                         return_document=ReturnDocument.AFTER)
            if holder is None:
                holder = store.holders().find_one(holder_commands.granted(mine))
            gone = None if holder is not None else holders.ended(ticket_id, scope, noun="ticket")
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("lease store", exc)) from None
    if gone is not None:
        raise gone
    assert holder is not None  # no answer from the tombstone means the ticket's holder was found
    request = LeaseRequest(type=holder.get("type", ""), lease=holder.get("leaseName"), tenant_id=holder["tenantId"],
                           project_id=holder["projectId"], user_id=holder["userId"],
                           holder_ref=holder.get("holderRef", ""), pod=holder.get("pod", ""),
                           pod_bound=bool(holder.get("podBound")), priority=holder.get("priority"),
                           interval_seconds=holder.get("intervalSeconds"))
    # A ticket is only kept for a named lease, so its holder always names one.
    definition = definitions.resolve(request.lease or "", request.tenant_id, request.project_id)
    if holder.get("state") == "HELD":
        return Lease(ticket_id, definition, request, list(holder.get("levels") or ()),
                     expires_at=holder.get("expiresAt"), acquired_at=holder.get("acquiredAt"),
                     last_seen_at=holder.get("lastSeenAt"), interval_seconds=holder.get("intervalSeconds"),
                     attempt_id=holder.get("attemptId"), fence=holder.get("fence"))
    specs = definition.level_specs(request.tenant_id, request.project_id, request.user_id)
    # The class a ticket queued with stands: it was checked when the request queued, and a
    # System-layer change of the tenant's allowed classes since must not strand a ticket that
    # is already waiting (it ranks by today's list; a class no longer defined ranks last).
    kept = request.priority
    rank = definition.priorities.index(kept) if kept in definition.priorities else len(definition.priorities)
    attempt = Attempt(request, definition, specs, request.pod or "", priority=(rank, kept))
    attempt.token = ticket_id
    attempt.named(holder.get("attemptId"))  # the ticket's holder as written: its entries name it
    attempt.acquired_at = holder.get("acquiredAt")
    attempt.created_at = time.monotonic()
    waiter = Waiter(attempt, time.monotonic(), time.monotonic(), keep_ms=keep_ms)
    gate = step(attempt, lambda: waiting.keep_alive(attempt.gate.key, ticket_id, ttl_ms=keep_ms,
                                                     live_at=holder["polledAt"]))
    granted = None if gate is not None else step(attempt, lambda: _claim_granted(attempt))
    if granted is not None and not isinstance(granted, Lease):
        # Granted, its narrower levels still being booked (or undone): answer where it stands.
        return Ticket.of(ticket_id, definition, granted, None)
    lease = granted
    if lease is not None:
        # A release granted it between two polls (the direct hand-off): this poll claims it.
        metrics.ACQUIRE.labels(resource=metrics.resource_tag(definition.resource), outcome="success").inc()
        history.grant(definition.resource, request.tenant_id)
        observe_ticket_wait(attempt, CounterDoc(), holder, lease)  # dequeued: arrival from the holder
        return lease
    if gate is None:
        # Not polled within its deadline (or already dropped): the waiting is over. Drop it
        # the way the queue drops stale tickets (holder removed, tombstoned).
        def drop() -> None:
            current = waiting.read_gate(attempt.gate.key)
            if current is not None:
                waiting.prune(current)
            holders.drop_ticket(mine, "ticket-expired", known=holder)

        step(attempt, drop)
        raise LeaseExpired(f"ticket {ticket_id} was not polled in time", reason="ticket-expired")
    waiter.gate = gate
    lease = waiter._decide()
    if lease is not None:
        metrics.ACQUIRE.labels(resource=metrics.resource_tag(definition.resource), outcome="success").inc()
        history.grant(definition.resource, request.tenant_id)
        observe_ticket_wait(attempt, gate, holder, lease)
        return lease
    return Ticket.of(ticket_id, definition, waiter.gate or gate, waiter.blocked)


def _claim_granted(attempt: Attempt) -> Lease | CounterDoc | None:
    """The kept ticket is no longer queued: if a release booked its entry on the gate, claim
    it (mark the holder HELD with the recorded fence); None when nothing was granted; the
    gate as read when the grant's bulk has not booked every narrower level (yet, or any
    more): the next poll looks again.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    current = waiting.read_gate(attempt.gate.key)
    grant = grants.grant_on(current, attempt.token, attempt.keys[:-1])
    if grant is None:
        return None
    if not grant.complete:
        return current
    try:
        return attempt.claim(grant.booking, grant.fence)
    except _Vanished:
        # Its holder was written again or ended since: the entry books for nobody.
        waiting.give_back(list(attempt.keys), grant.booking)
        return None


def observe_ticket_wait(attempt: Attempt, gate: CounterDoc, holder: dict[str, Any], lease: Lease) -> None:
    """Record the per-class wait of a ticket granted on a poll, once: from its arrival in
    the queue (the ticket's ``at``, else its holder's ``acquiredAt``) to the grant (the
    HELD update's ``lastSeenAt``), both MongoDB's clock as stored. The request that kept
    the ticket recorded none in this histogram, nor does a poll answering it again."""
    ticket = ticket_in(gate, attempt.token) or TicketDoc()
    arrived = arrived_at(ticket) or holder.get("acquiredAt")
    if arrived is None or lease.last_seen_at is None:
        return
    waited = max(0.0, (lease.last_seen_at - arrived).total_seconds())
    shares.observe_wait(attempt.definition, attempt.priority[1], waited)


def abandon(ticket_id: str, *, scope: holders.Scope) -> bool:
    """Give up a kept ticket (or release the lease it was granted as).

    Returns:
        True when this call ended it; False when it was already gone.

    Raises:
        LeaseUnavailable: the store failed (retryable).
    """
    try:
        with store_bound():
            if holders.drop_ticket(holders.scoped(ticket_id, scope), "abandoned", dequeue=True) is not None:
                return True
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("lease store", exc)) from None
    try:
        # Tombstoned: a later poll of the ticket answers EXPIRED (release), not "unknown".
        return holders.release(ticket_id, bound=scope) is not None
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("lease store", exc, " during release")) from None
