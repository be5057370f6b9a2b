"""Kept tickets: poll one (:func:`resume`) until it is granted, or give it up (:func:`abandon`).

A ticket kept by ``acquire_or_ticket`` is its holder document (PENDING) plus its place in
the gate's queue. Every filter carries the caller's tenant scope, so another tenant's
ticket is unknown; a poll keeps both alive and, on its turn, books the slot with the
waiter's own decision; a ticket not polled in time is dropped as the queue drops stale ones.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime, timedelta
from typing import Any

import pymongo.errors
from pymongo import ReturnDocument

from ..conf import lease_settings
from ..definitions import model as definitions
from ..errors import LeaseExpired, LeaseUnavailable
from ..ids import validation
from ..queue import backlog, fences, grants, presence, shares, waiting, wakeups, watch
from ..store import client as store, entries, holder_commands
from ..store.documents import CounterDoc, TicketDoc
from ..store.shapes import arrived_at, ticket_in
from ..telemetry import history, metrics
from . import holders, long_polls as long_poll_slots
from .funnel import Attempt, _Vanished
from .lease import Lease
from .request import LeaseRequest
from .step import step, store_bound
from .ticket import Ticket
from .waiter import Waiter

log = logging.getLogger(__name__)


def resume(ticket_id: str, *, scope: holders.Scope, keep_ms: int, wait_ms: int = 0) -> "Lease | Ticket":
    """Poll a kept ticket (:func:`poll_once`); with ``wait_ms``, wait up to that long for its
    grant before answering "still waiting" (a long poll).

    A long poll waits only for a ticket whose turn is expected within ``wait_ms`` (or not
    estimated yet), and only in one of this process's ``LEASES_HTTP_LONG_POLLS`` slots, which
    go to the tickets nearest their turn (:mod:`leases.engine.long_polls`): every long poll
    holds a web worker thread, and those further back in the queue would hold them for
    nothing. While it waits the ticket is this process's: a release that grants it publishes
    the grant to every process (no process is named on a kept ticket), and the process where
    its poll waits claims it at once, one command; the process's watcher is the safety net
    for a lost wake-up. At the end of the wait the ticket is polled once more, so its
    deadline is a full keep from then.

    Raises:
        as :func:`poll_once`.
    """
    validation.token(ticket_id)
    if wait_ms <= 0:
        return poll_once(ticket_id, scope=scope, keep_ms=keep_ms)[0]
    deadline = time.monotonic() + wait_ms / 1000.0
    # Listening before the first look: a grant published between the look and the wait is
    # kept for it.
    event = wakeups.register(ticket_id)
    watched: str | None = None
    handle: int | None = None
    try:
        answer, attempt = poll_once(ticket_id, scope=scope, keep_ms=keep_ms)
        if attempt is None or not isinstance(answer, Ticket) or not long_polls(answer, wait_ms):
            return answer
        handle = long_poll_slots.enter(answer.estimated_grant_at, event)
        if handle is None:
            return answer  # the slots wait for tickets nearer their turn: come back at Retry-After
        watched = attempt.gate.key
        watch.add(watched, ticket_id)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not event.wait(left):
                answer = poll_once(ticket_id, scope=scope, keep_ms=keep_ms)[0]
                return dataclasses.replace(answer, waited=True) if isinstance(answer, Ticket) else answer
            event.clear()
            granted = wakeups.take_grant(ticket_id)
            wakeups.take_look(ticket_id)
            if granted is not None:
                lease = _claim_woken(attempt, granted)
                if lease is not None:
                    return lease
            if long_poll_slots.preempted(handle):
                return answer  # a ticket nearer its turn took the slot; its deadline stands
            answer, again = poll_once(ticket_id, scope=scope, keep_ms=keep_ms)
            if again is None or not isinstance(answer, Ticket):
                return answer
            attempt = again
    finally:
        if handle is not None:
            long_poll_slots.leave(handle)
        if watched is not None:
            watch.remove(watched, ticket_id)
        wakeups.unregister(ticket_id)


def long_polls(ticket: Ticket, wait_ms: int) -> bool:
    """Whether a poll that may wait ``wait_ms`` waits for ``ticket``: its grant is expected
    within the wait (or not estimated yet)."""
    if ticket.estimated_grant_at is None:
        return True
    return (ticket.estimated_grant_at - ticket.server_time).total_seconds() * 1000 <= wait_ms


def _claim_woken(attempt: Attempt, granted: wakeups.Granted) -> Lease | None:
    """Claim the grant a wake-up told of (the entry booked, its fence): mark the holder HELD,
    one command. None when it cannot be claimed so (the holder was written again or ended):
    the caller polls, which finds out what became of the ticket.

    Raises:
        LeaseUnavailable: the store failed.
    """
    def run() -> Lease | None:
        try:
            return attempt.claim(granted.booking, granted.fence)
        except _Vanished:
            return None

    lease = step(attempt, run, admit=False)  # a claim frees the way: it is not admitted
    if lease is None:
        return None
    # Dequeued: its arrival is its holder's (the poll set the attempt's from it).
    return _answered(attempt, CounterDoc(), {"acquiredAt": attempt.acquired_at}, lease)


def _answered(attempt: Attempt, gate: CounterDoc, holder: dict[str, Any], lease: Lease) -> Lease:
    """``lease``, granted on a poll: counted as an acquire that succeeded, in the history, and
    with its wait (:func:`observe_ticket_wait`)."""
    metrics.ACQUIRE.labels(resource=metrics.resource_tag(attempt.definition.resource), outcome="success").inc()
    history.grant(attempt.definition.resource, attempt.request.tenant_id)
    observe_ticket_wait(attempt, gate, holder, lease)
    return lease


def poll_once(ticket_id: str, *, scope: holders.Scope, keep_ms: int) -> "tuple[Lease | Ticket, Attempt | None]":
    """Poll a kept ticket: keep it alive, and book the slot when it is its turn.

    ``scope`` is the caller's tenant binding (``{"tenantId": …}``, plus ``projectId`` for a
    project-bound key): it is part of every filter, so another tenant's ticket is unknown.
    A ticket already granted answers its lease again (a lost answer can be fetched twice).
    Each poll also moves the waiting holder document's expiry to the poll deadline, so the
    idle reap never takes a ticket that is being polled, and a ticket granted between polls
    whose client stopped polling gives its slot back at that deadline; a poll after it is
    told EXPIRED (``ticket-expired``), granted meanwhile or not, and its slot goes back.
    Two commands.

    Returns:
        The answer, and the attempt the poll rebuilt for a ticket still pending (None when
        it was a lease already).

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
    if holder.get("state") == "PENDING" and isinstance(holder.get("expiresAt"), datetime):
        presence.note_kept(ticket_id, holder["expiresAt"])
    if holder.get("state") == "PENDING" and holder_commands.poll_missed(holder):
        # Polled after its deadline: the ticket is over, granted meanwhile or not (the poll
        # deadline is its window; its slot, if a release booked one for it, goes back).
        try:
            with store_bound():
                _end_kept(mine, "ticket-expired", known=holder)
        except pymongo.errors.PyMongoError as exc:
            raise LeaseUnavailable(store.unreachable("lease store", exc)) from None
        raise LeaseExpired(f"ticket {ticket_id} was not polled in time", reason="ticket-expired")
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
                     attempt_id=holder.get("attemptId"), fence=holder.get("fence")), None
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
    # The poll above kept the ticket alive (its holder's deadline is its keep-alive:
    # leases.queue.presence); the gate is only read, so polling writes nothing to it.
    gate, backlogged = step(attempt, lambda: _queued_on(attempt.gate.key, ticket_id))
    granted = None if gate is not None else step(attempt, lambda: _claim_granted(attempt))
    if granted is not None and not isinstance(granted, Lease):
        # Granted, its narrower levels still being booked (or undone) — or stranded so, its
        # granter gone before the undo: then this poll undoes it and the ticket queues again.
        half_done = granted
        gate = step(attempt, lambda: _unstrand(attempt, holder, half_done, keep_ms))
        if gate is None:
            return Ticket.of(ticket_id, definition, granted, None), attempt  # answer where it stands
        granted = None
    lease = granted
    if lease is not None:
        # A release granted it between two polls (the direct hand-off): this poll claims it.
        return _answered(attempt, CounterDoc(), holder, lease), attempt  # dequeued: arrival from the holder
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
        return _answered(attempt, gate, holder, lease), attempt
    return Ticket.of(ticket_id, definition, waiter.gate or gate, waiter.blocked, backlogged), attempt


def _queued_on(gate_key: str, ticket_id: str) -> tuple[CounterDoc | None, dict[str, Any] | None]:
    """The gate, read, when the ticket is queued there — in its head or its backlog (then
    its backlog document too); None when it is not (granted, or dropped).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    gate = waiting.read_gate(gate_key)
    if gate is None:
        return None, None
    if ticket_in(gate, ticket_id) is not None:
        return gate, None
    backlogged = backlog.get(ticket_id, gate_key)
    return (gate, backlogged) if backlogged is not None else (None, None)


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


def stranded_ms() -> int:
    """How long a grant may stay half-done (the gate booked, a narrower level not) before a
    poll of its kept ticket undoes it: twice the store bound, past which no granter's bulk
    is still running (every command carries the bound to the server), so the undo never
    races the bulk it repairs."""
    return 2 * int(lease_settings.MONGO_TIMEOUT_MS)


def _unstrand(attempt: Attempt, holder: dict[str, Any], gate: CounterDoc, keep_ms: int) -> CounterDoc | None:
    """Undo a grant of the kept ticket that stays half-done: the ordered bulk booked the
    gate (and dequeued the ticket) and stopped at a full narrower level, and its undo never
    landed (the granter died, or the store failed it). An in-process waiter recovers through
    the claim window; a kept ticket has none and would answer "waiting" on every poll.

    The first poll that sees it half-done stamps the holder (``stranded``: which grant — its
    fence — and when, on MongoDB's clock); a poll :func:`stranded_ms` later that sees the
    same grant still half-done undoes it as the granter would: the entry
    pulled by value from every level, the ticket queued again with its arrival, one ordered
    bulk. Pulls by value and an enqueue that skips a queued ticket: a second undo (the
    granter's, landing late after all, or a racing poll) changes nothing.

    Returns:
        The gate with the ticket queued again, or None when it is not undone (yet).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    booking = grants.granted_entry(gate, attempt.token)
    polled = holder.get("polledAt")
    if booking is None or not isinstance(polled, datetime):
        return None
    grant = grants.fence_of(gate, booking) or booking  # which grant: each issues its own fence
    recorded = holder.get("stranded")
    seen: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    stranded = seen.get("at")
    if seen.get("grant") != grant or not isinstance(stranded, datetime):
        store.holders().update_one(*holder_commands.stranded(attempt.token, attempt.attempt_id, grant))
        return None
    if polled - stranded < timedelta(milliseconds=stranded_ms()):
        return None
    ticket = attempt.ticket(attempt.gate.level, attempt.acquired_at, seen=polled)
    ticket["ttl"] = int(keep_ms)  # kept for its client, as the poll keeps it
    grants.undo(attempt.gate.key, attempt.keys, booking, ticket, fences.slot_naming(gate, booking))
    store.holders().update_one(*holder_commands.unstranded(attempt.token))
    log.info("kept ticket %s: its grant stayed half-done since %s; undone, queued again", attempt.token, stranded)
    return waiting.keep_alive(attempt.gate.key, attempt.token, ttl_ms=keep_ms)


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


def _end_kept(mine: dict[str, Any], reason: str, *, known: Any = None) -> Any:
    """End the kept ticket ``mine`` (its holder still ``PENDING``): drop it (holder,
    tombstone, queue place) and give back the slot a release may have booked for it
    between two polls (the dequeue answers the gate as it was, which shows the grant).

    Returns:
        The deleted holder, or None when it was gone already.

    Raises:
        pymongo.errors.PyMongoError: the store failed (an entry left behind has no holder:
            repair returns it).
    """
    doc = holders.drop_ticket(mine, reason, known=known)
    keys = entries.holder_keys(doc) if doc is not None else []
    if doc is None or not keys:
        return doc
    # Out of the queue: a ticket no longer queued there may have been granted (before the
    # delete, or between it and now): its entry goes back.
    waiting.leave_returning_grant(keys[-1], doc["_id"], keys)
    return doc


def abandon(ticket_id: str, *, scope: holders.Scope) -> bool:
    """Give up a kept ticket (or release the lease it was granted as).

    Returns:
        True when this call ended it; False when it was already gone.

    Raises:
        LeaseUnavailable: the store failed (retryable).
    """
    try:
        with store_bound():
            if _end_kept(holders.scoped(ticket_id, scope), "abandoned") is not None:
                return True
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("lease store", exc)) from None
    try:
        # Tombstoned: a later poll of the ticket answers EXPIRED (release), not "unknown".
        return holders.release(ticket_id, bound=scope) is not None
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("lease store", exc, " during release")) from None
