"""History cells: what one process saw of one (resource, tenant, minute) since its last flush.

Pure: the thread-safe buffer (:class:`Aggregator`), the merge rule shared with the
read-back (:func:`merge_counts`) and the ``$inc``/``$max`` upserts a flush sends
(:func:`updates`). The recorder and its flusher are :mod:`leases.telemetry.history`.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pymongo import UpdateOne

# Upper bounds (ms) of the wait buckets; one more bucket holds everything above the last.
BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000)
REAP_REASONS = frozenset({"idle", "pod", "revoke"})
# A buffer the store cannot take (outage) is kept for the next flush, up to this many
# (resource, tenant, minute) cells; beyond that the oldest minutes are dropped.
MAX_CELLS = 20000


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


def naive_utc(epoch: float) -> datetime:
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
                              "minute": naive_utc(minute * 60)},
             "$inc": inc, "$max": maximum, "$currentDate": {"updatedAt": True}},
            upsert=True,
        ))
    return ops
