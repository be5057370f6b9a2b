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

Tenant ids and resource names are data in these documents, never metric labels.
"""

from __future__ import annotations

import atexit
import bisect
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pymongo.errors
from pymongo import UpdateOne

from ..store import client as store, entries
from ..store.documents import HolderDoc

log = logging.getLogger(__name__)

COLLECTION = "lease_history"
TTL_INDEX = "updatedAt_ttl"
# Upper bounds (ms) of the wait buckets; one more bucket holds everything above the last.
BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000)
REAP_REASONS = frozenset({"idle", "pod", "revoke"})
# The flush at exit waits at most this long for the store (a CLI run, a test process or a
# worker whose store already went must not hang on the store timeout to say so).
EXIT_FLUSH_SECONDS = 1.0
# A buffer the store cannot take (outage) is kept for the next flush, up to this many
# (resource, tenant, minute) cells; beyond that the oldest minutes are dropped.
MAX_CELLS = 20000


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


# --- the in-process aggregator (pure) --------------------------------------------------


store.register_indexes(ensure_index)


def bucket_of(ms: float) -> int:
    """Index of the bucket a wait of ``ms`` falls in (``len(BUCKETS_MS)``: above the last)."""
    return bisect.bisect_left(BUCKETS_MS, ms)


@dataclass
class Cell:
    """One (resource, tenant, minute): what this process saw since the last flush."""

    grants: int = 0
    busy: int = 0
    waits: int = 0
    wait_max_ms: float = 0.0
    buckets: dict[int, int] = field(default_factory=dict)
    peak: int | None = None
    reaps: dict[str, int] = field(default_factory=dict)

    def merge(self, other: "Cell") -> None:
        merge_counts(self, other)


def merge_counts(into: Any, other: Any) -> None:
    """Add ``other``'s counts to ``into`` (a buffered cell or a read minute): sums, merged
    wait buckets, the larger longest wait and peak."""
    into.grants += other.grants
    into.busy += other.busy
    into.waits += other.waits
    into.wait_max_ms = max(into.wait_max_ms, other.wait_max_ms)
    for b, n in other.buckets.items():
        into.buckets[b] = into.buckets.get(b, 0) + n
    if other.peak is not None:
        into.peak = other.peak if into.peak is None else max(into.peak, other.peak)
    for r, n in other.reaps.items():
        into.reaps[r] = into.reaps.get(r, 0) + n


Key = tuple[str, str, int]  # resource, tenant, minute (epoch minutes, server clock)


class Aggregator:
    """Thread-safe buffer of :class:`Cell` by (resource, tenant, minute).

    ``clock`` returns epoch seconds (the server's, see :class:`Recorder`); injectable so
    the unit tests need no store.
    """

    def __init__(self, clock=time.time, max_cells: int = MAX_CELLS):
        self._clock = clock
        self._max_cells = max_cells
        self._lock = threading.Lock()
        self._cells: dict[Key, Cell] = {}

    def _cell(self, resource: str, tenant: str) -> Cell:
        key = (resource, tenant, int(self._clock() // 60))
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = Cell()
            if len(self._cells) > self._max_cells:
                del self._cells[min(self._cells, key=lambda k: k[2])]
        return cell

    def grant(self, resource: str, tenant: str) -> None:
        with self._lock:
            self._cell(resource, tenant).grants += 1

    def busy(self, resource: str, tenant: str) -> None:
        with self._lock:
            self._cell(resource, tenant).busy += 1

    def wait(self, resource: str, tenant: str, seconds: float, occupancy: int | None = None) -> None:
        ms = max(0.0, seconds * 1000.0)
        b = bucket_of(ms)
        with self._lock:
            cell = self._cell(resource, tenant)
            cell.waits += 1
            cell.wait_max_ms = max(cell.wait_max_ms, ms)
            cell.buckets[b] = cell.buckets.get(b, 0) + 1
            if occupancy is not None:
                cell.peak = occupancy if cell.peak is None else max(cell.peak, occupancy)

    def reap(self, resource: str, tenant: str, reason: str) -> None:
        # Reasons become field names: only the engine's fixed ones, never free text.
        reason = reason if reason in REAP_REASONS else "other"
        with self._lock:
            cell = self._cell(resource, tenant)
            cell.reaps[reason] = cell.reaps.get(reason, 0) + 1

    def drain(self) -> dict[Key, Cell]:
        """Everything buffered so far; the buffer starts empty again."""
        with self._lock:
            cells, self._cells = self._cells, {}
        return cells

    def restore(self, cells: dict[Key, Cell]) -> None:
        """Put back what a failed flush could not write (merged with what came since)."""
        with self._lock:
            for key, cell in cells.items():
                if key in self._cells:
                    cell.merge(self._cells[key])
                self._cells[key] = cell
            while len(self._cells) > self._max_cells:
                del self._cells[min(self._cells, key=lambda k: k[2])]

    def __len__(self) -> int:
        with self._lock:
            return len(self._cells)


def events_of(cells: dict[Key, Cell]) -> int:
    """How many recorded events (grants, busy answers, waits, reaps) ``cells`` hold."""
    return sum(c.grants + c.busy + c.waits + sum(c.reaps.values()) for c in cells.values())


def _naive_utc(epoch: float) -> datetime:
    # Stored times are naive UTC, like MongoDB's clock as the engine reads it.
    return datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None)


def doc_id(resource: str, tenant: str, minute: int) -> str:
    return f"{tenant}\x1f{resource}\x1f{minute}"


def updates(cells: dict[Key, Cell]) -> list[UpdateOne]:
    """One ``$inc``/``$max`` upsert per cell (pure)."""
    ops = []
    for (resource, tenant, minute), cell in cells.items():
        inc: dict[str, int] = {"grants": cell.grants, "busy": cell.busy, "waits": cell.waits}
        inc.update({f"waitBuckets.{b}": n for b, n in cell.buckets.items()})
        inc.update({f"reaps.{r}": n for r, n in cell.reaps.items()})
        maximum: dict[str, Any] = {"waitMaxMs": cell.wait_max_ms}
        if cell.peak is not None:
            maximum["peak"] = cell.peak
        ops.append(UpdateOne(
            {"_id": doc_id(resource, tenant, minute)},
            {"$setOnInsert": {"resource": resource, "tenantId": tenant,
                              "minute": _naive_utc(minute * 60)},
             "$inc": inc, "$max": maximum, "$currentDate": {"updatedAt": True}},
            upsert=True,
        ))
    return ops


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
            self._offset = (store.server_now() - _naive_utc(time.time())).total_seconds()
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


# --- reads ------------------------------------------------------------------------------


def percentile(buckets: dict[int, int], q: float, wait_max_ms: float | None = None) -> float | None:
    """The ``q`` quantile (0..1) of a bucket histogram, interpolated inside its bucket like
    Prometheus' ``histogram_quantile`` and capped at the largest wait seen."""
    total = sum(buckets.values())
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for b in sorted(buckets):
        n = buckets[b]
        if seen + n >= rank and n:
            lower = 0.0 if b == 0 else float(BUCKETS_MS[b - 1])
            upper = float(BUCKETS_MS[b]) if b < len(BUCKETS_MS) else (wait_max_ms or lower)
            value = lower + (upper - lower) * ((rank - seen) / n)
            return round(min(value, wait_max_ms) if wait_max_ms else value, 1)
        seen += n
    return wait_max_ms


@dataclass
class MinuteRow:
    """One minute of one resource (one tenant's, or all tenants' summed)."""

    minute: datetime
    grants: int = 0
    busy: int = 0
    waits: int = 0
    wait_p50_ms: float | None = None
    wait_p95_ms: float | None = None
    peak: int | None = None
    reaps: dict[str, int] = field(default_factory=dict)
    buckets: dict[int, int] = field(default_factory=dict, repr=False)
    wait_max_ms: float = 0.0

    @property
    def reaps_total(self) -> int:
        return sum(self.reaps.values())

    def to_dict(self) -> dict[str, Any]:
        return {"minute": self.minute, "grants": self.grants, "busy": self.busy, "waits": self.waits,
                "waitP50Ms": self.wait_p50_ms, "waitP95Ms": self.wait_p95_ms, "peakOccupancy": self.peak,
                "reaps": dict(self.reaps)}


@dataclass
class History:
    resource: str
    tenant_id: str | None  # None: all tenants (operators)
    since: datetime
    until: datetime
    rows: list[MinuteRow]
    totals: MinuteRow

    def to_dict(self) -> dict[str, Any]:
        totals = self.totals.to_dict()
        totals.pop("minute")
        return {"resource": self.resource, "tenantId": self.tenant_id, "since": self.since, "until": self.until,
                "minutes": [r.to_dict() for r in self.rows], "totals": totals}


def _add(row: MinuteRow, doc: dict[str, Any], *, sum_peaks: bool) -> None:
    row.grants += int(doc.get("grants", 0))
    row.busy += int(doc.get("busy", 0))
    row.waits += int(doc.get("waits", 0))
    row.wait_max_ms = max(row.wait_max_ms, float(doc.get("waitMaxMs", 0) or 0))
    for b, n in (doc.get("waitBuckets") or {}).items():
        row.buckets[int(b)] = row.buckets.get(int(b), 0) + int(n)
    for r, n in (doc.get("reaps") or {}).items():
        row.reaps[r] = row.reaps.get(r, 0) + int(n)
    peak = doc.get("peak")
    if peak is not None:
        if row.peak is None:
            row.peak = int(peak)
        else:
            row.peak = row.peak + int(peak) if sum_peaks else max(row.peak, int(peak))


def _finish(row: MinuteRow) -> MinuteRow:
    row.wait_p50_ms = percentile(row.buckets, 0.5, row.wait_max_ms)
    row.wait_p95_ms = percentile(row.buckets, 0.95, row.wait_max_ms)
    return row


def query(resource: str, *, tenant_id: str | None, since: timedelta, now: datetime | None = None,
          fill: bool = True) -> History:
    """The minutes of ``resource`` in the last ``since`` (server clock), oldest first.

    ``tenant_id`` binds the filter to one tenant; ``None`` (operators only) sums all tenants
    per minute — its peak occupancy is then the sum of the tenants' peaks (an upper bound
    of the resource's global occupancy in that minute). ``fill`` adds empty minutes so a
    chart has one column per minute.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    now = now if now is not None else store.server_now()
    until = now.replace(second=0, microsecond=0)
    start = until - timedelta(seconds=max(60, int(since.total_seconds()))) + timedelta(minutes=1)
    flt: dict[str, Any] = {"resource": {"$eq": resource}, "minute": {"$gte": start}}
    if tenant_id is not None:
        flt["tenantId"] = {"$eq": tenant_id}
    by_minute: dict[datetime, MinuteRow] = {}
    totals = MinuteRow(minute=start)
    for doc in collection().find(flt).sort("minute", 1):
        minute = doc["minute"]
        row = by_minute.setdefault(minute, MinuteRow(minute=minute))
        _add(row, doc, sum_peaks=tenant_id is None)
    for row in by_minute.values():
        _finish(row)
        merge_counts(totals, row)
    _finish(totals)
    if fill:
        rows = []
        minute = start
        while minute <= until:
            rows.append(by_minute.get(minute) or MinuteRow(minute=minute))
            minute += timedelta(minutes=1)
        # Minutes of a skewed writer's clock just past "until" are kept rather than hidden.
        rows.extend(r for m, r in sorted(by_minute.items()) if m > until)
    else:
        rows = [by_minute[m] for m in sorted(by_minute)]
    return History(resource=resource, tenant_id=tenant_id, since=start, until=until, rows=rows, totals=totals)


def resources(tenant_id: str | None = None) -> list[str]:
    """Resources with recorded minutes (of one tenant, or of any).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    flt = {} if tenant_id is None else {"tenantId": {"$eq": tenant_id}}
    return sorted(r for r in collection().distinct("resource", flt) if isinstance(r, str))


def parse_since(value: str | None, *, default: str = "1h") -> timedelta:
    """``30m``, ``1h``, ``2d`` (at most the retention) as a timedelta.

    Raises:
        InvalidLeaseRequest: not a number followed by m/h/d, zero, or longer than kept.
    """
    from ..errors import InvalidLeaseRequest

    raw = (value or default).strip()
    units = {"m": 60, "h": 3600, "d": 86400}
    number, unit = raw[:-1], raw[-1:].lower()
    if unit not in units or not number.isdigit() or not (1 <= int(number) <= 100000):
        raise InvalidLeaseRequest(f"--since must look like 30m, 1h or 2d, got {raw!r}")
    span = timedelta(seconds=int(number) * units[unit])
    limit = timedelta(hours=history_hours())
    return min(span, limit)

