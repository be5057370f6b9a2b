"""Counters as operators see them: count, cap, BOOKED (what reconcile restores) and drift.

Reads only. A tenant's view never includes the global level, whose numbers belong to all
tenants together; :func:`globally_full` tells a tenant only *that* the shared level is full.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from ... import ids, validation
from ...store import client as store

LEVEL_ORDER = {"global": 0, "tenant": 1, "project": 2, "user": 3}


@dataclass(frozen=True)
class CounterView:
    """A counter with BOOKED (holders whose ``levels`` name it), the value reconcile restores."""

    key: str
    resource: str
    level: str
    scope: str
    tenant_id: str | None
    count: int
    cap: int | None
    booked: int
    updated_at: datetime | None

    @property
    def readable_scope(self) -> str:
        """The scope with its ids decoded, as people read it (``acme/alice/x``; display only)."""
        return ids.readable_scope(self.scope)

    @property
    def drift(self) -> bool:
        """The counter disagrees with its holders (a crash window), not a display error."""
        return self.count != self.booked

    @property
    def occupancy_percent(self) -> int:
        if not self.cap:
            return 0
        return max(0, min(100, round(self.count * 100 / self.cap)))

    @property
    def full(self) -> bool:
        return self.cap is not None and self.count >= self.cap

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["drift"] = self.drift
        return data


def _counter_sort_key(view: CounterView) -> tuple:
    return (view.resource, LEVEL_ORDER.get(view.level, 9), view.scope)


def list_counters(tenant_id: str | None = None, include_global: bool | None = None) -> list[CounterView]:
    """Counters with BOOKED and drift; a tenant's view never includes the global level.

    The global level belongs to no tenant (its count sums all tenants), so with a
    ``tenant_id`` it is left out whatever ``include_global`` says; without one it is
    included unless ``include_global=False``. BOOKED comes from one aggregation over the
    holders that book any of the listed keys (index on ``levels``).

    Raises:
        InvalidLeaseRequest: malformed tenant id.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    query: dict[str, Any] = {}
    if tenant_id is not None:
        query["tenantId"] = validation.entity_id(tenant_id, "tenant id")
        query["level"] = {"$ne": "global"}
    elif include_global is False:
        query["level"] = {"$ne": "global"}
    docs = list(store.counters().find(query))
    keys = [d["_id"] for d in docs]
    booked: dict[str, int] = {}
    if keys:
        match: dict[str, Any] = {"levels": {"$in": keys}}
        if tenant_id is not None:
            match["tenantId"] = query["tenantId"]
        pipeline: list[dict[str, Any]] = [
            {"$match": match},
            {"$project": {"levels": 1}},
            {"$unwind": "$levels"},
            {"$match": {"levels": {"$in": keys}}},
            {"$group": {"_id": "$levels", "n": {"$sum": 1}}},
        ]
        booked = {row["_id"]: int(row["n"]) for row in store.holders().aggregate(pipeline)}
    views = [
        CounterView(
            key=d["_id"], resource=d.get("resource", ""), level=d.get("level", ""),
            scope=d.get("scope", ""), tenant_id=d.get("tenantId"), count=int(d.get("count", 0)),
            cap=d.get("cap"), booked=booked.get(d["_id"], 0), updated_at=d.get("updatedAt"),
        )
        for d in docs
    ]
    return sorted(views, key=_counter_sort_key)


def globally_full(resources: Iterable[str]) -> set[str]:
    """Which of ``resources`` have a full global level (count ≥ cap).

    Only the names come back, never the numbers: a tenant may learn that the shared level
    is what holds it back, not how the other tenants use it.

    Raises:
        InvalidLeaseRequest: a malformed resource name.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    names = sorted({validation.resource_name(r) for r in resources})
    if not names:
        return set()
    full = set()
    for doc in store.counters().find({"_id": {"$in": [f"{n}|global|*" for n in names]}},
                                     {"count": 1, "cap": 1, "resource": 1}):
        if doc.get("cap") is not None and int(doc.get("count", 0)) >= int(doc["cap"]):
            full.add(doc.get("resource") or doc["_id"].split("|", 1)[0])
    return full
