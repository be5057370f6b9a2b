"""Counters as operators see them: count, cap, BOOKED (what reconcile restores) and drift.

Reads only. A tenant's view never includes the global level, whose numbers belong to all
tenants together; :func:`globally_full` tells a tenant only *that* the shared level is full.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from ... import ids
from ...ids import validation
from ...store import client as store, entries
from ...store.documents import HolderDoc

LEVEL_ORDER = {"global": 0, "tenant": 1, "project": 2, "user": 3}


@dataclass(frozen=True)
class CounterView:
    """A counter with BOOKED (its entries whose holder exists), the value reconcile restores."""

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
    included unless ``include_global=False``. BOOKED: :func:`_booked`.

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
    booked = _booked(docs, query.get("tenantId"))
    views = [
        CounterView(
            key=d["_id"], resource=d.get("resource", ""), level=d.get("level", ""),
            scope=d.get("scope", ""), tenant_id=d.get("tenantId"), count=int(d.get("count", 0)),
            cap=d.get("cap"), booked=booked.get(d["_id"], 0), updated_at=d.get("updatedAt"),
        )
        for d in docs
    ]
    return sorted(views, key=_counter_sort_key)


def _booked(docs: list[dict[str, Any]], tenant_id: str | None) -> dict[str, int]:
    """BOOKED per counter: what reconcile restores — its entries whose holder exists as the
    entry names it (token and ``attemptId``), ``PENDING`` ones included (a lease answered on
    its grant books its slot before its holder is marked ``HELD``); one read of the holders.
    A counter written before entries existed: the holders whose ``levels`` name it.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    listed = [d for d in docs if isinstance(d.get("holders"), list)]
    legacy = [d["_id"] for d in docs if not isinstance(d.get("holders"), list)]
    tokens = sorted({entries.token_of(str(e)) for d in listed for e in d["holders"]})
    found: dict[str, HolderDoc] = {}
    if tokens:
        holder_query: dict[str, Any] = {"_id": {"$in": tokens}}
        if tenant_id is not None:
            holder_query["tenantId"] = tenant_id
        found = {h["_id"]: h for h in store.holders().find(holder_query, {"attemptId": 1})}

    def live(entry: Any) -> bool:
        return not entries.superseded(str(entry), found.get(entries.token_of(str(entry))))

    booked = {d["_id"]: len([e for e in d["holders"] if live(e)]) for d in listed}
    if legacy:
        match: dict[str, Any] = {"levels": {"$in": legacy}}
        if tenant_id is not None:
            match["tenantId"] = tenant_id
        pipeline: list[dict[str, Any]] = [
            {"$match": match},
            {"$project": {"levels": 1}},
            {"$unwind": "$levels"},
            {"$match": {"levels": {"$in": legacy}}},
            {"$group": {"_id": "$levels", "n": {"$sum": 1}}},
        ]
        booked.update({row["_id"]: int(row["n"]) for row in store.holders().aggregate(pipeline)})
    return booked


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
