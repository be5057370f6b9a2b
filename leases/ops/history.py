"""Lease history read back: a resource's minutes (one tenant's, or all summed), with percentiles.

Reads the minute documents :mod:`leases.telemetry.history` writes, for Insights' history
page and the ``lease stats`` command. Wait percentiles come from the merged wait buckets
(:data:`leases.telemetry.history.BUCKETS_MS`). Every filter value is passed with ``$eq``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..errors import InvalidLeaseRequest
from ..store import client as store
from ..telemetry.history import BUCKETS_MS, collection, history_hours, merge_counts


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
    raw = (value or default).strip()
    units = {"m": 60, "h": 3600, "d": 86400}
    number, unit = raw[:-1], raw[-1:].lower()
    if unit not in units or not number.isdigit() or not (1 <= int(number) <= 100000):
        raise InvalidLeaseRequest(f"--since must look like 30m, 1h or 2d, got {raw!r}")
    span = timedelta(seconds=int(number) * units[unit])
    limit = timedelta(hours=history_hours())
    return min(span, limit)

