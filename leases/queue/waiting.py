"""The waiting queue: tickets on the gate counter, hand-off on release, lazy repair.

A ticket lives inside the gate counter's ``queue`` (one document per resource funnel):
``{id, t, p, u, at, seen, ttl, caps, lvl}`` — the holder token it will be granted as, who
waits, when it arrived and was last kept alive (MongoDB's clock), its TTL, the narrower
caps it must also fit and the level that blocked it last. A waiter holds no slot while it
waits, so a waiter killed with ``kill -9`` leaves nothing booked: its ticket just goes
stale after ``ttl`` and is ignored, then pruned by whoever reads the gate next.

Reading the gate, keeping a ticket alive and returning a gate slot are each one command
that returns the gate document, so the order rule (``leases.queue.order``) always runs on what
that command saw — no extra read per decision.

The bound: a live waiter blocked at any level is granted within one turnover of that level
after a slot there frees (its current holders' hold), in arrival order within its tenant,
project and user as at the gate — plus at most one ``order.BLOCKED_PAUSE`` when a newcomer
of its tenant had booked the narrower level on its way to the queue. A ticket queued again
(its waiter stalled past the TTL) keeps its arrival and is alive as of its return.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

import pymongo.errors
from pymongo import ReturnDocument

from ..conf import lease_settings
from ..revocation import listener
from ..revocation.handlers import RevokedHolder
from ..store import admission, client as store, entries, holder_commands, shapes, ticket_commands as commands
from ..store.documents import CounterDoc, HolderDoc, TicketDoc
from ..store.tombstones import ticket_tombstones
from . import backlog, fences, grants, order, presence, slots, wakeups

#: Ends a holder (deletes it, returns its slots, tombstones it): the engine's
#: :func:`leases.engine.holders.end`. The queue sits below the engine, so the engine hands
#: the function in when it is imported (:func:`set_holder_end`) instead of the queue
#: importing it; importing ``leases`` imports the engine, so it is always set.
HolderEnd = Callable[[dict[str, Any], str], HolderDoc | None]
_holder_end: HolderEnd | None = None


def set_holder_end(end: HolderEnd) -> None:
    """Install the function :func:`repair` reaps expired holders with."""
    global _holder_end
    _holder_end = end

log = logging.getLogger(__name__)


def ticket_ttl_ms() -> int:
    """How long a ticket survives without a keep-alive (a killed waiter leaves this fast)."""
    return int(lease_settings.TICKET_TTL_MS)


def poll_ms() -> int:
    """A waiter's safety poll and keep-alive period (also when no wake-up arrives)."""
    return max(100, min(int(lease_settings.WAIT_POLL_MS), ticket_ttl_ms() // 2))


def repair_interval_ms() -> int:
    """How often one full counter is checked for slots no live holder books."""
    return int(lease_settings.REPAIR_INTERVAL_MS)


# Gate key → the check a claim of this process replaced last, and when (monotonic; see repair).
_repair_claimed: dict[str, tuple[datetime | None, float]] = {}

# Gate key → monotonic time this process last saw tickets waiting there. A newcomer that
# saw a queue a moment ago skips the gate push that would be refused and queues at once
# (one command less per contended grant; skipping a push is always safe).
_queued_seen: dict[str, float] = {}
QUEUE_HINT_S = 1.0


def note_queue(gate: CounterDoc | None) -> None:
    """Remember whether the gate had waiting tickets (from a document a command returned),
    and its slots for the next fence proposed on it (:func:`leases.queue.fences.note`)."""
    if gate is None:
        return
    fences.note(gate)
    if shapes.has_waiters(gate):
        _queued_seen[gate["_id"]] = time.monotonic()
    else:
        _queued_seen.pop(gate["_id"], None)
    head = len(gate.get("queue") or ())
    if backlog.count(gate) or head >= backlog.head_limit():
        was = backlog_likely(gate["_id"])
        _backlog_seen[gate["_id"]] = (time.monotonic(), head + backlog.count(gate))
        if not was and backlog_likely(gate["_id"]):
            # Newcomers waiting for a step's turn may now go to the backlog without one.
            admission.recheck()
    else:
        _backlog_seen.pop(gate["_id"], None)


# Gate key → (monotonic time, tickets waiting) when this process last saw its head full or
# its backlog in use: a newcomer then goes to the backlog at once, without the push into the
# head that would be refused and the read after it (two commands on the gate less).
_backlog_seen: dict[str, tuple[float, int]] = {}


def backlog_likely(gate_key: str) -> bool:
    """Whether this process saw the gate's backlog in use (or its head full) within the last
    second, with room left in the queue."""
    seen = _backlog_seen.get(gate_key)
    return seen is not None and time.monotonic() - seen[0] < QUEUE_HINT_S and seen[1] < queue_limit() - 1


def queue_likely(gate_key: str) -> bool:
    """Whether this process saw tickets waiting at the gate within the last second."""
    seen = _queued_seen.get(gate_key)
    return seen is not None and time.monotonic() - seen < QUEUE_HINT_S


class _QueueFull(Exception):
    """The gate's queue holds ``LEASES_QUEUE_LIMIT`` tickets: the request is not queued.
    Control flow between the queue and the waiter, which answers it as ``LeaseBusy``
    (``queue_full``): it never reaches a caller."""

    def __init__(self, gate: CounterDoc):
        super().__init__(f"queue of {gate.get('_id')} is full")
        self.gate = gate


def queue_limit() -> int:
    """The most tickets a gate's queue holds (``LEASES_QUEUE_LIMIT``, at least 1)."""
    return max(1, int(lease_settings.QUEUE_LIMIT))


def enqueue(gate_key: str, ticket: TicketDoc, *, to_backlog: bool = False) -> CounterDoc | None:
    """Append ``ticket`` to the gate's queue (idempotent); the gate after, None if missing.
    ``to_backlog``: in the backlog, whatever the hint says now (the caller chose it by the hint).

    Raises:
        _QueueFull: the queue holds ``LEASES_QUEUE_LIMIT`` tickets and not this one.
        pymongo.errors.PyMongoError: the store failed.
    """
    if to_backlog or backlog_likely(gate_key):
        placed = backlog.add(CounterDoc(_id=gate_key), ticket)
        if placed is not None:
            return placed
        # The hint outlived the gate document: queue the ordinary way (no gate: None, and the
        # caller creates it).
    for _ in range(2):  # the second try: the head emptied between the push and the read
        after = store.counters().find_one_and_update(
            *commands.enqueue(gate_key, dict(ticket), min(backlog.head_limit(), queue_limit())),
            return_document=ReturnDocument.AFTER)
        if after is not None:
            backlog.forget(ticket["id"])
            return after
        # Queued already (its process's heartbeat keeps it alive), the head full or older
        # tickets in the backlog, or no gate yet.
        gate = read_gate(gate_key)
        if gate is None:
            return None
        if shapes.ticket_in(gate, ticket["id"]) is not None:
            return gate
        head = len(gate.get("queue") or ())
        if head + backlog.count(gate) >= queue_limit():
            raise _QueueFull(gate)
        if head < min(backlog.head_limit(), queue_limit()) and not backlog.count(gate):
            continue
        return backlog.add(gate, ticket)
    return None


def queued(gate: CounterDoc | None, ticket_id: str) -> bool:
    """Whether ``ticket_id`` waits at ``gate``: in its head, or — a ticket of this process —
    in its backlog (:func:`leases.queue.backlog.placed`)."""
    return gate is not None and (shapes.ticket_in(gate, ticket_id) is not None
                                 or backlog.placed(ticket_id, gate["_id"]))


def keep_alive(gate_key: str, ticket_id: str, *, ttl_ms: int | None = None,
               live_at: datetime | None = None) -> CounterDoc | None:
    """Refresh the ticket's ``seen`` on MongoDB's clock; the gate after, or None when the
    ticket is no longer queued (granted, pruned as stale, or the gate is gone) — or, with
    ``live_at``, no longer live then.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    gate = store.counters().find_one_and_update(
        *commands.keep_alive(gate_key, ticket_id, ttl_ms=ttl_ms, live_at=live_at),
        array_filters=commands.mine(ticket_id), return_document=ReturnDocument.AFTER)
    if gate is None and ttl_ms is not None and backlog.keep_for_polls(gate_key, ticket_id, ttl_ms):
        return read_gate(gate_key)  # kept in the backlog: the gate as it is
    return gate


def mark_blocked(gate_key: str, ticket_id: str, level: str) -> None:
    """Record which level blocked the ticket last (for diagnosis and Insights).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    store.counters().update_one(*commands.mark_blocked(gate_key, ticket_id, level),
                                array_filters=commands.mine(ticket_id))


def dequeue(gate_key: str, ticket_id: str) -> None:
    """Remove a ticket (timeout, abandon).

    Raises:
        pymongo.errors.PyMongoError: the store failed (the ticket then goes stale by itself).
    """
    if not store.counters().update_one(*commands.dequeue(gate_key, ticket_id)).modified_count:
        backlog.remove(gate_key, ticket_id)  # not in the head: in the backlog, if anywhere


def leave(gate_key: str, ticket_id: str) -> CounterDoc | None:
    """Remove a ticket at its waiter's deadline, answering the gate as it was just before: a
    ticket no longer queued there was granted (its entry is on the gate) or pruned.

    Raises:
        pymongo.errors.PyMongoError: the store failed (the ticket then goes stale by itself).
    """
    if backlog.remove(gate_key, ticket_id):
        # It waited in the backlog until now: nobody granted it. The gate as it is, with the
        # ticket as queued (what the callers ask of the gate "just before").
        gate = read_gate(gate_key) or CounterDoc(_id=gate_key)
        return cast(CounterDoc, {**gate, "queue": [*shapes.queue_of(gate), {"id": ticket_id}]})
    return store.counters().find_one_and_update(*commands.dequeue(gate_key, ticket_id),
                                                return_document=ReturnDocument.BEFORE)


def leave_returning_grant(gate_key: str, ticket_id: str, keys: list[str]) -> CounterDoc | None:
    """:func:`leave`, and give back the entry a release granted the ticket meanwhile (it was
    not queued any more and the gate books it): for a ticket whose holder is gone or being
    written again, which nobody could claim it for.

    Returns:
        The gate as it was just before the dequeue, or None.

    Raises:
        pymongo.errors.PyMongoError: the store failed (an entry left behind has no live
            holder: repair returns it).
    """
    before = leave(gate_key, ticket_id)
    if before is not None and shapes.ticket_in(before, ticket_id) is None:
        booking = grants.granted_entry(before, ticket_id)
        if booking is not None:
            give_back(keys, booking)
    return before


def read_gate(gate_key: str) -> CounterDoc | None:
    """The gate counter with ``clock`` set to MongoDB's time now, read without writing it
    (the gate is the resource's hottest document: a read must not rewrite it), with the
    heartbeats the next decision on it will likely look up (:func:`presence.read_gate`).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    return presence.read_gate(gate_key)


def prune(gate: CounterDoc, ids: list[str] | None = None, *, reason: str = "ticket-expired") -> CounterDoc:
    """Drop the gate's stale tickets — or ``ids``, whose waiters are known to be gone —
    and their holder documents (they book nothing); returns the gate as it is now.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    stale = order.stale_ids(gate, gate["clock"]) if ids is None else list(ids)
    if not stale:
        return gate
    after = store.counters().find_one_and_update(*commands.prune(gate["_id"], stale),
                                                 return_document=ReturnDocument.AFTER)
    # Remember the ids, so a client polling a ticket late is told EXPIRED, not "unknown".
    # The holders are deleted in one command, so their tombstones come from the tickets
    # (who waited) and the gate (where), in the one shape every tombstone has.
    store.holders().delete_many(commands.pruned_holders(stale))
    store.tombstones().bulk_write(ticket_tombstones(gate, stale, reason), ordered=False)
    log.info("queue %s: dropped %d tickets (%s)", gate["_id"], len(stale), reason)
    return after or gate


def wake(gate: CounterDoc, ids: list[str]) -> list[str]:
    """Wake the waiters of ``ids``; returns those whose wake-up nobody received (no
    subscriber of their process: it is gone — or Redis restarted, or its subscriber is
    reconnecting: the two look alike). Never raises."""
    by_id = {t["id"]: t for t in gate.get("queue") or ()}
    # The freed slots and whose turn takes which, so each woken waiter proposes its own slot.
    hint = fences.hint_of(gate, order.next_grants(gate, gate["clock"]) if gate.get("clock") else ())
    return [tid for tid in ids if tid in by_id and wakeups.wake(tid, shapes.waker(by_id[tid]), hint) == wakeups.DEAD]


def first_look(gate: CounterDoc) -> bool:
    """Whether no thread of this process has acted on this state of the gate yet (its
    ``clock``): the newcomers of a batch (:mod:`leases.store.batches`) all got the same gate
    back, and a hand-off on it sent by each would be a conditional update doomed to lose
    after the first."""
    with _looks_lock:
        if _looked.get(gate["_id"]) == gate.get("clock"):
            return False
        _looked[gate["_id"]] = gate.get("clock")
        return True


_looks_lock = threading.Lock()
_looked: dict[str, Any] = {}


def hand_off(gate: CounterDoc | None, *, skip: str | None = None) -> list[str]:
    """Wake the tickets the order rule picks for the gate's free slots. Never raises.

    A picked ticket whose wake-up nobody received keeps its ticket and its turn: "nobody
    received the PUBLISH" is also what a live waiter looks like during a Redis restart or
    its subscriber's reconnect, so only its keep-alive says its waiter is gone. A waiter
    that is really gone (``kill -9``) holds the turn until its ticket misses its keep-alive
    (half its TTL: the order rule then puts it after every fresh ticket, and the next poll
    of one takes the slot); the ticket is pruned once stale, like any other.

    Returns:
        The ids picked (``skip``, the caller's own ticket, is not woken).
    """
    if not shapes.has_waiters(gate) or gate is None or gate.get("clock") is None:
        return []
    if backlog.due(gate):
        # The head emptied to half: bring in whom the order rule picks next from the backlog.
        gate = backlog.safe_promote(gate) or gate
    try:
        picked = order.next_grants(gate, gate["clock"])
        # Book the freed slots for the picks that can take them in one update (the direct
        # hand-off); the others are woken and book themselves.
        rest, _ = grants.hand_over(gate, [t for t in picked if t != skip])
        unheard = wake(gate, rest)
        if unheard:
            log.debug("hand-off on %s: nobody received the wake-up of %s; they find their turn by polling",
                      gate["_id"], unheard)
        if not picked and not is_full(gate) and not order.stale_ids(gate, gate["clock"]):
            # Free slots, live tickets, yet nobody fits: the entries say a tenant holds what
            # maybe nobody holds any more. Check them (throttled); a repair hands off itself.
            repair(gate, gate["clock"])
    except pymongo.errors.PyMongoError as exc:
        log.info("hand-off on %s failed (%s); waiters find their turn by polling", gate["_id"], exc)
        return []
    return picked


def give_back(keys: list[str], booking: str, *, hold_ms: float | None = None,
              more: dict[str, Any] | None = None, fence: tuple[str, str] | None = None) -> CounterDoc | None:
    """Return a holder's slots and hand the freed gate slot to the next ticket; ``hold_ms``
    (how long the slot was held) is kept on the gate for wait estimates, and ``more``
    (update operators: how the holder's own wait estimate came out) goes with it.
    ``fence``: (counter key, ``fence.sN``) the booking recorded and will book again: that
    counter's pull clears it (:func:`leases.store.counter_commands.pull`); it goes the plain
    way, which carries it.

    Raises:
        pymongo.errors.PyMongoError: the store failed part-way (repair returns the rest).
    """
    from . import estimates

    record = estimates.merged(estimates.hold_update(hold_ms), more)
    undone = False
    if keys and fence is None and queue_likely(keys[-1]):
        # Tickets were waiting a moment ago: return the slots and grant the gate's in one
        # command (a lease with narrower levels: one bulk that also returns those and books
        # the ticket's).
        swapped = grants.hand_back(keys[-1], booking, record, narrow=keys[:-1])
        if swapped is not None and swapped is not grants.UNDONE:
            note_queue(swapped)
            return swapped
        undone = swapped is grants.UNDONE
    gate = slots.give_back(keys, booking, record=record, fence=fence)
    if gate is None and undone:
        # The grant was undone after the swap had taken this entry off the gate: the slot is
        # free and nobody was told; hand it off from the gate as it is now.
        gate = read_gate(keys[-1])
    note_queue(gate)
    hand_off(gate)
    return gate


def repair(counter: CounterDoc, now: datetime) -> bool:
    """Return the slots of a full counter that no live holder books; at most one process
    checks a counter per ``repair_interval_ms`` (a conditional claim on ``checkedAt``).

    Entries whose holder document is gone — or was written again since, by a new attempt
    under the same token — are pulled by value (a crash between the delete and the
    decrement of a release, rollback or reap); holders past their TTL (a crash
    mid-acquire, or an idle holder) are reaped like the idle sweep does, handlers included;
    tickets granted a slot they did not claim within the claim window, whose process looks
    dead or that had the longest claim bound, are ended (no handler: they never held).

    Returns:
        True when at least one slot came back.

    Raises:
        RuntimeError: the engine is not imported (no holder end installed; importing
            ``leases`` installs it).
        pymongo.errors.PyMongoError: the store failed.
    """
    if _holder_end is None:
        raise RuntimeError("leases.queue.waiting: no holder end installed (import leases first)")
    checked = counter.get("checkedAt")
    interval = repair_interval_ms()
    if checked is not None and checked > now - timedelta(milliseconds=interval):
        return False
    # A claim is conditional on the check it replaces: once this process has sent one against
    # ``checked``, won or lost, another against it can only lose. (After a batch of newcomers
    # got the same gate back, each of them would send it.)
    mono = time.monotonic()
    tried = _repair_claimed.get(counter["_id"])
    # (Not against no check at all: a gate made again since — deleted by an operator — has none.)
    if tried is not None and checked is not None and tried[0] == checked and mono - tried[1] < interval / 1000.0:
        return False
    _repair_claimed[counter["_id"]] = (checked, mono)
    claim = store.counters().update_one(*commands.repair_claim(counter["_id"], checked))
    if not claim.matched_count:
        return False  # another process is checking it right now
    unclaimed = grants.unclaimed(counter, now)
    missing, expired, late = slots.orphans(counter.get("holders") or (), now, unclaimed,
                                           claiming=lambda token, holder: grants.may_still_claim(
                                               unclaimed[token], holder, now))
    freed = False
    for booking in missing:
        after = slots.pull_entry(counter["_id"], booking)
        if after is not None:
            freed = True
            # Also the harmless race with a release between its delete and its pull (the
            # releaser's pull then finds nothing): either way the slot is returned once. A
            # holder written again meanwhile books another value (its new attemptId).
            log.info("repair: %s held a slot for %s, whose holder is gone (or a later attempt); returned",
                     counter["_id"], entries.token_of(booking))
            hand_off(after)
    for token in late:
        # Granted a slot it never claimed (its waiter died or stalls past the claim window).
        freed = _holder_end(holder_commands.unclaimed(token), "idle") is not None or freed
    for token in expired:
        doc = _holder_end(commands.expired_holder(token, now), "idle")
        freed = freed or doc is not None
        # Like the idle sweep (leases.upkeep.reaper.reap): only a holder handed out (HELD)
        # has a consumer whose handler must clean up.
        if doc is not None and doc.get("state") == "HELD":
            listener.notify([RevokedHolder.from_doc(doc, "idle")])
    return freed


def is_full(counter: CounterDoc | None) -> bool:
    return counter is not None and int(counter.get("count", 0)) >= int(counter.get("cap", 0))


def safe_dequeue(gate_key: str, ticket_id: str) -> None:
    """Best effort: a ticket that cannot be removed goes stale within its TTL anyway."""
    try:
        dequeue(gate_key, ticket_id)
    except pymongo.errors.PyMongoError as exc:
        log.info("dequeue of %s failed (%s); it goes stale by itself", ticket_id, exc)
