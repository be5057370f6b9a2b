"""The consumer contract for asyncio (ASGI views, asyncio consumers), on pymongo's async client.

::

    async with leases.aacquire(request) as lease:     # or: lease = await leases.aacquire(request)
        await lease.aupdate_payload({"jobId": job_id})
        while not done:
            await lease.acheck()                      # LeaseLost once reaped or revoked
    # released here (or: await lease.arelease())

The same commands as the sync path (``leases.engine.commands``, ``slots.take_ops``), the same
errors and the same bounds: every step runs under one ``pymongo.timeout`` of
``LEASES_MONGO_TIMEOUT_MS``. The uncontended path — holder, the one ordered bulk over the
stacked levels, HELD; check; release — runs on the event loop's ``AsyncMongoClient``.

A level found full hands the attempt (same token, same booking entry) to the sync engine's
queue as steps (``service.contended_steps``): the fair queue's order, hand-off, repair and
rollback are the engine's, not a second copy of them. Its store steps run in a small thread
pool (each ends within the store bound); between them the request sleeps on the event loop
until the process's Redis subscriber wakes it (a thread-safe bridge: no thread per waiter)
or its keep-alive poll is due; ``waitMs`` bounds the whole wait as on the sync path. A
caller cancelled while it waits leaves the queue at once (its ticket and holder document are
dropped); a slot granted in that moment is released.

One async client per event loop (pymongo's async client must not cross loops); call
:func:`aclose` before a loop that used it ends.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pymongo.errors
from pymongo import ReturnDocument

from . import service, validation
from .engine import commands, holders
from .errors import LeaseLost, LeaseUnavailable
from .queue import estimates, slots, waiting
from .store import client as store
from .store.documents import CounterDoc
from .telemetry import metrics

log = logging.getLogger(__name__)

aclose = store.aclose
STEP_THREADS = 16


class AsyncLease:
    """A held lease for asyncio code; ``async with`` releases it (:meth:`arelease`, idempotent)."""

    is_noop = False

    def __init__(self, lease: service.Lease):
        self._lease = lease
        self._released = False
        self._release_failed = False

    token = property(lambda self: self._lease.token)
    definition = property(lambda self: self._lease.definition)
    request = property(lambda self: self._lease.request)
    levels = property(lambda self: self._lease.levels)
    expires_at = property(lambda self: self._lease.expires_at)
    acquired_at = property(lambda self: self._lease.acquired_at)
    resource = property(lambda self: self._lease.resource)

    def __repr__(self) -> str:
        return f"<AsyncLease {self.definition.name} {self.token[:8]}… on {self.resource}>"

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        try:
            await self.arelease()
        except LeaseUnavailable:
            if exc_type is None:
                raise
            # The body's own error matters more; the slot comes back through reap/repair.
            log.warning("release of %s failed after an error in the lease's block", self.token)

    async def _renew(self, payload: dict[str, Any] | None = None) -> None:
        """:func:`leases.engine.holders.renew` on the async client: the same command and verdict;
        ending a holder found past its deadline runs in a thread (the engine's reap)."""
        bound = holders.scope(self.request.tenant_id, self.request.project_id)
        db = store.async_db()
        error: LeaseLost | None = None
        try:
            with service._bound():
                doc = await db[store.HOLDERS].find_one_and_update(
                    *holders.renewal(self.token, bound=bound, payload=payload),
                    projection=holders.GRANT_FIELDS, return_document=ReturnDocument.AFTER)
                if doc is None:
                    tombstone = await db[store.TOMBSTONES].find_one(holders.scoped(self.token, bound), {"reason": 1})
                    error = holders.answer_for(self.token, tombstone)
                elif holders.verdict(doc) == holders.EXPIRED:
                    error = await asyncio.to_thread(holders.expire, self.token)
                elif holders.verdict(doc) == holders.KEEP_LATER:
                    await db[store.HOLDERS].update_one(*holders.keep_later(self.token, doc["priorExpiresAt"]))
                    doc["expiresAt"] = doc["priorExpiresAt"]
        except pymongo.errors.PyMongoError as exc:
            raise LeaseUnavailable(store.unreachable("lease store", exc, " during renewal")) from None
        holders.count_check(doc, error is None)
        if error is not None:
            raise error
        assert doc is not None  # no error means the renewal matched
        self._lease.expires_at, self._lease.last_seen_at = doc["expiresAt"], doc["lastSeenAt"]

    async def acheck(self) -> None:
        """Check-at-use and renew, as :meth:`leases.Lease.check` (the same renewal rule).

        Raises:
            LeaseLost: the lease ended (``LeaseExpired`` with the reason, or ``StaleLease``).
            LeaseUnavailable: the store is unreachable.
        """
        if self._released:
            metrics.CHECK.labels(resource=metrics.resource_tag(self.resource), outcome="lost").inc()
            raise LeaseLost(f"lease {self.token} was released")
        await self._renew()

    async def aupdate_payload(self, payload: dict[str, Any]) -> None:
        """Replace the payload the revocation handler will get (also a renewal).

        Raises:
            InvalidLeaseRequest: the payload is not a safe JSON-like dict.
            LeaseLost: the lease is no longer held (``LeaseExpired`` / ``StaleLease``).
            LeaseUnavailable: the store is unreachable.
        """
        validation.payload(payload)
        if self._released:
            raise LeaseLost(f"lease {self.token} was released")
        await self._renew(payload)

    async def arelease(self) -> bool:
        """Give the slots back, as :meth:`leases.Lease.release`: idempotent, True only for
        the call that released; the freed gate slot is handed to the next waiting ticket.

        Raises:
            LeaseUnavailable: the store failed before the holder was deleted; nothing was
                released and calling ``arelease()`` again retries it.
        """
        tag = metrics.resource_tag(self.resource)
        if self._released:
            metrics.RELEASE.labels(resource=tag, outcome="already-released").inc()
            return False
        booking = self._lease._booking()
        # How long the slot was held, kept on the gate for wait estimates (as the sync release).
        hold_ms = (time.monotonic() - self._lease._granted) * 1000
        bound = holders.scope(self.request.tenant_id, self.request.project_id)
        db = store.async_db()
        try:
            with service._bound():
                doc = await db[store.HOLDERS].find_one_and_delete(
                    *holders.deletion(holders.scoped(self.token, bound), "release"))
                if doc is None and self._release_failed:
                    # The failed call's delete may have landed after all: return our own
                    # entries by value; nobody can pull one twice.
                    gate = await _give_back(list(self.levels), booking, record=estimates.hold_update(hold_ms))
                    self._released = True
                    return gate is not None
        except pymongo.errors.PyMongoError as exc:
            self._release_failed = True
            metrics.RELEASE.labels(resource=tag, outcome="error").inc()
            raise LeaseUnavailable(store.unreachable("lease store", exc, " during release")) from None
        self._released = True
        if doc is None:
            metrics.RELEASE.labels(resource=tag, outcome="already-released").inc()
            return False
        # The rest of leases.engine.holders.end, the same steps on this client.
        ending = holders.Ending.of(doc, "release", hold_ms=hold_ms)
        try:
            with service._bound():
                # Shielded: the holder is gone, so a caller cancelled now must not strand
                # its slots until repair finds them.
                await asyncio.shield(_give_back(ending.keys, ending.booking,
                                                record=estimates.hold_update(ending.hold_ms)))
                if ending.tombstone is not None:
                    await db[store.TOMBSTONES].update_one(*ending.tombstone, upsert=True)
        except pymongo.errors.PyMongoError as exc:
            ending.account(exc)
            return True
        ending.account()
        return True


class _AsyncNoopLease:
    """The async lease of an unlimited resource: no MongoDB traffic at all."""

    is_noop = True
    token = None
    resource = None
    definition = None

    async def __aenter__(self) -> "_AsyncNoopLease":
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def acheck(self) -> None:
        return None

    async def aupdate_payload(self, payload: dict[str, Any]) -> None:
        validation.payload(payload)

    async def arelease(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<AsyncLease NOOP>"


ANOOP = _AsyncNoopLease()


class _Acquiring:
    """What :func:`aacquire` returns: await it for the lease, or ``async with`` it."""

    def __init__(self, request: service.LeaseRequest):
        self._request = request
        self._lease: AsyncLease | _AsyncNoopLease | None = None

    def __await__(self):
        return _acquire(self._request).__await__()

    async def __aenter__(self) -> "AsyncLease | _AsyncNoopLease":
        self._lease = await _acquire(self._request)
        return self._lease

    async def __aexit__(self, *exc: Any) -> None:
        if self._lease is not None:
            await self._lease.__aexit__(*exc)


def aacquire(request: service.LeaseRequest) -> _Acquiring:
    """Acquire like :func:`leases.acquire`, without blocking the event loop.

    ``await aacquire(request)`` answers the lease; ``async with aacquire(request) as lease``
    also releases it at the end of the block.

    Returns:
        An awaitable async context manager giving an :class:`AsyncLease`, or ``ANOOP``
        (no MongoDB traffic) when no lease is referenced or the definition has no caps.

    Raises:
        The errors of :func:`leases.acquire`, when awaited: ``InvalidLeaseRequest`` (and its
        ``UnknownLeaseType``, ``InvalidDefinition``), ``LeaseBusy`` after ``waitMs``,
        ``LeaseUnavailable`` within ``LEASES_MONGO_TIMEOUT_MS`` per step.
    """
    return _Acquiring(request)


async def _acquire(request: service.LeaseRequest) -> "AsyncLease | _AsyncNoopLease":
    # Validation and the definition (cached; a miss reads the store) in a thread: the cache
    # and the config reads are the engine's own, and they block.
    prepared = await asyncio.to_thread(service.prepare, request)
    if prepared is None:
        return ANOOP
    attempt, wait_ms = prepared
    started = time.monotonic()
    with service.outcome(attempt) as record:
        lease = await _uncontended(attempt, queues=wait_ms > 0)
        if lease is None:
            lease = await _wait_in_queue(attempt, wait_ms, started)
        return AsyncLease(record(lease))


async def _uncontended(attempt: Any, *, queues: bool) -> service.Lease | None:
    """Holder, one ordered bulk over every level, HELD: the lease; None when a level had no
    room (what this took is given back) or the gate has a queue, so the engine decides.

    Raises:
        LeaseUnavailable: the store failed; the attempt was rolled back (same bound).
    """
    try:
        if not store.indexed():
            await asyncio.to_thread(store.db)
        db = store.async_db()
        with service._bound():
            try:
                doc = await db[store.HOLDERS].find_one_and_update(
                    *commands.holder_upsert(attempt.token, definition=attempt.definition, request=attempt.request,
                                            pod=attempt.pod, keys=attempt.keys, attempt_id=attempt.attempt_id,
                                            priority=attempt.priority[1]),
                    upsert=True, projection={"acquiredAt": 1}, return_document=ReturnDocument.AFTER)
                assert doc is not None  # an upsert returning the document after always has one
                attempt.acquired_at = attempt.acquired_at or doc["acquiredAt"]
                attempt.written_at = doc["acquiredAt"]
                attempt.created_at = time.monotonic()
                if queues and waiting.queue_likely(attempt.gate.key):
                    return None  # tickets wait at the gate: the push would be refused
                ops = slots.take_ops(attempt.specs, attempt.booking, attempt.definition.resource,
                                     gate_key=attempt.gate.key)
                try:
                    await db[store.COUNTERS].bulk_write(ops, ordered=True)
                    booked = len(attempt.specs)
                except pymongo.errors.BulkWriteError as exc:
                    booked = slots.booked_before(exc)
                if booked < len(attempt.specs):
                    if booked:
                        await _give_back(attempt.keys[:booked], attempt.booking)
                    return None
                held = await db[store.HOLDERS].find_one_and_update(
                    *commands.mark_held(attempt.token, keys=attempt.keys, ttl_seconds=attempt.definition.ttl_seconds,
                                        attempt_id=attempt.attempt_id),
                    projection={"expiresAt": 1, "acquiredAt": 1, "lastSeenAt": 1, "intervalSeconds": 1},
                    return_document=ReturnDocument.AFTER)
                if held is None:
                    await asyncio.to_thread(_rollback, attempt)
                    raise LeaseUnavailable(f"lease attempt on {attempt.definition.resource} was reaped mid-acquire")
            except pymongo.errors.PyMongoError:
                await asyncio.to_thread(_rollback, attempt)
                raise
            except asyncio.CancelledError:
                # Cancelled between two commands: undo off the loop (the caller is gone).
                _EXECUTOR.submit(_rollback, attempt)
                raise
    except pymongo.errors.PyMongoError as exc:
        log.warning("store step failed: %r", exc)
        raise LeaseUnavailable(f"lease store error at {store.where()} mid-acquire: {exc.__class__.__name__}") from None
    return service.Lease(attempt.token, attempt.definition, attempt.request, list(attempt.keys),
                         expires_at=held.get("expiresAt"), acquired_at=held.get("acquiredAt"),
                         last_seen_at=held.get("lastSeenAt"), interval_seconds=held.get("intervalSeconds"),
                         attempt_id=attempt.attempt_id)


def _rollback(attempt: Any) -> None:
    """The sync engine's rollback, under its own bound (what it cannot undo is left to reap
    and repair)."""
    try:
        with service._bound():
            attempt.rollback()
    except pymongo.errors.PyMongoError as exc:
        log.warning("rollback of %s failed (%s); reap and repair clean up", attempt.token, exc)


async def _give_back(keys: list[str], booking: str, *, record: dict[str, Any] | None = None) -> CounterDoc | None:
    """``waiting.give_back`` on the async client: the narrower levels in one bulk, the last
    one returning its document (:func:`leases.queue.slots.gate_pull`, as ``slots.give_back``); a
    queue there is handed off (in a thread: the hand-off's wake-up publish and prune are
    the engine's).

    Raises:
        pymongo.errors.PyMongoError: the store failed part-way (repair returns the rest).
    """
    if not keys:
        return None
    counters = store.async_db()[store.COUNTERS]
    *narrow, gate_key = keys
    if narrow:
        await counters.bulk_write(slots.pull_ops(narrow, booking), ordered=False)
    gate = await counters.find_one_and_update(*slots.gate_pull(gate_key, booking, record),
                                              return_document=ReturnDocument.AFTER)
    waiting.note_queue(gate)
    if gate is not None and gate.get("queue"):
        await asyncio.to_thread(waiting.hand_off, gate)
    return gate


# Runs the queue's store steps; the waiting between them happens on the event loop, so a
# waiting request holds no thread. Each step ends within the store bound.
_EXECUTOR = ThreadPoolExecutor(max_workers=STEP_THREADS, thread_name_prefix="leases-aio")


class _LoopEvent(threading.Event):
    """A waiter's wake-up event: the process's Redis subscriber thread sets it, and that also
    wakes the coroutine sleeping on the loop (a thread-safe bridge, no thread of its own)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self.loop = loop
        self.aio = asyncio.Event()

    def set(self) -> None:
        super().set()
        try:
            self.loop.call_soon_threadsafe(self.aio.set)
        except RuntimeError:  # the loop has closed; nobody sleeps on it any more
            pass

    async def sleep(self, timeout: float) -> bool:
        """Until set or ``timeout`` passes; whether it was set."""
        try:
            await asyncio.wait_for(self.aio.wait(), timeout)
        except TimeoutError:
            pass
        self.aio.clear()
        return self.is_set()


def _advance(steps: Any, woken: bool | None) -> tuple[bool, Any]:
    """One store step of the queue: (False, sleep timeout) or (True, the lease).

    Raises:
        LeaseBusy, LeaseUnavailable: the waiting ended so.
    """
    try:
        _, timeout = steps.send(woken)
        return False, timeout
    except StopIteration as done:
        return True, done.value


async def _wait_in_queue(attempt: Any, wait_ms: int, started: float) -> service.Lease:
    """Wait in the resource's queue with the sync engine's steps (``service.contended_steps``):
    its store steps in a thread, its sleeps on this loop, woken over the process's Redis
    subscriber; bounded by ``waitMs`` from ``started`` as the sync path.

    Raises:
        LeaseBusy, LeaseUnavailable: as the sync path.
    """
    loop = asyncio.get_running_loop()
    event = _LoopEvent(loop)
    steps = service.contended_steps(attempt, wait_ms, started, event)
    woken: bool | None = None
    while True:
        step = loop.run_in_executor(_EXECUTOR, _advance, steps, woken)
        try:
            done, value = await asyncio.shield(step)
        except asyncio.CancelledError:
            # The step still runs in its thread: clean up once it is over.
            step.add_done_callback(lambda finished: _EXECUTOR.submit(_abandon, steps, finished))
            raise
        if done:
            return value
        try:
            woken = await event.sleep(value)
        except asyncio.CancelledError:
            _EXECUTOR.submit(_abandon, steps, None)
            raise


def _abandon(steps: Any, finished: "asyncio.Future[tuple[bool, Any]] | None") -> None:
    """The caller was cancelled while it waited: a lease granted meanwhile goes straight
    back; a request still in the queue leaves it (closing the steps dequeues it and drops
    its holder document)."""
    if finished is not None:
        if finished.cancelled() or finished.exception() is not None:
            return  # the waiting ended on its own (Busy, Unavailable) and cleaned up
        done, value = finished.result()
        if done:
            _release_quietly(value)
            return
    steps.close()


def _release_quietly(lease: service.Lease) -> None:
    try:
        lease.release()
    except LeaseUnavailable:
        log.warning("release of %s (caller cancelled) failed; reap and repair return it", lease.token)
