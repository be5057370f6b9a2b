"""The acquisition funnel of one attempt: holder first, then one booking entry per level.

:class:`Attempt` writes its holder document (PENDING, server time, the counter ``keys`` it
sets out to book, a fresh ``attemptId``), pushes its booking entry onto each level's
counter narrow → wide with a conditional update (``count < cap``; at the gate only when
nobody queues or the order rule picked it), then marks the holder HELD. A full level
raises :class:`_Blocked` after giving back what this call took; a holder that vanished
mid-funnel raises :class:`_Vanished`. The entries name the token and the ``attemptId``, so
rollback, release, reap and repair pull them by value, each exactly once.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

from pymongo import ReturnDocument, UpdateOne

from .. import ids
from ..definitions import caps
from ..definitions.model import LeaseDefinition, LevelSpec
from ..queue import fences, shares, slots, waiting, wakeups
from ..store import batches, client as store, entries, holder_commands as commands, shapes
from ..store.documents import CounterDoc, TicketDoc
from ..store.shapes import new_ticket, ticket_in
from .intervals import choose_interval
from .lease import Lease
from .pausepoints import pause_point as _pause_point
from .request import LeaseRequest

log = logging.getLogger(__name__)


# _Blocked and _Vanished are control flow inside the engine package: no caller ever sees
# them (every error a caller gets is in leases.errors), hence the underscore.
class _Blocked(Exception):
    """A level had no room for this attempt (nothing of the attempt stays booked)."""

    def __init__(self, spec: LevelSpec, counter: CounterDoc | None):
        self.spec = spec
        self.counter = counter  # the blocking counter as read (None: not read)


class Attempt:
    """One acquisition: its holder document, its booking entry and its funnel."""

    def __init__(self, request: LeaseRequest, definition: LeaseDefinition, specs: list[LevelSpec], pod: str,
                 *, priority: tuple[int, str | None] | None = None):
        self.request = request
        self.definition = definition
        self.specs = specs
        self.pod = pod
        self.token = ids.new_token()
        self.attempt_id: str | None = None
        self.booking = ""
        self.named(slots.new_attempt_id())
        self.keys = [spec.key for spec in specs]
        self.gate = specs[-1]
        self.fence_spec = fences.spec_of(definition, specs)
        self.acquired_at: datetime | None = None
        self.created_at = 0.0  # monotonic, when the holder document was (re)written
        self.interval_seconds: int | None = None
        self.written_at: datetime | None = None  # MongoDB's clock then: a (re)queued ticket is seen then
        self.holder_expires: datetime | None = None  # the holder's deadline as last written
        self.wait_covered = False  # whether the holder's deadline, as written, covers the wait
        # (rank, class): resolved once from the definition, carried in the ticket; a resumed
        # ticket brings the one it queued with (``priority``).
        self.priority: tuple[int, str | None] = (
            priority if priority is not None else definition.priority_of(request.tenant_id, request.priority))

    def named(self, attempt_id: str | None) -> None:
        """Book from now on as the holder written with ``attempt_id`` (its entries name it)."""
        self.attempt_id = attempt_id
        self.booking = slots.entry(self.request.tenant_id, self.request.project_id, self.request.user_id,
                                   self.token, attempt_id)

    def create_holder(self, wait_ms: int = 0, *, shared: bool = False) -> None:
        """Write the holder document (PENDING) on server time, so a waiter whose document
        was reaped while it waited writes it again before it books.

        Each writing is a new attempt (a new ``attemptId``, and the entries booked after it
        name it): whatever an earlier one left booked under this token is told apart, so
        repair pulling it by value never takes this attempt's slot. Only called while the
        attempt books nothing (its earlier entries were given back first).

        ``shared``: written with the holders that other threads of this process write at
        the same moment (:func:`holders_together`), for a request bound for a deep queue.

        Raises:
            pymongo.errors.PyMongoError: the store failed.
        """
        attempt_id = slots.new_attempt_id()
        self.named(attempt_id)
        self.wait_covered = wait_ms > 0
        interval = choose_interval(self.definition.ttl_seconds, self.request.interval_seconds)
        command = commands.holder_upsert(self.token, definition=self.definition, request=self.request, pod=self.pod,
                                         keys=self.keys, attempt_id=attempt_id, priority=self.priority[1],
                                         interval_seconds=interval, wait_ms=wait_ms, waker=wakeups.process_id())
        if shared:
            doc = batches.combine("holders", self.token, command, holders_together)
        else:
            doc = holders_together({self.token: command})[self.token]
        if doc is None:
            raise _Vanished()  # shared: reaped between its write and the read of it
        self.written(doc)
        self.interval_seconds = interval  # the server-issued interval, as the holder has it

    def written(self, doc: dict[str, Any]) -> None:
        """Note the holder document as its upsert returned it (``acquiredAt``, ``expiresAt``)."""
        self.acquired_at = self.acquired_at or doc["acquiredAt"]
        self.written_at = doc["acquiredAt"]
        expires = doc.get("expiresAt")
        self.holder_expires = expires if isinstance(expires, datetime) else None
        self.created_at = time.monotonic()

    def holder_until(self) -> datetime | None:
        """The deadline of this attempt's ``PENDING`` holder on MongoDB's clock, as this
        process last wrote it; None when not known. The idle sweep cannot take it before then."""
        return self.holder_expires

    def cover_wait(self, wait_ms: int, *, clock: datetime | None = None) -> bool:
        """Move the waiting holder's deadline to cover the rest of its wait: ``now + wait_ms +
        TTL`` (one command, once a wait: a waiter sends nothing more while it queues).

        A plain update, not a ``findAndModify`` (which the embedded server answers by scanning
        the collection: with 1,000 waiting holders, 6 ms instead of 0.3). The new deadline is
        then known from below: ``clock``, a time MongoDB's clock showed before this command
        (the gate as last read), plus the move — enough for :meth:`holder_until`, which only
        asks whether the holder outlives a claim window.

        Returns:
            False when the holder as this attempt wrote it is gone (reaped: this process
            stalled past its TTL); the caller queues again with a new one.

        Raises:
            pymongo.errors.PyMongoError: the store failed.
        """
        ms = self.definition.ttl_seconds * 1000 + max(0, wait_ms)
        if not store.holders().update_one(*commands.cover_wait(self.token, self.attempt_id, ms)).matched_count:
            return False
        if clock is not None:
            # The deadline never moves back, so the later of the two is still a lower bound.
            least = clock + timedelta(milliseconds=ms)
            self.holder_expires = max(least, self.holder_expires) if self.holder_expires else least
        self.wait_covered = True
        return True

    def keep_for_polls(self, keep_ms: int) -> None:
        """The ticket is kept for a client that polls it: its waiting holder lives to the poll
        deadline from now on (:func:`leases.store.holder_commands.poll_ticket`), granted
        between two polls or not.

        Raises:
            pymongo.errors.PyMongoError: the store failed.
        """
        store.holders().update_one(*commands.poll_ticket({"_id": self.token}, keep_ms))

    def book(self, *, privileged: bool, allow_queue: bool, charge: dict[str, Any] | None = None) -> Lease:
        """Take every level narrow → wide, then mark the holder HELD.

        ``privileged``: the order rule picked this ticket, so it may take the gate while
        others queue (and leaves the queue in the same update).

        Raises:
            _Blocked: a level had no room; what this call took is given back.
            pymongo.errors.PyMongoError: the store failed; the caller rolls back.
        """
        taken: list[str] = []
        if allow_queue and not privileged and (waiting.queue_likely(self.gate.key)
                                               or waiting.backlog_likely(self.gate.key)):
            # Tickets wait at the gate: the push would be refused, and narrower slots taken
            # on the way would only stand in the way of the waiter whose turn it is.
            raise _Blocked(self.gate, None)
        try:
            retried: set[str] = set()
            settled: set[str] = set()
            fence: fences.Plan | None = None
            read: CounterDoc | None = None
            proposals = 0  # fence proposals a fresh read showed room for, beyond the one retry
            while len(taken) < len(self.specs):
                rest = self.specs[len(taken):]
                keys = [spec.key for spec in rest]
                plan, plan_key = None, self.fence_spec.key
                if plan_key in keys:
                    # Proposed from the counter just read, else from this process's view of it.
                    plan = fences.plan(self.fence_spec, self.booking, floor=fences.floor_of(self.written_at),
                                       counter=read if read is not None and read.get("_id") == plan_key else None)
                booked = slots.take(rest, self.booking, self.definition.resource, gate_key=self.gate.key,
                                    privileged=privileged, ticket=self.token, charge=charge, fence=plan)
                if plan is not None and keys.index(plan.key) < booked:
                    fence = plan
                taken.extend(spec.key for spec in rest[:booked])
                if booked == len(rest):
                    break
                spec = rest[booked]
                is_gate = spec is self.gate
                if is_gate and allow_queue and not privileged:
                    raise _Blocked(spec, None)  # queueing reads the gate in the same command
                # Full, queued, or raced: a full level is diagnosed (and repaired) from this
                # document; a counter with room was created or freed meanwhile: try again.
                counter = read = waiting.read_gate(spec.key)
                fences.note(counter)
                if caps.pending(spec, counter) and spec.key not in settled:
                    # Born pending (cap 1) and its creator has not settled it (yet, or ever):
                    # stamp it from a fresh read ourselves and try again.
                    settled.add(spec.key)
                    caps.settle([spec], self.definition.resource)
                    continue
                if counter is not None and "holders" not in counter:  # written before entries
                    booked_by = slots.entries_by_key([spec.key])
                    slots.convert_legacy(counter, booked_by, safety=timedelta(0),
                                         now=counter["clock"] + timedelta(days=1))
                    read = {**counter, "holders": booked_by.get(spec.key, [])}  # as converted: propose from it
                elif plan is not None and spec.key == plan.key and proposals < fences.PROPOSALS and not (
                        waiting.is_full(counter) or counter is None or shapes.has_waiters(counter)):
                    # Room, but another booking took the proposed slot (or a newer generation
                    # landed) since this process looked: propose again from what was just read.
                    proposals += 1
                    continue
                elif spec.key in retried or waiting.is_full(counter) or (
                        is_gate and not privileged and counter is not None and shapes.has_waiters(counter)) or (
                        is_gate and privileged and counter is not None and not queued(counter, self.token)):
                    # A privileged take without its ticket queued (pruned) is refused for good.
                    raise _Blocked(spec, counter)
                retried.add(spec.key)
            _pause_point("acquire")
            held = store.holders().find_one_and_update(
                *commands.mark_held(self.token, keys=self.keys, ttl_seconds=self.definition.ttl_seconds,
                                    attempt_id=self.attempt_id, fence=fence.fence if fence else None),
                projection=commands.HELD_PROJECTION,
                return_document=ReturnDocument.AFTER,
            )
            if held is None:
                # Reaped while it stalled (or while it waited), or written again by another
                # attempt at the same ticket: its entries have no holder.
                raise _Vanished()
        except _Blocked:
            if taken:
                # The fence slot this booking recorded is freed with it: the same entry books
                # again at its turn, maybe on another slot (else both would count as occupied).
                recorded = fence if fence is not None and fence.key in taken else None
                self.give_back(taken, fence=recorded)
            raise
        return self.lease_of(held)

    def claim(self, booking: str, fence: str | None, at: datetime | None = None) -> Lease:
        """The freeing process booked ``booking`` for this attempt's ticket (the direct
        hand-off, :mod:`leases.queue.grants`): mark the holder HELD with ``fence``, one
        command, nothing booked here.

        ``at``: the grant's time on MongoDB's clock, as the granter's command saw it. With it
        the command is a plain update (it answers no document): the holder's TTL runs from
        ``at``, so the lease knows its deadline and server time without reading them back.

        Raises:
            _Vanished: the holder the entry names is gone or was written again (the claim
                window passed and the slot went on, or the ticket was queued again): the
                caller gives the entry back.
            pymongo.errors.PyMongoError: the store failed.
        """
        attempt_id = entries.attempt_of(booking)
        # Without them known (no grant time, or not this attempt's own write time and
        # interval) the claim asks for the document back.
        known = self.held_fields(at, fence)
        command = commands.mark_held(self.token, keys=self.keys, ttl_seconds=self.definition.ttl_seconds,
                                     attempt_id=attempt_id, fence=fence,
                                     granted_at=at if known is not None else None)
        held: dict[str, Any] | None
        if known is not None:
            if not store.holders().update_one(*command).matched_count:
                raise _Vanished()
            held = known
        else:
            held = store.holders().find_one_and_update(*command, projection=commands.HELD_PROJECTION,
                                                       return_document=ReturnDocument.AFTER)
        if held is None:
            raise _Vanished()
        self.named(attempt_id)
        return self.lease_of(held)

    def held_fields(self, at: datetime | None, fence: str | None) -> dict[str, Any] | None:
        """The holder's fields once a grant made at ``at`` (MongoDB's clock, as the granter's
        command saw it) is claimed with ``fence`` — the TTL runs from ``at`` — known without
        reading the document back; None without ``at``, or without this attempt's own write
        time and interval."""
        if at is None or self.written_at is None or self.interval_seconds is None:
            return None
        return {"expiresAt": at + timedelta(seconds=self.definition.ttl_seconds), "lastSeenAt": at,
                "acquiredAt": self.written_at, "intervalSeconds": self.interval_seconds, "fence": fence}

    def lease_of(self, held: dict[str, Any]) -> Lease:
        """This attempt's lease, told the holder fields ``held`` (those of :data:`leases.store.holder_commands.HELD_PROJECTION`)."""
        return Lease(self.token, self.definition, self.request, list(self.keys),
                     expires_at=held.get("expiresAt"), acquired_at=held.get("acquiredAt"),
                     last_seen_at=held.get("lastSeenAt"), interval_seconds=held.get("intervalSeconds"),
                     attempt_id=self.attempt_id, fence=held.get("fence"))

    def ticket(self, level: str, arrived: datetime | None, *, waker: str | None = None,
               seen: datetime | None = None) -> TicketDoc:
        """This attempt's ticket in the gate's queue, arrived at ``arrived`` and last kept
        alive at ``seen`` (default: ``arrived``), blocked last at ``level``; ``waker`` is its
        process's wake-up channel."""
        request = self.request
        caps = {spec.level: spec.cap for spec in self.specs if spec is not self.gate}
        ticket = new_ticket(token=self.token, tenant=request.tenant_id, project=request.project_id,
                            user=request.user_id, arrived=arrived, seen=seen, ttl_ms=waiting.ticket_ttl_ms(),
                            caps=caps, level=level, waker=waker, attempt=self.attempt_id)
        # Weights and class resolved now, so the order rule needs nothing but the gate.
        ticket.update(shares.ticket_fields(self.definition, request, self.priority))
        if caps and self.fence_spec is self.gate:
            # Whoever frees a gate slot can book these for it in the grant's own bulk (a fence
            # on a narrower level needs a view of that counter: such a ticket books itself).
            ticket["lv"] = [{"k": spec.key, "l": spec.level, "s": spec.scope, "c": spec.cap}
                            for spec in self.specs if spec is not self.gate]
            ticket["ln"], ticket["la"] = self.gate.lease, self.gate.loaded_at
        return ticket

    def give_back(self, keys: list[str], *, fence: fences.Plan | None = None) -> None:
        """Return this attempt's entries on ``keys``, and free the fence slot its booking
        recorded (``fence``), which the same entry may book again.

        Raises:
            pymongo.errors.PyMongoError: the store failed part-way (repair returns the rest).
        """
        waiting.give_back(keys, self.booking, fence=None if fence is None else fence.slot_on())

    def discard(self) -> None:
        """Drop the holder document of an attempt that books nothing (it gave back what it
        took when it found a level full)."""
        store.holders().delete_one(commands.discard(self.token))

    def rollback(self) -> None:
        """Undo the attempt: whoever deletes the holder returns every entry it may have."""
        deleted = store.holders().delete_one(commands.rollback(self.token)).deleted_count
        _pause_point("rollback")
        # Entries are pulled by value, so also when the holder was already reaped: nobody
        # else can pull an entry a second time.
        waiting.give_back(self.keys, self.booking)
        if not deleted:
            log.debug("rollback of %s: holder already gone", self.token)


def queued(gate: CounterDoc, token: str) -> bool:
    """Whether ``token``'s ticket is in the gate's queue (as the document says)."""
    return ticket_in(gate, token) is not None


class _Vanished(Exception):
    """The holder document disappeared mid-funnel (reaped during a stall)."""


def holders_together(upserts: dict[str, Any]) -> dict[str, Any]:
    """Write the holders ``upserts`` (token → :func:`leases.store.holder_commands.holder_upsert`)
    in one command and read back what each needs to know of its own (two commands for all:
    a ``findAndModify`` a holder would be one each).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    projection = {"acquiredAt": 1, "expiresAt": 1}
    if len(upserts) == 1:  # alone: one command, as it would have been
        ((token, (query, update)),) = upserts.items()
        return {token: store.holders().find_one_and_update(query, update, upsert=True, projection=projection,
                                                           return_document=ReturnDocument.AFTER)}
    store.holders().bulk_write([UpdateOne(query, update, upsert=True) for query, update in upserts.values()],
                               ordered=False)
    return {doc["_id"]: doc for doc in store.holders().find({"_id": {"$in": list(upserts)}}, projection)}


def deep_queue_expected(attempt: Attempt, wait_ms: int) -> bool:
    """Whether ``attempt`` will most likely wait in the backlog of a deep queue (see
    :func:`queue_expected`; its process saw the backlog in use within the last second): its
    holder and its ticket are then written with those of the other threads of this process
    that arrive at the same moment, outside the admission of steps."""
    return queue_expected(attempt, wait_ms) and waiting.backlog_likely(attempt.gate.key)


def queue_expected(attempt: Attempt, wait_ms: int) -> bool:
    """Whether ``attempt``, allowed to wait ``wait_ms``, will most likely queue, so that its
    holder is written to cover the wait at once: this process saw tickets waiting at the
    gate within the last second. Only for a lease capped at the gate alone: it books nothing
    before it queues, so a crash leaves no slot to a holder that lives as long as the wait
    (narrower levels are booked before the gate and given back when it blocks)."""
    return wait_ms > 0 and len(attempt.specs) == 1 and (
        waiting.queue_likely(attempt.gate.key) or waiting.backlog_likely(attempt.gate.key))


def first(attempt: Attempt, *, allow_queue: bool, wait_ms: int = 0, deep: bool = False) -> "Lease | _Blocked":
    """Write the attempt's holder and book every level: the lease, or where it blocked.

    ``wait_ms``: how long the request may wait. When this process saw tickets waiting at
    the gate within the last second, a request capped there alone will most likely queue: its holder is
    written with a deadline that covers the wait at once, so the waiter never moves it
    (:meth:`Attempt.cover_wait`) — 1,000 waiters that arrived together would otherwise all
    move theirs half a TTL later, together again.

    ``deep``: the request is bound for the backlog of a deep queue (:func:`deep_queue_expected`)
    and runs outside the admission of steps: its holder goes with those of this process's
    other newcomers, and it queues without trying the gate (a newcomer never books past the
    backlog).

    Raises:
        pymongo.errors.PyMongoError: the store failed (the caller's step rolls back).
        _Vanished: the holder disappeared before HELD.
    """
    if deep:
        attempt.create_holder(wait_ms, shared=True)
        return _Blocked(attempt.gate, None)
    queues = allow_queue and queue_expected(attempt, wait_ms)
    attempt.create_holder(wait_ms if queues else 0)
    try:
        return attempt.book(privileged=False, allow_queue=allow_queue)
    except _Blocked as blocked:
        return blocked

