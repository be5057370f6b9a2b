"""The consumer contract: ``acquire`` → ``Lease.update_payload`` / ``check`` → ``release``.

Acquisition funnel (no transactions needed): create the holder first (PENDING, server
time, with the counter ``keys`` it sets out to book), then per level in check order a
conditional push of its booking entry onto the counter, then mark it HELD. A counter
lists *which* holders book it (``leases.queue.slots``), so anything a crash leaves behind is
found by entry and returned exactly once.

A level found full makes the attempt give back what it took and wait in the queue of the
lease's gate counter (``leases.queue.waiting``): no barging, tenant-fair order (``leases.queue.order``),
woken when a slot is handed to it. Every step is bounded by one store timeout, rollback
included; what a failed step could not undo is left to repair, reap and reconcile.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pymongo
import pymongo.errors
from pymongo import ReturnDocument

from . import validation
from .conf import lease_settings
from .definitions import model as definitions, undefined
from .definitions.model import LeaseDefinition, LevelSpec
from .engine import commands, holders
from .engine.pausepoints import pause_point as _pause_point
from .errors import InvalidLeaseRequest, LeaseBusy, LeaseLost, LeaseUnavailable, UnknownLease
from .pods.identity import self_pod_id
from .queue import estimates, order, shares, slots, waiting, wakeups
from .revocation import handlers
from .store import client as store
from .store.documents import CounterDoc, TicketDoc
from .telemetry import history, metrics

log = logging.getLogger(__name__)

# A waiter whose turn it is but whose narrower level is full tries once more after this
# long: a newcomer of its tenant that booked that level on its way to the queue gives it
# back with its next command.
NARROW_RETRY_S = 0.02


def _bound() -> Any:
    """One store timeout for a whole step (an attempt with its rollback, one keep-alive):
    an outage ends the step within this bound instead of once per command."""
    from leases.conf import lease_settings

    return pymongo.timeout(int(lease_settings.MONGO_TIMEOUT_MS) / 1000.0)


@dataclass(frozen=True)
class LeaseRequest:
    """What a consumer asks for; ``lease`` (a name) or ``inline`` (a definition), not both.

    Attributes:
        type: the handler type (registered with :func:`leases.revocation.handlers.register_handler`).
        tenant_id, project_id: ``[A-Za-z0-9_][A-Za-z0-9_-]{0,63}``, not starting with ``_``.
        user_id: any Django username or email address (``alice.smith``, ``bob@example.com``),
            1 to 150 characters without whitespace or control characters; compared exactly.
        lease: the name of a defined lease. A name no layer defines acquires ``NOOP``, or
            raises :class:`~leases.errors.UnknownLease` with ``LEASES_UNDEFINED_LEASE = "error"``.
        wait_ms: can only *shorten* the wait: the request waits at most
            ``min(wait_ms, definition waitMs)`` (the definition's default is 0, no wait), so
            ``wait_ms=3000`` on a lease without ``waitMs`` answers :class:`LeaseBusy` at
            once. The operator's ``waitMs`` is the ceiling: a caller cannot hold workers or
            queue places longer than the lease allows. None: the definition's ``waitMs``.
        priority: a class of the definition's ``priorities``; None: its default class.
        interval_seconds: a proposed renewal interval; the server clamps it (HTTP).
    """

    type: str
    tenant_id: str
    project_id: str
    user_id: str
    lease: str | None = None
    inline: dict[str, Any] | None = None
    holder_ref: str = ""
    pod: str | None = None  # None: this process's pod; "": detached (HTTP clients), idle reap only
    pod_bound: bool = False
    wait_ms: int | None = None  # shortens the definition's waitMs, never lengthens it (docstring)
    priority: str | None = None  # a class of the definition's ``priorities``; None: its default
    interval_seconds: int | None = None  # proposed renewal interval; the server clamps it (HTTP)

    def validated(self) -> "LeaseRequest":
        """Check every field; returns self.

        Raises:
            InvalidLeaseRequest: a bad id, name or flag.
            UnknownLeaseType: ``type`` has no registered handler.
        """
        handlers.get_handler(self.type)
        # request_id: the reserved layer ids (_vance, _tenant) are no request's tenant or project.
        validation.request_id(self.tenant_id, "tenant id")
        validation.request_id(self.project_id, "project id")
        validation.user_id(self.user_id)
        validation.holder_ref(self.holder_ref)
        if self.pod:
            validation.pod_id(self.pod)
        elif self.pod is not None and self.pod != "":
            raise InvalidLeaseRequest("pod must be a pod id, '' (detached) or None (this pod)")
        if not isinstance(self.pod_bound, bool):
            raise InvalidLeaseRequest("pod_bound must be a bool")
        if self.lease is not None and self.inline is not None:
            raise InvalidLeaseRequest("give either lease (a name) or inline (a definition), not both")
        if self.lease is not None:
            validation.lease_name(self.lease)
        if self.wait_ms is not None and (isinstance(self.wait_ms, bool) or not isinstance(self.wait_ms, int) or self.wait_ms < 0):
            raise InvalidLeaseRequest("wait_ms must be a non-negative int")
        if self.priority is not None:
            validation.priority_class(self.priority)
            if self.inline is not None:
                # An inline definition names no classes: refused whether or not it has caps
                # (an uncapped one would otherwise answer NOOP, a capped one this error).
                raise InvalidLeaseRequest(f"inline lease definitions define no priority classes; got {self.priority!r}")
        if self.interval_seconds is not None and (isinstance(self.interval_seconds, bool) or not isinstance(
                self.interval_seconds, int) or self.interval_seconds < 1):
            raise InvalidLeaseRequest("interval_seconds must be a positive int")
        return self




class Lease:
    """A held lease. Use as a context manager or call :meth:`release` (idempotent)."""

    is_noop = False
    #: Seconds the wait estimate said this grant would take when the request queued (None:
    #: it did not queue, or the gate had no hold history yet).
    estimated_wait_s: float | None = None

    def __init__(self, token: str, definition: LeaseDefinition, request: LeaseRequest, levels: list[str],
                 expires_at: datetime | None = None, acquired_at: datetime | None = None,
                 last_seen_at: datetime | None = None, interval_seconds: int | None = None,
                 attempt_id: str | None = None):
        self.token = token
        self.attempt_id = attempt_id  # the holder's attemptId, named by its booking entries
        self.definition = definition
        self.request = request
        self.levels = levels
        self.expires_at = expires_at  # MongoDB's clock, as of the grant or the last renewal
        self.acquired_at = acquired_at
        self.last_seen_at = last_seen_at  # MongoDB's clock at the grant or the last renewal
        self.interval_seconds = interval_seconds  # the server-issued renewal interval
        self._released = False
        self._release_failed = False
        self._granted = time.monotonic()  # a duration for wait estimates, never a TTL

    @property
    def resource(self) -> str:
        return self.definition.resource

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.release()
        except LeaseUnavailable:
            if exc_type is None:
                raise
            # The body's own error matters more; the slot comes back through reap/repair.
            log.warning("release of %s failed after an error in the lease's block", self.token)

    def __repr__(self) -> str:
        return f"<Lease {self.definition.name} {self.token[:8]}… on {self.resource}>"

    def _scope(self) -> holders.Scope:
        return holders.scope(self.request.tenant_id, self.request.project_id)

    def _renew(self, payload: dict[str, Any] | None = None) -> None:
        doc = holders.renew(self.token, bound=self._scope(), payload=payload)
        self.expires_at, self.last_seen_at = doc["expiresAt"], doc["lastSeenAt"]

    def check(self) -> None:
        """Check-at-use and renew: call at every usage step; the TTL runs from here.

        The renewal rule is the one of every path (:func:`leases.engine.holders.renew`): a lease
        past its deadline is not revived but ends (``LeaseExpired``, reaped now).

        Raises:
            LeaseLost: the lease ended: ``LeaseExpired`` (reaped, revoked, released — the
                reason says which) or ``StaleLease`` (the store forgot it).
            LeaseUnavailable: the store is unreachable.
        """
        if self._released:
            metrics.CHECK.labels(resource=metrics.resource_tag(self.resource), outcome="lost").inc()
            raise LeaseLost(f"lease {self.token} was released")
        self._renew()

    def update_payload(self, payload: dict[str, Any]) -> None:
        """Replace the payload the revocation handler will get (also a renewal).

        Raises:
            InvalidLeaseRequest: the payload is not a safe JSON-like dict.
            LeaseLost: the lease is no longer held (``LeaseExpired`` / ``StaleLease``).
            LeaseUnavailable: the store is unreachable.
        """
        validation.payload(payload)
        if self._released:
            raise LeaseLost(f"lease {self.token} was released")
        self._renew(payload)

    def release(self) -> bool:
        """Give the slots back. Idempotent; True only for the call that actually released.

        A regular release never calls the type's handler: the holder cleans up itself.

        Raises:
            LeaseUnavailable: the store failed before the holder was deleted; nothing was
                released and calling ``release()`` again retries it.
        """
        tag = metrics.resource_tag(self.resource)
        if self._released:
            metrics.RELEASE.labels(resource=tag, outcome="already-released").inc()
            return False
        try:
            held_ms = (time.monotonic() - self._granted) * 1000
            doc = holders.release(self.token, bound=self._scope(), hold_ms=held_ms)
            if doc is None and self._release_failed:
                # The failed call's delete may have landed after all (a timeout does not say):
                # return our own entries by value; nobody can pull one twice.
                gate = waiting.give_back(list(self.levels), self._booking(), hold_ms=held_ms)
                self._released = True
                return gate is not None
        except pymongo.errors.PyMongoError as exc:
            self._release_failed = True
            metrics.RELEASE.labels(resource=tag, outcome="error").inc()
            raise LeaseUnavailable(store.unreachable("lease store", exc, " during release")) from None
        self._released = True
        if doc is None:
            metrics.RELEASE.labels(resource=tag, outcome="already-released").inc()
        return doc is not None

    def _booking(self) -> str:
        r = self.request
        return slots.entry(r.tenant_id, r.project_id, r.user_id, self.token, self.attempt_id)


class _NoopLease:
    """The lease of an unlimited resource: every operation succeeds without MongoDB."""

    is_noop = True
    token = None
    resource = None
    definition = None

    def __enter__(self) -> "_NoopLease":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def check(self) -> None:
        return None

    def update_payload(self, payload: dict[str, Any]) -> None:
        validation.payload(payload)

    def release(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<Lease NOOP>"


NOOP = _NoopLease()




def release_token(token: str, *, resource: str | None = None) -> bool:
    """Release the holder ``token``.

    Returns:
        True if this call deleted the holder, False if it was already gone.

    Raises:
        LeaseUnavailable: the store failed before the holder was deleted (retryable).
    """
    try:
        doc = holders.release(token)
    except pymongo.errors.PyMongoError as exc:
        metrics.RELEASE.labels(resource=metrics.resource_tag(resource or "unknown"), outcome="error").inc()
        raise LeaseUnavailable(store.unreachable("lease store", exc, " during release")) from None
    if doc is None:
        metrics.RELEASE.labels(resource=metrics.resource_tag(resource or "unknown"), outcome="already-released").inc()
        return False
    return True


class _Blocked(Exception):
    """A level had no room for this attempt (nothing of the attempt stays booked)."""

    def __init__(self, spec: LevelSpec, counter: CounterDoc | None):
        self.spec = spec
        self.counter = counter  # the blocking counter as read (None: not read)


class _Attempt:
    """One acquisition: its holder document, its booking entry and its funnel."""

    def __init__(self, request: LeaseRequest, definition: LeaseDefinition, specs: list[LevelSpec], pod: str,
                 *, priority: tuple[int, str | None] | None = None):
        self.request = request
        self.definition = definition
        self.specs = specs
        self.pod = pod
        self.token = secrets.token_urlsafe(24)
        self.attempt_id: str | None = None
        self.booking = ""
        self.named(slots.new_attempt_id())
        self.keys = [spec.key for spec in specs]
        self.gate = specs[-1]
        self.acquired_at: datetime | None = None
        self.created_at = 0.0  # monotonic, when the holder document was (re)written
        self.written_at: datetime | None = None  # MongoDB's clock then: a (re)queued ticket is seen then
        # (rank, class): resolved once from the definition, carried in the ticket; a resumed
        # ticket brings the one it queued with (``priority``).
        self.priority: tuple[int, str | None] = (
            priority if priority is not None else definition.priority_of(request.tenant_id, request.priority))

    def named(self, attempt_id: str | None) -> None:
        """Book from now on as the holder written with ``attempt_id`` (its entries name it)."""
        self.attempt_id = attempt_id
        self.booking = slots.entry(self.request.tenant_id, self.request.project_id, self.request.user_id,
                                   self.token, attempt_id)

    def create_holder(self) -> None:
        """Write the holder document (PENDING) on server time, so a waiter whose document
        was reaped while it waited writes it again before it books.

        Each writing is a new attempt (a new ``attemptId``, and the entries booked after it
        name it): whatever an earlier one left booked under this token is told apart, so
        repair pulling it by value never takes this attempt's slot. Only called while the
        attempt books nothing (its earlier entries were given back first).
        """
        attempt_id = slots.new_attempt_id()
        self.named(attempt_id)
        doc = store.holders().find_one_and_update(
            *commands.holder_upsert(self.token, definition=self.definition, request=self.request, pod=self.pod,
                                    keys=self.keys, attempt_id=attempt_id, priority=self.priority[1]),
            upsert=True,
            projection={"acquiredAt": 1},
            return_document=ReturnDocument.AFTER,
        )
        assert doc is not None  # an upsert returning the document after always has one
        self.acquired_at = self.acquired_at or doc["acquiredAt"]
        self.written_at = doc["acquiredAt"]
        self.created_at = time.monotonic()

    def book(self, *, privileged: bool, allow_queue: bool, charge: dict[str, Any] | None = None) -> Lease:
        """Take every level narrow → wide, then mark the holder HELD.

        ``privileged``: the order rule picked this ticket, so it may take the gate while
        others queue (and leaves the queue in the same update).

        Raises:
            _Blocked: a level had no room; what this call took is given back.
            pymongo.errors.PyMongoError: the store failed; the caller rolls back.
        """
        taken: list[str] = []
        if allow_queue and not privileged and waiting.queue_likely(self.gate.key):
            # Tickets wait at the gate: the push would be refused, and narrower slots taken
            # on the way would only stand in the way of the waiter whose turn it is.
            raise _Blocked(self.gate, None)
        try:
            retried: set[str] = set()
            while len(taken) < len(self.specs):
                rest = self.specs[len(taken):]
                booked = slots.take(rest, self.booking, self.definition.resource, gate_key=self.gate.key,
                                    privileged=privileged, ticket=self.token, charge=charge)
                taken.extend(spec.key for spec in rest[:booked])
                if booked == len(rest):
                    break
                spec = rest[booked]
                is_gate = spec is self.gate
                if is_gate and allow_queue and not privileged:
                    raise _Blocked(spec, None)  # queueing reads the gate in the same command
                # Full, queued, or raced: a full level is diagnosed (and repaired) from this
                # document; a counter with room was created or freed meanwhile: try again.
                counter = waiting.read_gate(spec.key)
                if counter is not None and "holders" not in counter:  # written before entries
                    slots.convert_legacy(counter, slots.entries_by_key([spec.key]),
                                         safety=timedelta(0), now=counter["clock"] + timedelta(days=1))
                elif spec.key in retried or waiting.is_full(counter) or (
                        is_gate and not privileged and counter is not None and counter.get("queue")) or (
                        is_gate and privileged and counter is not None and not _queued(counter, self.token)):
                    # A privileged take without its ticket queued (pruned) is refused for good.
                    raise _Blocked(spec, counter)
                retried.add(spec.key)
            _pause_point("acquire")
            held = store.holders().find_one_and_update(
                *commands.mark_held(self.token, keys=self.keys, ttl_seconds=self.definition.ttl_seconds,
                                    attempt_id=self.attempt_id),
                projection={"expiresAt": 1, "acquiredAt": 1, "lastSeenAt": 1, "intervalSeconds": 1},
                return_document=ReturnDocument.AFTER,
            )
            if held is None:
                # Reaped while it stalled (or while it waited), or written again by another
                # attempt at the same ticket: its entries have no holder.
                raise _Vanished()
        except _Blocked:
            if taken:
                self.give_back(taken)
            raise
        return Lease(self.token, self.definition, self.request, list(self.keys),
                     expires_at=held.get("expiresAt"), acquired_at=held.get("acquiredAt"),
                     last_seen_at=held.get("lastSeenAt"), interval_seconds=held.get("intervalSeconds"),
                     attempt_id=self.attempt_id)

    def ticket(self, level: str, arrived: datetime | None, *, waker: str | None = None,
               seen: datetime | None = None) -> TicketDoc:
        """This attempt's ticket in the gate's queue, arrived at ``arrived`` and last kept
        alive at ``seen`` (default: ``arrived``), blocked last at ``level``; ``waker`` is its
        process's wake-up channel."""
        request = self.request
        caps = {spec.level: spec.cap for spec in self.specs if spec is not self.gate}
        ticket: TicketDoc = {"id": self.token, "t": request.tenant_id, "p": request.project_id, "u": request.user_id,
                  "at": arrived, "seen": seen or arrived, "ttl": waiting.ticket_ttl_ms(), "caps": caps,
                  "lvl": level, "w": waker}
        # Weights and class resolved now, so the order rule needs nothing but the gate.
        ticket.update(shares.ticket_fields(self.definition, request, self.priority))
        return ticket

    def give_back(self, keys: list[str]) -> None:
        waiting.give_back(keys, self.booking)

    def discard(self) -> None:
        """Drop the holder document of an attempt that books nothing (it gave back what it
        took when it found a level full)."""
        store.holders().delete_one({"_id": self.token})

    def rollback(self) -> None:
        """Undo the attempt: whoever deletes the holder returns every entry it may have."""
        doc = store.holders().find_one_and_delete({"_id": self.token}, projection={"_id": 1})
        _pause_point("rollback")
        # Entries are pulled by value, so also when the holder was already reaped: nobody
        # else can pull an entry a second time.
        waiting.give_back(self.keys, self.booking)
        if doc is None:
            log.debug("rollback of %s: holder already gone", self.token)


def _queued(gate: CounterDoc, token: str) -> bool:
    """Whether ``token``'s ticket is in the gate's queue (as the document says)."""
    return any(t.get("id") == token for t in gate.get("queue") or ())


class _Vanished(Exception):
    """The holder document disappeared mid-funnel (reaped during a stall)."""


def _busy(attempt: _Attempt, blocked: _Blocked, *, position: int | None = None,
          gate: CounterDoc | None = None, placed: bool = True) -> LeaseBusy:
    """The Busy answer of ``attempt``, blocked at ``blocked``; ``gate`` is the gate as last
    seen (default: the blocking counter, when that is the gate) and ``placed`` whether the
    attempt still has its place there, for the retry delay (:func:`_retry_after_s`)."""
    counter = blocked.counter
    count = None if counter is None else int(counter.get("count", 0))
    return LeaseBusy(resource=attempt.definition.resource, level=blocked.spec.level, scope=blocked.spec.scope,
                     count=count, cap=blocked.spec.cap, position=position,
                     retry_after=_retry_after_s(attempt, counter if gate is None else gate, placed=placed))


def _retry_after_s(attempt: _Attempt, gate: CounterDoc | None, *, placed: bool = True) -> float:
    """Suggested seconds before ``attempt`` asks again (``LeaseBusy.retry_after``), from
    the gate document in hand (no command of its own); never below
    ``LEASES_RETRY_AFTER_MIN_MS`` (100 ms), so a caller that sleeps it does not spin.

    The queue's estimate of the attempt's turn (:mod:`leases.queue.estimates`): its own ticket's
    when it is queued and live (and ``placed``: it has not lost its place), else that of a
    newcomer of its class at the back of the queue (a request that did not wait, or whose
    kept ticket was lost). When the walk does not reach it, the gate's typical hold. The
    walk assumes the holders release within the typical hold; once every current holder
    has held longer than that, their remaining expected hold
    (:func:`leases.queue.estimates.overdue_hold_ms`) is the least wait. Without a gate document (a
    narrower level blocked: its counter keeps no holds) or any hold on record at the gate,
    ``LeaseBusy.DEFAULT_RETRY_AFTER_S`` (1 s, as HTTP's ``Retry-After``).
    """
    from leases.conf import lease_settings

    floor = int(lease_settings.RETRY_AFTER_MIN_MS) / 1000.0
    unknown = max(LeaseBusy.DEFAULT_RETRY_AFTER_S, floor)
    if gate is None or gate.get("_id") != attempt.gate.key or gate.get("clock") is None:
        return unknown
    now = gate["clock"]
    ms = estimates.wait_ms(gate, attempt.token, now) if placed else None
    if ms is None:
        queue = [t for t in gate.get("queue") or () if t.get("id") != attempt.token]
        newcomer = attempt.ticket(attempt.gate.level, now)
        ms = estimates.wait_ms({**gate, "queue": [*queue, newcomer]}, attempt.token, now)
    if ms is None:
        ms = estimates.mean_hold_ms(gate)
    if ms is None:
        return unknown
    ms = max(ms, estimates.overdue_hold_ms(gate, now) or 0.0)
    return round(max(ms / 1000.0, floor), 3)


def resolve_definition(request: LeaseRequest) -> LeaseDefinition | None:
    """The definition an acquisition of ``request`` uses; ``None`` when no lease is referenced.

    Raises:
        InvalidDefinition: a refused inline definition.
        LeaseUnavailable: broken or unreadable configuration.
    """
    if request.inline is not None:
        return definitions.inline_definition(request.inline, request.tenant_id, request.project_id)
    if request.lease is None or request.lease == "":
        return None
    return definitions.resolve(request.lease, request.tenant_id, request.project_id)


def acquire(request: LeaseRequest) -> Lease | _NoopLease:
    """Acquire a slot at every capped level of the request's lease, waiting up to ``waitMs``.

    A level found full puts the request in the resource's queue (see ``leases.queue.waiting``);
    it is granted in the order rule's turn or ends with ``LeaseBusy`` at the wait bound.

    Returns:
        A :class:`Lease`, or ``NOOP`` (no MongoDB traffic) when no lease is referenced or the
        definition has no caps.

    Raises:
        InvalidLeaseRequest: bad input (nothing written); ``UnknownLeaseType`` for a type
            without handler; ``InvalidDefinition`` for a refused inline definition.
        LeaseBusy: a level stayed full for the whole wait (with the level, occupancy and
            the place the request had in the queue).
        LeaseUnavailable: MongoDB unreachable or broken configuration (fail-closed); each
            store step ends within ``LEASES_MONGO_TIMEOUT_MS``.
    """
    lease = _acquire_request(request, keep_ms=None)
    assert not isinstance(lease, Ticket)  # only a kept place (keep_ms) answers a ticket
    return lease


def _acquire_request(request: LeaseRequest, *, keep_ms: int | None) -> "Lease | _NoopLease | Ticket":
    prepared = prepare(request)
    if prepared is None:
        return NOOP
    attempt, wait_ms = prepared
    started = time.monotonic()
    with outcome(attempt) as record:
        return record(_acquire(attempt, wait_ms, started, keep_ms))


def prepare(request: LeaseRequest) -> "tuple[_Attempt, int] | None":
    """Validate the request and resolve its definition: the attempt and its wait bound, or
    None for NOOP (no lease referenced, or no caps). Shared by the sync and async acquire.

    Raises:
        InvalidLeaseRequest, LeaseUnavailable: as :func:`acquire` (nothing written).
    """
    if not isinstance(request, LeaseRequest):
        raise InvalidLeaseRequest("acquire() takes a LeaseRequest")
    request.validated()
    try:
        definition = resolve_definition(request)
    except LeaseUnavailable:
        metrics.ACQUIRE.labels(resource=metrics.INLINE_RESOURCE_TAG if request.inline else metrics.UNDEFINED_TAG,
                               outcome="unavailable").inc()
        raise
    if definition is not None and definition.is_noop and definition.priorities and request.priority is not None:
        # Nothing waits here, but where the lease names classes a misspelt or forbidden one
        # must fail where it is written, not first on the day an operator adds a cap (no
        # command). A name no layer defines stays NOOP whatever the request says.
        definition.priority_of(request.tenant_id, request.priority)
    if definition is not None and not definition.defined:
        # A name no layer defines (a typo?): recorded for Insights and `lease undefined`
        # (rate-limited; a defined lease never gets here), then NOOP or refused per setting.
        undefined.record(definition.name, request.tenant_id, request.project_id)
        if lease_settings.UNDEFINED_LEASE != "noop":  # "error", or any bad value: fail closed
            raise UnknownLease(f"lease {definition.name!r} is not defined in any layer "
                               f"(LEASES_UNDEFINED_LEASE = {lease_settings.UNDEFINED_LEASE!r})")
    if definition is None or definition.is_noop:
        metrics.ACQUIRE.labels(resource=metrics.definition_tag(definition), outcome="noop").inc()
        return None
    specs = definition.level_specs(request.tenant_id, request.project_id, request.user_id)
    pod = self_pod_id() if request.pod is None else request.pod
    wait_ms = definition.wait_ms if request.wait_ms is None else min(request.wait_ms, definition.wait_ms)
    return _Attempt(request, definition, specs, pod), wait_ms


@contextmanager
def outcome(attempt: "_Attempt") -> Iterator[Any]:
    """Count an acquisition's outcome (metrics, history); yields ``record(result)`` for a
    result that came back, and counts Busy and Unavailable as they pass."""
    definition, request = attempt.definition, attempt.request
    tag = metrics.resource_tag(definition.resource)

    def record(result: Any) -> Any:
        if isinstance(result, Lease):
            metrics.ACQUIRE.labels(resource=tag, outcome="success").inc()
            history.grant(definition.resource, request.tenant_id)
        return result

    try:
        yield record
    except LeaseBusy:
        metrics.ACQUIRE.labels(resource=tag, outcome="busy").inc()
        history.busy(definition.resource, request.tenant_id)
        raise
    except LeaseUnavailable:
        metrics.ACQUIRE.labels(resource=tag, outcome="unavailable").inc()
        raise


def _step(attempt: _Attempt, fn: Any) -> Any:
    """Run one store step under one bound; on a store failure roll the attempt back (same
    bound: what it cannot undo is left to reap and repair) and answer LeaseUnavailable."""
    try:
        with _bound():
            try:
                return fn()
            except (pymongo.errors.PyMongoError, _Vanished) as exc:
                try:
                    attempt.rollback()
                except pymongo.errors.PyMongoError as again:
                    log.warning("rollback of %s failed (%s); reap and repair clean up", attempt.token, again)
                if isinstance(exc, _Vanished):
                    raise LeaseUnavailable(f"lease attempt on {attempt.definition.resource} was reaped mid-acquire") from None
                raise
    except pymongo.errors.PyMongoError as exc:
        log.warning("store step failed: %r", exc)
        raise LeaseUnavailable(f"lease store error at {store.where()} mid-acquire: {exc.__class__.__name__}") from None


def _acquire(attempt: _Attempt, wait_ms: int, started: float, keep_ms: int | None) -> "Lease | Ticket":
    deadline = started + wait_ms / 1000.0
    queues = wait_ms > 0 or keep_ms is not None
    result = _step(attempt, lambda: _first(attempt, allow_queue=queues))
    if isinstance(result, Lease):
        return result
    if not queues:
        return _step(attempt, lambda: _fail_fast(attempt, result))
    return _Waiter(attempt, deadline, started, keep_ms=keep_ms).wait(result)


def contended_steps(attempt: _Attempt, wait_ms: int, started: float,
                    event: threading.Event | None = None) -> Generator["tuple[threading.Event, float]", "bool | None", Lease]:
    """Acquire for an attempt whose uncontended try (the async executor's) found no room,
    as steps (see :meth:`_Waiter.steps`): the funnel once more with its diagnosis and
    repair, then the queue, up to ``wait_ms`` from ``started``.

    Raises:
        LeaseBusy, LeaseUnavailable: as :func:`acquire`.
    """
    queues = wait_ms > 0

    def again() -> "Lease | _Blocked":
        # The uncontended try wrote the holder document a moment ago.
        try:
            return attempt.book(privileged=False, allow_queue=queues)
        except _Blocked as blocked:
            return blocked

    result = _step(attempt, again)
    if isinstance(result, Lease):
        return result
    if not queues:
        return _step(attempt, lambda: _fail_fast(attempt, result))
    waiter = _Waiter(attempt, started + wait_ms / 1000.0, started)
    lease = yield from waiter.steps(result, event)
    assert isinstance(lease, Lease)  # without keep_ms the wait never ends in a ticket
    return lease


def _fail_fast(attempt: _Attempt, blocked: _Blocked) -> Lease:
    """No wait allowed: repair a full counter once (a leaked slot must not turn a free
    resource into Busy) or drop stale tickets at the gate, try again if that freed
    something, else answer Busy."""
    counter = blocked.counter
    if counter is not None:
        retry = False
        if blocked.spec is attempt.gate and order.stale_ids(counter, counter["clock"]):
            counter = waiting.prune(counter)
            retry = not counter.get("queue") and not waiting.is_full(counter)
        if waiting.is_full(counter) or (blocked.spec is attempt.gate and counter.get("queue")):
            retry = waiting.repair(counter, counter["clock"])
        if retry:
            try:
                return attempt.book(privileged=False, allow_queue=False)
            except _Blocked as again:
                blocked = again
    attempt.discard()
    raise _busy(attempt, blocked)


class _Waiter:
    """A request waiting in the gate's queue until granted or out of time."""

    def __init__(self, attempt: _Attempt, deadline: float, started: float, keep_ms: int | None = None):
        self.keep_ms = keep_ms  # on timeout keep the ticket (HTTP clients poll it) this long
        self.attempt = attempt
        self.deadline = deadline
        self.started = started
        self.gate_key = attempt.gate.key
        self.blocked: _Blocked | None = None
        self.gate: CounterDoc | None = None
        self.tag = metrics.resource_tag(attempt.definition.resource)
        self.estimate_s: float | None = None
        self.raw_estimate_ms: float | None = None  # uncalibrated, for the gate's record
        self.queued_at = 0.0  # monotonic
        self.sat_out = False  # our last turn found a narrower level full (see order.sits_out)

    def _ticket(self) -> TicketDoc:
        # Arrived when the request first asked (its place among its tenant's tickets), but
        # alive as of the holder document's last write (MongoDB's clock): a ticket queued
        # again after a stall past the ticket TTL must not be born stale, or the next reader
        # (the waiter itself) prunes it at once, again and again — the waiter would never
        # be seen in the queue while the others take every slot.
        return self.attempt.ticket(self.blocked.spec.level if self.blocked else self.attempt.gate.level,
                                   self.attempt.acquired_at, waker=wakeups.process_id(),
                                   seen=self.attempt.written_at)

    def wait(self, blocked: _Blocked) -> "Lease | Ticket":
        """Wait in the queue until granted, out of time (Busy) or kept as a ticket.

        Raises:
            LeaseBusy, LeaseUnavailable: as :func:`acquire`.
        """
        steps = self.steps(blocked)
        woken: bool | None = None
        try:
            while True:
                try:
                    event, timeout = steps.send(woken)
                except StopIteration as done:
                    return done.value
                woken = event.wait(timeout)
        finally:
            steps.close()

    def steps(self, blocked: _Blocked, event: threading.Event | None = None) -> Generator[
            "tuple[threading.Event, float]", "bool | None", "Lease | Ticket"]:
        """The waiting as steps: each ``yield (event, timeout)`` asks the driver to sleep until
        the wake-up ``event`` is set or ``timeout`` passes, and to send back whether it was
        woken. The store work between two yields is blocking; the async executor runs it in
        a thread and sleeps on the event loop. Closed at a yield (the caller went away), it
        leaves the queue and drops its holder document.
        """
        counter = blocked.counter
        if blocked.spec is not self.attempt.gate and counter is not None and waiting.is_full(counter) and _step(
                self.attempt, lambda: waiting.repair(counter, counter["clock"])):
            # A slot nobody booked came back: try again before queueing.
            lease = _step(self.attempt, lambda: _first(self.attempt, allow_queue=True))
            if isinstance(lease, Lease):
                return lease
            blocked = lease
        self.blocked = blocked
        event = wakeups.register(self.attempt.token, event)
        metrics.WAITING.labels(resource=self.tag).inc()
        outcome = "error"
        try:
            self.gate = _step(self.attempt, self._enqueue)
            self.queued_at = time.monotonic()
            if self.gate is not None:
                self.raw_estimate_ms = estimates.raw_wait_ms(self.gate, self.attempt.token, self.gate["clock"])
                if self.raw_estimate_ms is not None:
                    self.estimate_s = self.raw_estimate_ms * estimates.calibration(self.gate) / 1000.0
            while True:
                lease = self._decide()
                if lease is not None:
                    outcome = "granted"
                    return lease
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    if self.keep_ms is not None:
                        outcome = "ticket"
                        return self._keep_ticket()
                    outcome = "timeout"
                    raise self._give_up()
                period = waiting.poll_ms() / 1000.0 * random.uniform(1.0, 1.25)
                if self.sat_out:
                    # Sitting out passes the turn only for a moment (the younger tickets of
                    # our tenant wait behind us meanwhile): look again as soon as it ends.
                    period = min(period, order.BLOCKED_PAUSE.total_seconds() * random.uniform(1.05, 1.2))
                    self.sat_out = False
                try:
                    woken = yield event, min(remaining, period)
                except GeneratorExit:
                    outcome = "cancelled"
                    self._give_up()
                    raise
                event.clear()
                if woken:
                    lease = self._try(woken=True)
                    if lease is not None:
                        outcome = "granted"
                        return lease
                self.gate = _step(self.attempt, self._keep_alive)
        finally:
            wakeups.unregister(self.attempt.token)
            metrics.WAITING.labels(resource=self.tag).dec()
            metrics.WAIT_SECONDS.labels(resource=self.tag).observe(time.monotonic() - self.started)
            if outcome != "ticket":
                # A kept ticket's wait has not ended: the poll that grants it records it
                # (resume), from its arrival to its grant.
                shares.observe_wait(self.attempt.definition, self.attempt.priority[1], time.monotonic() - self.started)
            history.waited(self, outcome, time.monotonic() - self.started)
            metrics.WAIT_OUTCOME.labels(resource=self.tag, outcome=outcome).inc()

    def _enqueue(self) -> CounterDoc | None:
        gate = waiting.enqueue(self.gate_key, self._ticket())
        if gate is None:  # first use of the gate: create it, then queue
            slots.create(self.attempt.gate, self.attempt.definition.resource)
            gate = waiting.enqueue(self.gate_key, self._ticket())
        return gate

    def _keep_alive(self) -> CounterDoc | None:
        gate = waiting.keep_alive(self.gate_key, self.attempt.token)
        if gate is None:
            # Pruned as stale (this process stalled past the ticket TTL, and its holder
            # document went with it): write both again, at the back of the queue.
            self.attempt.create_holder()
            gate = self._enqueue()
        return gate

    def _keep_ticket(self) -> "Ticket":
        """Out of wait time, but the caller keeps its place: stretch the ticket's TTL to the
        poll bound and answer where it stands."""
        keep_ms = int(self.keep_ms or 0)
        gate = _step(self.attempt, lambda: waiting.keep_alive(self.gate_key, self.attempt.token, ttl_ms=keep_ms))
        if gate is None:
            # Its place is lost: the delay is a newcomer's, from the gate as last seen.
            raise _busy(self.attempt, self.blocked or _Blocked(self.attempt.gate, None), gate=self.gate,
                        placed=False)
        return Ticket.of(self.attempt.token, self.attempt.definition, gate, self.blocked)

    def _decide(self, *, again: bool = True) -> Lease | None:
        """Act on the gate as last seen: prune stale tickets, take our turn, wake whoever's
        turn it is, or repair a gate whose entries block everyone (then decide once more)."""
        gate = self.gate
        if gate is None:
            return None
        waiting.note_queue(gate)
        now = gate["clock"]
        if order.stale_ids(gate, now):
            gate = self.gate = _step(self.attempt, lambda: waiting.prune(gate))
        picked = order.next_grants(gate, now)
        if self.attempt.token in picked:
            waiting.wake(gate, [t for t in picked if t != self.attempt.token])
            lease = self._try(woken=False)
            if lease is None:
                # We sat out (a narrower level was full): pass the turn on right away.
                waiting.hand_off(self.gate, skip=self.attempt.token)
            return lease
        if picked:
            # Their waker may have died, or their process: wake again (dropping the dead).
            waiting.hand_off(gate, skip=self.attempt.token)
        elif _step(self.attempt, lambda: waiting.repair(gate, now)):
            # Full, or free but nobody fits: either way entries decide, so make sure each
            # has a live holder (throttled to one check per interval for all processes).
            self.gate = _step(self.attempt, lambda: waiting.read_gate(self.gate_key))
            if again:
                return self._decide(again=False)
        return None

    def _try(self, *, woken: bool) -> Lease | None:
        """Book with the gate privilege (our turn); a narrower level that is full sends us
        back to wait and passes the turn on."""
        attempt = self.attempt

        def run() -> Lease | None:
            # The holder document may have been reaped during a long wait: write it again.
            if time.monotonic() - attempt.created_at > attempt.definition.ttl_seconds / 2:
                attempt.create_holder()
            for attempt_no in range(2):
                try:
                    charge = order.charge(self.gate, attempt.token)
                    if self.queued_at:
                        record = estimates.outcome_update(self.raw_estimate_ms,
                                                          (time.monotonic() - self.queued_at) * 1000)
                        charge = {**charge, **record}
                    lease = attempt.book(privileged=True, allow_queue=True, charge=charge)
                    lease.estimated_wait_s = self.estimate_s
                    return lease
                except _Vanished:
                    # Stalled past the ticket TTL: the ticket and its holder document were
                    # pruned. Return what we just booked and queue again, from the back.
                    attempt.give_back(attempt.keys)
                    attempt.create_holder()
                    self.gate = self._enqueue()
                    return None
                except _Blocked as blocked:
                    self.blocked = blocked
                    if blocked.spec is attempt.gate:
                        return None
                    # Our turn, but a narrower level is full. A slot nobody books any more
                    # comes back by repair; a newcomer's booking on its way to the queue
                    # lasts milliseconds: try once more. Else sit out and pass the turn.
                    if blocked.counter is not None and waiting.is_full(blocked.counter) and waiting.repair(
                            blocked.counter, blocked.counter["clock"]):
                        continue
                    if attempt_no == 0:
                        time.sleep(NARROW_RETRY_S)
                        continue
                    waiting.mark_blocked(self.gate_key, attempt.token, blocked.spec.level)
                    self.sat_out = True
                    return None
            return None

        lease = _step(attempt, run)
        if lease is None and not woken:
            self.gate = _step(attempt, lambda: waiting.read_gate(self.gate_key))
        return lease

    def _give_up(self) -> LeaseBusy:
        """Out of time: leave the queue, drop the holder, and say where we stood."""
        gate = self.gate
        place = None if gate is None else order.position(gate, self.attempt.token, gate["clock"])
        blocked = self.blocked or _Blocked(self.attempt.gate, gate)
        if blocked.spec is self.attempt.gate:
            blocked = _Blocked(blocked.spec, gate)
        try:
            with _bound():
                waiting.dequeue(self.gate_key, self.attempt.token)
                self.attempt.discard()
        except pymongo.errors.PyMongoError as exc:
            log.info("timeout clean-up of %s failed (%s); the ticket goes stale by itself", self.attempt.token, exc)
        return _busy(self.attempt, blocked, position=place, gate=gate)


@dataclass(frozen=True)
class Ticket:
    """A place in a resource's queue, kept for a caller that polls it (the HTTP protocol).

    ``deadline`` is on MongoDB's clock: a ticket not polled by then is dropped (EXPIRED).
    ``level`` is the level that blocked it last; ``position`` its place in the grant order.
    """

    id: str
    resource: str
    lease_name: str
    level: str
    position: int | None
    server_time: datetime
    deadline: datetime
    estimated_grant_at: datetime | None = None

    @classmethod
    def of(cls, token: str, definition: LeaseDefinition, gate: CounterDoc, blocked: _Blocked | None) -> "Ticket":
        now = gate["clock"]
        mine: TicketDoc = next((t for t in gate.get("queue") or () if t.get("id") == token), TicketDoc())
        seen = mine.get("seen") or now
        return cls(id=token, resource=definition.resource, lease_name=definition.name,
                   level=order.blocking_level(gate, mine, now) if mine else (
                       blocked.spec.level if blocked else "global"),
                   position=order.position(gate, token, now), server_time=now,
                   deadline=seen + timedelta(milliseconds=int(mine.get("ttl") or 0)),
                   estimated_grant_at=estimates.grant_at(gate, token, now))


def acquire_or_ticket(request: LeaseRequest, *, keep_ms: int) -> "Lease | _NoopLease | Ticket":
    """Like :func:`acquire`, but when the wait ends without a slot the request keeps its
    place: a :class:`Ticket` that lives ``keep_ms`` past each :func:`resume`.

    Only named leases queue this way (an inline definition is not stored to resume from);
    an inline request answers ``LeaseBusy`` as :func:`acquire` does.

    Raises:
        The errors of :func:`acquire`.
    """
    return _acquire_request(request, keep_ms=None if request.inline is not None else keep_ms)


def _first(attempt: _Attempt, *, allow_queue: bool) -> "Lease | _Blocked":
    attempt.create_holder()
    try:
        return attempt.book(privileged=False, allow_queue=allow_queue)
    except _Blocked as blocked:
        return blocked


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
    from .errors import LeaseExpired

    validation.token(ticket_id)
    mine = holders.scoped(ticket_id, scope)
    try:
        with _bound():
            holder = store.holders().find_one_and_update(
                {**mine, "state": "PENDING"},
                [{"$set": {"polledAt": "$$NOW", "expiresAt": {"$add": ["$$NOW", {"$max": [
                    int(keep_ms), {"$multiply": [{"$ifNull": ["$ttlSeconds", 0]}, 1000]}]}]}}}],
                return_document=ReturnDocument.AFTER)
            if holder is None:
                holder = store.holders().find_one({**mine, "state": "HELD"})
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
                     attempt_id=holder.get("attemptId"))
    specs = definition.level_specs(request.tenant_id, request.project_id, request.user_id)
    # The class a ticket queued with stands: it was checked when the request queued, and a
    # System-layer change of the tenant's allowed classes since must not strand a ticket that
    # is already waiting (it ranks by today's list; a class no longer defined ranks last).
    kept = request.priority
    rank = definition.priorities.index(kept) if kept in definition.priorities else len(definition.priorities)
    attempt = _Attempt(request, definition, specs, request.pod or "", priority=(rank, kept))
    attempt.token = ticket_id
    attempt.named(holder.get("attemptId"))  # the ticket's holder as written: its entries name it
    attempt.acquired_at = holder.get("acquiredAt")
    attempt.created_at = time.monotonic()
    waiter = _Waiter(attempt, time.monotonic(), time.monotonic(), keep_ms=keep_ms)
    gate = _step(attempt, lambda: waiting.keep_alive(attempt.gate.key, ticket_id, ttl_ms=keep_ms,
                                                     live_at=holder["polledAt"]))
    if gate is None:
        # Not polled within its deadline (or already dropped): the waiting is over. Drop it
        # the way the queue drops stale tickets (holder removed, tombstoned).
        def drop() -> None:
            current = waiting.read_gate(attempt.gate.key)
            if current is not None:
                waiting.prune(current)
            holders.drop_ticket(mine, "ticket-expired", known=holder)

        _step(attempt, drop)
        raise LeaseExpired(f"ticket {ticket_id} was not polled in time", reason="ticket-expired")
    waiter.gate = gate
    lease = waiter._decide()
    if lease is not None:
        metrics.ACQUIRE.labels(resource=metrics.resource_tag(definition.resource), outcome="success").inc()
        history.grant(definition.resource, request.tenant_id)
        _observe_ticket_wait(attempt, gate, holder, lease)
        return lease
    return Ticket.of(ticket_id, definition, waiter.gate or gate, waiter.blocked)


def _observe_ticket_wait(attempt: _Attempt, gate: CounterDoc, holder: dict[str, Any], lease: Lease) -> None:
    """Record the per-class wait of a ticket granted on a poll, once: from its arrival in
    the queue (the ticket's ``at``, else its holder's ``acquiredAt``) to the grant (the
    HELD update's ``lastSeenAt``), both MongoDB's clock as stored. The request that kept
    the ticket recorded none in this histogram, nor does a poll answering it again."""
    ticket: TicketDoc = next((t for t in gate.get("queue") or () if t.get("id") == attempt.token), TicketDoc())
    arrived = ticket.get("at") or holder.get("acquiredAt")
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
        with _bound():
            if holders.drop_ticket(holders.scoped(ticket_id, scope), "abandoned", dequeue=True) is not None:
                return True
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("lease store", exc)) from None
    try:
        # Tombstoned: a later poll of the ticket answers EXPIRED (release), not "unknown".
        return holders.release(ticket_id, bound=scope) is not None
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("lease store", exc, " during release")) from None
