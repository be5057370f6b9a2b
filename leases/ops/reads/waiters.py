"""Waiting tickets as operators and tenants see them: place in the queue, blocking level, estimate.

Reads only. The place is computed over the whole gate by the order rule
(:mod:`leases.queue.order`), the estimate by :mod:`leases.queue.estimates`; a tenant's view
is filtered before anything leaves :func:`list_waiters`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, cast

from ... import ids
from ...ids import validation
from ...queue import backlog, estimates, order
from ...store import client as store, shapes
from ...store.documents import CounterDoc, TicketDoc

GLOBAL_BLOCK_NOTE = "blocked at the global level, shared with other tenants"


@dataclass(frozen=True)
class WaiterView:
    """One waiting ticket; ``position`` is its 1-based place in the grant order of the whole
    queue (None when stale). ``blocked_count``/``blocked_cap`` are filled only for a level
    the viewer may see (never the global level in a tenant's view)."""

    ticket_id: str
    resource: str
    gate: str
    tenant_id: str
    project_id: str
    user_id: str
    position: int | None
    waiting_since: datetime | None
    last_seen: datetime | None
    ttl_ms: int
    stale: bool
    level: str
    blocked_key: str | None
    blocked_count: int | None
    blocked_cap: int | None
    priority: str | None = None  # the ticket's class (None: the lease defines none)
    estimated_grant_at: datetime | None = None  # server time (leases.queue.estimates); None: unknown

    @property
    def shared_level(self) -> bool:
        """Blocked at the global level, whose numbers belong to all tenants together."""
        return self.level == "global"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sharedLevel"] = self.shared_level
        return data


@dataclass(frozen=True)
class WaiterList:
    """Waiting tickets, by resource then position (stale ones last), with MongoDB's time."""

    items: list[WaiterView]
    server_now: datetime

    def by_resource(self) -> list[tuple[str, list[WaiterView]]]:
        """``(resource, tickets)`` pairs in display order, for one table per resource."""
        groups: dict[str, list[WaiterView]] = {}
        for item in self.items:
            groups.setdefault(item.resource, []).append(item)
        return list(groups.items())

    def to_dict(self) -> dict[str, Any]:
        return {"serverNow": self.server_now, "items": [item.to_dict() for item in self.items]}


def _level_key(resource: str, level: str, ticket: dict[str, Any]) -> str | None:
    t, p, u = shapes.owner(ticket)
    if level not in ("global", "tenant", "project", "user"):
        return None
    return ids.counter_key(resource, level, ids.scope(level, t, p, u))


def _backlog_rows(tenant: str | None, gates: list[dict[str, Any]],
                  now: datetime) -> list[tuple[dict[str, Any], dict[str, Any], int | None, bool]]:
    """The tickets of long queues waiting beyond their gate's head (``leases.queue.backlog``),
    as rows: placed after the head in arrival order (the order rule ranks only the head; a
    ticket of the backlog is promoted as the rule would pick it, so its place is an
    estimate). A tenant's view selects its own tickets in the query.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    by_id = {g["_id"]: g for g in gates}
    query: dict[str, Any] = {"g": {"$in": sorted(by_id)}}
    if tenant is not None:
        query["ticket.t"] = tenant
    docs = list(store.tickets().find(query, {"g": 1, "ticket": 1}).sort("at", 1))
    if not docs:
        return []
    # The place: after the whole head, counting every ticket of the backlog ahead of it
    # (another tenant's too: it is the place this ticket really has).
    ahead: dict[str, int] = {}
    if tenant is not None:
        ahead_query = {"g": {"$in": sorted({d["g"] for d in docs})}}
        everyone = list(store.tickets().find(ahead_query, {"g": 1, "at": 1}).sort("at", 1))
    else:
        everyone = docs
    rank: dict[str, int] = {}
    for doc in everyone:
        ahead[doc["g"]] = ahead.get(doc["g"], 0) + 1
        rank[doc["_id"]] = ahead[doc["g"]]
    rows: list[tuple[dict[str, Any], dict[str, Any], int | None, bool]] = []
    for doc in docs:
        gate = by_id.get(doc["g"])
        ticket = doc.get("ticket")
        if gate is None or not isinstance(ticket, dict):
            continue
        stale = order.is_stale(cast(TicketDoc, ticket), now)
        if stale and tenant is not None:
            continue
        place: int | None = len(gate.get("queue") or ()) + rank.get(doc["_id"], 0)
        rows.append((gate, {**ticket, "lvl": order.blocking_level(cast(CounterDoc, gate), cast(TicketDoc, ticket), now)}, place, stale))
    return rows


def list_waiters(tenant_id: str | None = None, resource: str | None = None) -> WaiterList:
    """Waiting tickets with their place in the queue and the level that blocks them.

    With ``tenant_id`` only that tenant's live tickets come back: the query selects the
    gates where it waits and the queue entries are filtered here, before anything leaves
    this function, so another tenant's ids, people and counts never reach a page. The
    position is still computed over the whole gate (``leases.queue.order``), because that is the
    place the ticket really has. Without ``tenant_id`` (operators) every ticket comes back,
    stale ones included and marked, with the numbers of every blocking level.

    Raises:
        InvalidLeaseRequest: malformed tenant id or resource.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    tenant = validation.optional(tenant_id, validation.entity_id, "tenant id")
    # The gates where it waits in the head, and those with a backlog (leases.queue.backlog),
    # where it may wait beyond the head: their heads are filtered below like the others.
    query: dict[str, Any] = {"$or": [{"queue.t": tenant} if tenant is not None else {"queue.id": {"$exists": True}},
                                     {"bk": {"$gt": 0}}]}
    if (r := validation.optional(resource, validation.resource_name)) is not None:
        query["resource"] = r
    # Everything the order rule and the estimate read, the calibration (``er``) included:
    # the listing shows the figure the waiter's own 202 body and LeaseBusy show.
    gates = list(store.counters().find(query, {"queue": 1, "holders": 1, "cap": 1, "count": 1, "resource": 1,
                                               "level": 1, "vt": 1, "vf": 1, "holds": 1, "er": 1, "bk": 1}))
    now = store.server_now()
    rows: list[tuple[dict[str, Any], dict[str, Any], int | None, bool]] = []
    grant_times: dict[str, dict[str, datetime]] = {}
    for gate in gates:
        places = {t.get("id"): i for i, t in enumerate(order.ranked(gate, now), start=1)}
        # One turnover walk per gate gives every ticket's estimate.
        grant_times[gate["_id"]] = estimates.grant_times(gate, now)
        for ticket in gate.get("queue") or ():
            if tenant is not None and ticket.get("t") != tenant:
                continue
            stale = order.is_stale(ticket, now)
            if stale and tenant is not None:
                continue  # its waiter is gone; the tenant sees live waits only
            # The level that blocks it now, as the order rule sees it (not only the one it
            # hit when it queued: a newcomer that saw a queue queues before booking any).
            ticket = {**ticket, "lvl": order.blocking_level(gate, ticket, now)}
            rows.append((gate, ticket, places.get(ticket.get("id")), stale))
    if any(backlog.count(cast(CounterDoc, gate)) for gate in gates):
        rows.extend(_backlog_rows(tenant, [g for g in gates if backlog.count(cast(CounterDoc, g))], now))
    # The numbers of the blocking levels: one read, and in a tenant's view bound to its own
    # counters, so the global counter's numbers are never fetched for it.
    keys = {k for gate, ticket, _, _ in rows
            if (tenant is None or (shapes.blocked_level(ticket) or "global") != "global")
            and (k := _level_key(gate.get("resource", ""), shapes.blocked_level(ticket) or "global", ticket))}
    numbers: dict[str, tuple[int, int | None]] = {}
    if keys:
        counter_query: dict[str, Any] = {"_id": {"$in": sorted(keys)}}
        if tenant is not None:
            counter_query["tenantId"] = tenant
        numbers = {d["_id"]: (int(d.get("count", 0)), d.get("cap"))
                   for d in store.counters().find(counter_query, {"count": 1, "cap": 1})}
    items = []
    for gate, ticket, place, stale in rows:
        level = shapes.blocked_level(ticket) or "global"
        key = _level_key(gate.get("resource", ""), level, ticket)
        visible = tenant is None or level != "global"
        count, cap = numbers.get(key, (None, None)) if visible and key else (None, None)
        items.append(WaiterView(
            ticket_id=str(ticket.get("id", "")), resource=gate.get("resource", ""), gate=gate["_id"],
            tenant_id=shapes.tenant(ticket), project_id=shapes.project(ticket), user_id=shapes.user(ticket),
            position=place, waiting_since=ticket.get("at"), last_seen=order.last_seen(cast(TicketDoc, ticket), now),
            ttl_ms=int(ticket.get("ttl", 0)), stale=stale, level=level,
            blocked_key=key if visible else None, blocked_count=count, blocked_cap=cap,
            priority=shapes.priority_name(ticket),
            estimated_grant_at=None if stale or place is None else grant_times.get(gate["_id"], {}).get(str(ticket.get("id", "")))))
    items.sort(key=lambda w: (w.resource, w.gate, w.position is None, w.position or 0,
                              w.waiting_since or now, w.ticket_id))
    return WaiterList(items, now)




def operator_waiters(tenant_id: str | None = None, resource: str | None = None) -> WaiterList:
    """Every ticket (stale ones too, marked), optionally narrowed to one tenant's rows.

    Unlike a tenant's own view (:func:`list_waiters` with ``tenant_id``), the narrowed rows
    keep their stale tickets and every blocking level's numbers: this is the platform
    operator's view, the tenant filter only narrows the rows (positions stay those of the
    whole queue).

    Raises:
        InvalidLeaseRequest: malformed tenant id or resource.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    tenant = validation.optional(tenant_id, validation.entity_id, "tenant id")
    result = list_waiters(resource=resource)
    if tenant is None:
        return result
    return WaiterList([w for w in result.items if w.tenant_id == tenant], result.server_now)
