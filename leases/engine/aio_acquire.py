"""The async acquire: ``aacquire``, its uncontended path on the event loop's client.

Holder, the one ordered bulk over the stacked levels, HELD — the same commands as the sync
funnel (``leases.store.holder_commands``, ``slots.take_ops``) under the same store bound. A level found
full (or a queue at the gate) hands the attempt to :mod:`leases.engine.aio_waiter`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pymongo.errors
from pymongo import ReturnDocument

from ..errors import LeaseUnavailable
from ..queue import fences, slots, waiting, wakeups
from ..store import admission, client as store, holder_commands as commands
from .aio_counters import give_back
from .aio_lease import ANOOP, AsyncLease, AsyncNoopLease
from .aio_waiter import EXECUTOR, wait_in_queue
from .funnel import queue_expected
from .intervals import choose_interval
from .lease import Lease
from .outcome import outcome
from .prepare import prepare
from .request import LeaseRequest
from .step import rollback_bounded, store_bound

log = logging.getLogger(__name__)


class _Acquiring:
    """What :func:`aacquire` returns: await it for the lease, or ``async with`` it."""

    def __init__(self, request: LeaseRequest):
        self._request = request
        self._lease: AsyncLease | AsyncNoopLease | None = None

    def __await__(self):
        return _acquire(self._request).__await__()

    async def __aenter__(self) -> "AsyncLease | AsyncNoopLease":
        self._lease = await _acquire(self._request)
        return self._lease

    async def __aexit__(self, *exc: Any) -> None:
        if self._lease is not None:
            await self._lease.__aexit__(*exc)


def aacquire(request: LeaseRequest) -> _Acquiring:
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


async def _acquire(request: LeaseRequest) -> "AsyncLease | AsyncNoopLease":
    # Validation and the definition (cached; a miss reads the store) in a thread: the cache
    # and the config reads are the engine's own, and they block.
    prepared = await asyncio.to_thread(prepare, request)
    if prepared is None:
        return ANOOP
    attempt, wait_ms = prepared
    started = time.monotonic()
    with outcome(attempt) as record:
        lease = await _admitted_uncontended(attempt, wait_ms=wait_ms)
        if lease is None:
            lease = await wait_in_queue(attempt, wait_ms, started)
        return AsyncLease(record(lease))


async def _admitted_uncontended(attempt: Any, *, wait_ms: int) -> Lease | None:
    """:func:`_uncontended` as one admitted step of this event loop.

    Raises:
        LeaseUnavailable: not admitted within ``LEASES_STORE_ADMISSION_MS``, or as
            :func:`_uncontended`.
    """
    try:
        async with admission.admitted_async():
            return await _uncontended(attempt, wait_ms=wait_ms)
    except pymongo.errors.ExecutionTimeout as exc:  # only the admission's: the try converts its own
        raise LeaseUnavailable(f"lease store busy: {exc}") from None


async def _uncontended(attempt: Any, *, wait_ms: int) -> Lease | None:
    """Holder, one ordered bulk over every level, HELD: the lease; None when a level had no
    room (what this took is given back) or the gate has a queue, so the engine decides. A
    request that will most likely queue (tickets were seen waiting at the gate) writes its
    holder to cover its wait (``wait_ms``), as :func:`leases.engine.funnel.first` does.

    Raises:
        LeaseUnavailable: the store failed; the attempt was rolled back (same bound).
    """
    try:
        if not store.indexed():
            await asyncio.to_thread(store.db)
        db = store.async_db()
        queues = wait_ms > 0
        likely = queue_expected(attempt, wait_ms)
        interval = choose_interval(attempt.definition.ttl_seconds, attempt.request.interval_seconds)
        with store_bound():
            try:
                doc = await db[store.HOLDERS].find_one_and_update(
                    *commands.holder_upsert(attempt.token, definition=attempt.definition, request=attempt.request,
                                            pod=attempt.pod, keys=attempt.keys, attempt_id=attempt.attempt_id,
                                            priority=attempt.priority[1], interval_seconds=interval,
                                            waker=wakeups.process_id(), wait_ms=wait_ms if likely else 0),
                    upsert=True, projection={"acquiredAt": 1, "expiresAt": 1}, return_document=ReturnDocument.AFTER)
                assert doc is not None  # an upsert returning the document after always has one
                attempt.written(doc)
                # As the sync write does: a grant handed over later is then claimed with a plain
                # update (its fields known), not a findAndModify the embedded server answers by
                # scanning the holders (6 ms at 1,000 waiting holders).
                attempt.interval_seconds = interval
                attempt.wait_covered = likely
                if queues and waiting.queue_likely(attempt.gate.key):
                    return None  # tickets wait at the gate: the push would be refused
                plan = fences.plan(attempt.fence_spec, attempt.booking, floor=fences.floor_of(attempt.written_at))
                ops = slots.take_ops(attempt.specs, attempt.booking, attempt.definition.resource,
                                     gate_key=attempt.gate.key, fence=plan)
                try:
                    done = await db[store.COUNTERS].bulk_write(ops, ordered=True)
                    booked, created = len(attempt.specs), done.upserted_ids
                except pymongo.errors.BulkWriteError as exc:
                    booked, created = slots.booked_before(exc), exc.details.get("upserted")
                if created:  # first use: settle the counters born pending (leases.definitions.caps)
                    await asyncio.to_thread(slots.settle_created, attempt.specs, attempt.definition.resource, created)
                if booked < len(attempt.specs):
                    if booked:
                        # Freed with its fence slot: the entry books again at its turn.
                        landed = plan.key in attempt.keys[:booked]
                        await give_back(attempt.keys[:booked], attempt.booking,
                                        fence=plan.slot_on() if landed else None)
                    return None
                held = await db[store.HOLDERS].find_one_and_update(
                    *commands.mark_held(attempt.token, keys=attempt.keys, ttl_seconds=attempt.definition.ttl_seconds,
                                        attempt_id=attempt.attempt_id, fence=plan.fence),
                    projection=commands.HELD_PROJECTION,
                    return_document=ReturnDocument.AFTER)
                if held is None:
                    await asyncio.to_thread(_rollback, attempt)
                    raise LeaseUnavailable(f"lease attempt on {attempt.definition.resource} was reaped mid-acquire")
            except pymongo.errors.PyMongoError:
                await asyncio.to_thread(_rollback, attempt)
                raise
            except asyncio.CancelledError:
                # Cancelled between two commands: undo off the loop (the caller is gone).
                EXECUTOR.submit(_rollback, attempt)
                raise
    except pymongo.errors.PyMongoError as exc:
        log.warning("store step failed: %r", exc)
        raise LeaseUnavailable(f"lease store error at {store.where()} mid-acquire: {exc.__class__.__name__}") from None
    return Lease(attempt.token, attempt.definition, attempt.request, list(attempt.keys),
                         expires_at=held.get("expiresAt"), acquired_at=held.get("acquiredAt"),
                         last_seen_at=held.get("lastSeenAt"), interval_seconds=held.get("intervalSeconds"),
                         attempt_id=attempt.attempt_id, fence=held.get("fence"))


# The sync engine's rollback, under its own bound.
_rollback = rollback_bounded
