"""Lease history: per resource, tenant and minute — grants, busy answers, waits, occupancy, reaps.

The hot path only adds to an in-process aggregator (a dict update under a lock, no
MongoDB command); a daemon thread flushes it every ``LEASES_HISTORY_FLUSH_SECONDS`` (and
at exit) in ONE ``bulk_write`` of ``$inc``/``$max`` upserts, so any number of processes
add to the same minute document. Wait times go into fixed buckets (``BUCKETS_MS``): buckets
merge by addition, samples would not, and the percentiles are read from the merged
buckets. Documents expire through a TTL index on ``updatedAt`` (set by the server with
``$currentDate``, so no client clock decides the expiry); no counter refers to them.

*Peak occupancy* is the highest number of slots the tenant held on the resource's gate
counter (its widest capped level) in a gate document this process read anyway: the
document a queued acquisition saw last when its wait ended (at least 1 when it was
granted). Every sample is a number of slots the tenant really held at that moment, so the
peak never over-states; it can miss a moment between two reads. An acquisition granted
without queueing reads no counter, so a minute without queued acquisitions has no
occupancy sample (``None``), never a guessed one.

Tenant ids and resource names are data in these documents, never metric labels. This
module writes them; the query that reads them back (minutes, percentiles, totals) is
:mod:`leases.ops.history`.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Any

import pymongo.errors

from ..store import client as store, entries
from ..store.documents import HolderDoc
from .history_cells import (
    BUCKETS_MS,
    MAX_CELLS,
    REAP_REASONS,
    Aggregator,
    Cell,
    Key,
    bucket_of,
    doc_id,
    events_of,
    merge_counts,
    naive_utc,
    updates,
)

__all__ = ["BUCKETS_MS", "MAX_CELLS", "REAP_REASONS", "Aggregator", "Cell", "Key", "Recorder", "bucket_of", "busy",
           "collection", "doc_id", "ensure_index", "events_of", "flush", "grant", "history_hours", "merge_counts",
           "occupancy_of", "reaped", "recorder", "updates", "waited"]

log = logging.getLogger(__name__)

COLLECTION = "lease_history"
TTL_INDEX = "updatedAt_ttl"
# The flush at exit waits at most this long for the store (a CLI run, a test process or a
# worker whose store already went must not hang on the store timeout to say so).
EXIT_FLUSH_SECONDS = 1.0


def history_hours() -> int:
    """How long minutes are kept (``LEASES_HISTORY_HOURS``, at least 1)."""
    from leases.conf import lease_settings

    return max(1, int(lease_settings.HISTORY_HOURS))


def flush_seconds() -> float:
    """Period of the background flush (``LEASES_HISTORY_FLUSH_SECONDS``; 0: no thread)."""
    from leases.conf import lease_settings

    return float(lease_settings.HISTORY_FLUSH_SECONDS)


def collection():
    return store.db()[COLLECTION]


def ensure_index(database) -> None:
    """The TTL index; a changed ``LEASES_HISTORY_HOURS`` is applied with ``collMod``.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    seconds = history_hours() * 3600
    coll = database[COLLECTION]
    try:
        coll.create_index([("updatedAt", 1)], name=TTL_INDEX, expireAfterSeconds=seconds)
    except pymongo.errors.OperationFailure as exc:
        if exc.code not in (85, 86):  # IndexOptionsConflict / IndexKeySpecsConflict
            raise
        database.command({"collMod": COLLECTION, "index": {"name": TTL_INDEX, "expireAfterSeconds": seconds}})
    coll.create_index([("tenantId", 1), ("resource", 1), ("minute", 1)], name="tenant_resource_minute")
    coll.create_index([("resource", 1), ("minute", 1)], name="resource_minute")


store.register_indexes(ensure_index)


# --- the process's recorder and its flusher ---------------------------------------------


class Recorder:
    """The process's aggregator plus the daemon thread that flushes it (started lazily by
    the first record, again after ``fork``)."""

    def __init__(self) -> None:
        self._offset = 0.0  # server clock - local clock, seconds (measured by the flusher)
        self.aggregator = Aggregator(clock=lambda: time.time() + self._offset)
        self._pid: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._flush_lock = threading.Lock()
        self._synced_at = 0.0

    def _ensure_thread(self) -> None:
        pid = os.getpid()
        if self._pid == pid:
            return
        if self._pid is not None:
            # Forked: the parent flushes what it buffered; the copy here would count twice.
            self.aggregator.drain()
        self._pid = pid
        period = flush_seconds()
        if period <= 0:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), name="lease-history", daemon=True)
        self._thread.start()

    def _run(self, period: float) -> None:
        self._sync_clock()
        while not self._stop.wait(period):
            self.flush()

    def _sync_clock(self) -> None:
        # Minutes follow MongoDB's clock (one command per hour, never per acquire).
        try:
            self._offset = (store.server_now() - naive_utc(time.time())).total_seconds()
            self._synced_at = time.monotonic()
        except pymongo.errors.PyMongoError as exc:
            log.debug("history clock sync failed: %r", exc)

    def flush(self) -> int:
        """Write everything buffered in one ``bulk_write``; returns the cells written.

        A store failure keeps the cells for the next flush (never raises: history must not
        break the process that records it).
        """
        with self._flush_lock:
            if time.monotonic() - self._synced_at > 3600 and self._thread is not None:
                self._sync_clock()
            cells = self.aggregator.drain()
            if not cells:
                return 0
            try:
                collection().bulk_write(updates(cells), ordered=False)
            except pymongo.errors.PyMongoError as exc:
                log.warning("lease history flush failed (%r); %d cells kept for the next one", exc, len(cells))
                self.aggregator.restore(cells)
                return 0
            return len(cells)

    def flush_at_exit(self, bound: float = EXIT_FLUSH_SECONDS) -> int:
        """The last flush of a process: everything buffered, in at most ``bound`` seconds.

        Nothing is kept for later (there is no later): what the store does not take in
        time is dropped and said in one INFO line with the number of events, since a store
        that went before the process (the dev stack stopped, a test server shut down) is
        no fault of it. Never raises.

        Returns:
            The cells written.
        """
        deadline = time.monotonic() + bound
        # A periodic flush blocked on a dead store holds the lock: do not wait it out.
        locked = self._flush_lock.acquire(timeout=bound)
        try:
            cells = self.aggregator.drain()
            if not cells:
                return 0
            try:
                if not locked:
                    raise TimeoutError("a flush in progress did not finish")
                with pymongo.timeout(max(0.05, deadline - time.monotonic())):
                    collection().bulk_write(updates(cells), ordered=False)
                return len(cells)
            except Exception as exc:  # noqa: BLE001 - at exit, whatever failed, drop and say so
                log.info("lease history: %d events dropped at exit (not written within %.1f s: %s)",
                         events_of(cells), bound, exc.__class__.__name__)
                return 0
        finally:
            if locked:
                self._flush_lock.release()

    def stop(self) -> None:
        self._stop.set()

    # Hooks (one call each in the engine). They never raise into the engine.

    def grant(self, resource: str, tenant: str) -> None:
        self._guarded(lambda: self.aggregator.grant(resource, tenant))

    def busy(self, resource: str, tenant: str) -> None:
        self._guarded(lambda: self.aggregator.busy(resource, tenant))

    def wait(self, resource: str, tenant: str, seconds: float, gate: dict[str, Any] | None,
             granted: bool, token: str = "") -> None:
        self._guarded(lambda: self.aggregator.wait(
            resource, tenant, seconds, occupancy_of(gate, tenant, token if granted else None)))

    def reap(self, resource: str | None, tenant: str | None, reason: str) -> None:
        if isinstance(resource, str) and isinstance(tenant, str):
            self._guarded(lambda: self.aggregator.reap(resource, tenant, reason))

    def _guarded(self, record) -> None:
        # Statistics must never turn a grant, a busy answer or a reap into an error.
        try:
            self._ensure_thread()
            record()
        except Exception:  # noqa: BLE001
            log.exception("lease history: recording failed")


def occupancy_of(gate: dict[str, Any] | None, tenant: str, own_token: str | None = None) -> int | None:
    """Slots ``tenant`` books on a gate document; a granted waiter (``own_token``) counts at
    least its own slot.

    The document predates the grant, and the slot that freed may have been the tenant's own
    or another tenant's, so the waiter's own slot is not added on top: the value is one the
    tenant really held (at the read, or right after the grant), never more.
    """
    if not gate or not isinstance(gate.get("holders"), list):
        return None
    held = sum(1 for value in gate["holders"] if entries.parts_of(value)[0] == tenant)
    return max(held, 1) if own_token else held


recorder = Recorder()


def _flush_at_exit() -> None:
    # Only a process whose flusher ran: with the thread off (tests) there is nobody to write
    # to at exit, and a store already gone would hold the exit for the operation timeout.
    if recorder._thread is not None and recorder._pid == os.getpid():
        recorder.stop()
        recorder.flush_at_exit()


atexit.register(_flush_at_exit)


def flush() -> int:
    """Flush this process's buffer now (tests, shutdown)."""
    return recorder.flush()


# The engine's hooks: one call each, an in-memory update, no MongoDB command.


def grant(resource: str, tenant: str) -> None:
    recorder.grant(resource, tenant)


def busy(resource: str, tenant: str) -> None:
    recorder.busy(resource, tenant)


def waited(waiter: Any, outcome: str, seconds: float) -> None:
    """A queued acquisition ended (``outcome`` granted, timeout, ticket or error) after
    ``seconds``; reads the waiter's resource, tenant, token and last gate document."""
    attempt = waiter.attempt
    recorder.wait(attempt.definition.resource, attempt.request.tenant_id, seconds, waiter.gate,
                  outcome == "granted", attempt.token)


def reaped(doc: HolderDoc, reason: str) -> None:
    recorder.reap(doc.get("resource"), doc.get("tenantId"), reason)
