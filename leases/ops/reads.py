"""Operator reads shared by Insights → Leases, the ``lease`` CLI and the internal admin API.

Holders, counters, merged definitions, waiting tickets and pods, as frozen views of the
stored documents; nothing here writes. Tenant binding lives in the MongoDB filter of every
read (tokens are global), never in the caller: a token of another tenant is simply "not
found". Every id that reaches a filter is validated first (:mod:`leases.validation`), so an
operator document such as ``{"$ne": ""}`` can never be smuggled in as a value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from .. import ids, validation
from ..definitions import model as definitions
from ..errors import HolderNotFound
from ..pods.liveness import liveness, pod_view
from ..queue import estimates, order
from ..store import client as store

MAX_PER_PAGE = 500
MAX_PAGE = 1_000_000
LEVEL_ORDER = {"global": 0, "tenant": 1, "project": 2, "user": 3}


# --- views of stored documents --------------------------------------------------------------

@dataclass(frozen=True)
class HolderView:
    """One holder as operators see it; ``pod_state`` is ``alive``, ``dead`` or ``detached``."""

    token: str
    state: str
    resource: str
    lease_name: str
    type: str
    tenant_id: str
    project_id: str
    user_id: str
    holder_ref: str
    pod: str
    pod_bound: bool
    pod_state: str
    payload: dict[str, Any]
    levels: list[str]
    ttl_seconds: int | None
    acquired_at: datetime | None
    last_seen_at: datetime | None
    expires_at: datetime | None
    ttl_remaining_seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HolderPage:
    """One page of holders, newest acquisition first."""

    items: list[HolderView]
    total: int
    page: int
    per_page: int
    server_now: datetime

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.per_page))

    @property
    def has_next(self) -> bool:
        return self.page < self.pages

    @property
    def has_previous(self) -> bool:
        return self.page > 1

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "page": self.page, "perPage": self.per_page, "pages": self.pages,
                "serverNow": self.server_now, "items": [item.to_dict() for item in self.items]}


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


@dataclass(frozen=True)
class DefinitionField:
    """One field of a merged definition and the layer it came from."""

    field: str
    value: Any
    layer: str


@dataclass(frozen=True)
class DefinitionView:
    """A merged definition as an acquisition in (tenant, project) sees it."""

    name: str
    tenant_id: str
    project_id: str
    resource: str
    noop: bool
    fields: list[DefinitionField] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tenantId": self.tenant_id, "projectId": self.project_id,
                "resource": self.resource, "noop": self.noop,
                "fields": [asdict(f) for f in self.fields]}


# --- pod liveness -----------------------------------------------------------------------------

def live_pod_ids() -> set[str]:
    """Pods alive by the one liveness definition (``leases.pods.liveness``), this process included.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    return liveness.alive_pods()


def live_pod_endpoints() -> list[tuple[str, str]]:
    """``(pod_id, endpoint)`` of every alive foreign pod, for calls to its internal API.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    return [(row["podId"], row["endpoint"]) for row in pod_view()
            if row["alive"] and not row["self"] and row.get("endpoint")]


def _pod_state(pod: str, live: set[str] | None) -> str:
    if not pod:
        return "detached"
    if live is None:
        return "unknown"
    return "alive" if pod in live else "dead"


def _holder_view(doc: dict[str, Any], now: datetime, live: set[str] | None) -> HolderView:
    expires = doc.get("expiresAt")
    remaining = None if expires is None else round((expires - now).total_seconds(), 1)
    return HolderView(
        token=doc["_id"], state=doc.get("state", ""), resource=doc.get("resource", ""),
        lease_name=doc.get("leaseName", ""), type=doc.get("type", ""),
        tenant_id=doc.get("tenantId") or "", project_id=doc.get("projectId") or "",
        user_id=doc.get("userId") or "", holder_ref=doc.get("holderRef") or "",
        pod=doc.get("pod") or "", pod_bound=bool(doc.get("podBound", False)),
        pod_state=_pod_state(doc.get("pod") or "", live),
        payload=dict(doc.get("payload") or {}), levels=list(doc.get("levels") or ()),
        ttl_seconds=doc.get("ttlSeconds"), acquired_at=doc.get("acquiredAt"),
        last_seen_at=doc.get("lastSeenAt"), expires_at=expires,
        ttl_remaining_seconds=remaining,
    )


# --- reads ------------------------------------------------------------------------------------

def list_holders(tenant_id: str | None = None, resource: str | None = None, pod: str | None = None,
                 type: str | None = None, project_id: str | None = None, user_id: str | None = None,
                 page: int = 1, per_page: int = 50, books: str | None = None) -> HolderPage:
    """Holders matching the filters, newest first, one page at a time.

    ``tenant_id=None`` means all tenants (the CLI); the web view always passes its tenant.
    ``books`` is a counter key: only the holders that book a slot of that counter.
    TTL remaining is computed against MongoDB's clock.

    Raises:
        InvalidLeaseRequest: a filter value or the paging is malformed.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    query: dict[str, Any] = {}
    if (t := validation.optional(tenant_id, validation.entity_id, "tenant id")) is not None:
        query["tenantId"] = t
    if (r := validation.optional(resource, validation.resource_name)) is not None:
        query["resource"] = r
    if (p := validation.optional(pod, validation.pod_id)) is not None:
        query["pod"] = p
    if (ty := validation.optional(type, validation.lease_name)) is not None:
        query["type"] = ty
    if (pr := validation.optional(project_id, validation.entity_id, "project id")) is not None:
        query["projectId"] = pr
    if (u := validation.optional(user_id, validation.user_id)) is not None:
        query["userId"] = u
    if (k := validation.optional(books, validation.counter_key)) is not None:
        query["levels"] = k
    page = validation.positive_int(page, "page", MAX_PAGE)
    per_page = validation.positive_int(per_page, "per_page", MAX_PER_PAGE)
    # Held leases only: a waiting request (or an attempt mid-funnel) has a PENDING document
    # that books nothing; the queue shows waiting requests.
    query["state"] = "HELD"
    holders = store.holders()
    total = holders.count_documents(query)
    docs = list(holders.find(query).sort([("acquiredAt", -1), ("_id", 1)])
                .skip((page - 1) * per_page).limit(per_page))
    now = store.server_now()
    live = live_pod_ids() if docs else None
    return HolderPage([_holder_view(d, now, live) for d in docs], total, page, per_page, now)


def get_holder(token: str, tenant_id: str | None = None) -> HolderView:
    """One holder by token, bound to ``tenant_id`` when given.

    Raises:
        InvalidLeaseRequest: malformed token or tenant id.
        HolderNotFound: no such holder in that tenant (the same answer for other tenants').
    """
    query: dict[str, Any] = {"_id": validation.token(token)}
    if tenant_id is not None:
        query["tenantId"] = validation.entity_id(tenant_id, "tenant id")
    doc = store.holders().find_one(query)
    if doc is None:
        raise HolderNotFound(f"no holder {token}")
    return _holder_view(doc, store.server_now(), live_pod_ids())


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


def definition_view(name: str, tenant_id: str, project_id: str) -> DefinitionView:
    """The merged definition of lease ``name`` as an acquisition in (tenant, project) sees it.

    Reads every layer afresh: the cache entry is discarded first, so an operator process
    that is not on the change-event chain never shows a stale merge.

    Raises:
        InvalidLeaseRequest: malformed name or ids.
        LeaseUnavailable: a layer is unreadable or broken (what an acquisition would get).
    """
    validation.lease_name(name)
    validation.entity_id(tenant_id, "tenant id")
    validation.entity_id(project_id, "project id")
    definitions.cache.invalidate(tenant_id, project_id, name)
    merged = definitions.load(name, tenant_id, project_id)
    sources = merged.sources
    fields = [DefinitionField("resource", merged.resource, sources.get("resource", "default"))]
    for level in definitions.LEVELS:
        key = f"levels.{level}"
        fields.append(DefinitionField(key, merged.levels.get(level), sources.get(key, "unset")))
    fields.append(DefinitionField("ttlSeconds", merged.ttl_seconds, sources.get("ttlSeconds", "default")))
    fields.append(DefinitionField("waitMs", merged.wait_ms, sources.get("waitMs", "default")))
    return DefinitionView(merged.name, tenant_id, project_id, merged.resource, merged.is_noop, fields)


def known_lease_names(tenant_id: str | None = None) -> list[str]:
    """Lease names with a definition somewhere: bundled defaults, the System layer and the
    tenant's own documents (all tenants' when ``tenant_id`` is None), for pickers.

    Raises:
        InvalidLeaseRequest: malformed tenant id.
    """
    from importlib import resources

    from ..definitions.layers import LEASE_PATH_RE

    names: set[str] = set()
    bundled = resources.files("leases").joinpath("defaults", "_vance", "config", "lease")
    if bundled.is_dir():
        names.update(entry.name[:-5] for entry in bundled.iterdir() if entry.name.endswith(".yaml"))
    query: dict[str, Any] = {}
    if tenant_id is not None:
        query = {"tenantId": {"$in": [definitions.SYSTEM_TENANT, validation.entity_id(tenant_id, "tenant id")]}}
    for path in store.config_documents().distinct("path", query):
        match = LEASE_PATH_RE.fullmatch(path or "")
        if match:
            names.add(match.group(1))
    return sorted(names)


# --- waiting tickets -------------------------------------------------------------------------

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
    t, p, u = ticket.get("t", ""), ticket.get("p", ""), ticket.get("u", "")
    if level not in ("global", "tenant", "project", "user"):
        return None
    return ids.counter_key(resource, level, ids.scope(level, t, p, u))


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
    query: dict[str, Any] = {"queue.t": tenant} if tenant is not None else {"queue.id": {"$exists": True}}
    if (r := validation.optional(resource, validation.resource_name)) is not None:
        query["resource"] = r
    # Everything the order rule and the estimate read, the calibration (``er``) included:
    # the listing shows the figure the waiter's own 202 body and LeaseBusy show.
    gates = list(store.counters().find(query, {"queue": 1, "holders": 1, "cap": 1, "count": 1, "resource": 1,
                                               "level": 1, "vt": 1, "vf": 1, "holds": 1, "er": 1}))
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
    # The numbers of the blocking levels: one read, and in a tenant's view bound to its own
    # counters, so the global counter's numbers are never fetched for it.
    keys = {k for gate, ticket, _, _ in rows
            if (tenant is None or (ticket.get("lvl") or "global") != "global")
            and (k := _level_key(gate.get("resource", ""), ticket.get("lvl") or "global", ticket))}
    numbers: dict[str, tuple[int, int | None]] = {}
    if keys:
        counter_query: dict[str, Any] = {"_id": {"$in": sorted(keys)}}
        if tenant is not None:
            counter_query["tenantId"] = tenant
        numbers = {d["_id"]: (int(d.get("count", 0)), d.get("cap"))
                   for d in store.counters().find(counter_query, {"count": 1, "cap": 1})}
    items = []
    for gate, ticket, place, stale in rows:
        level = ticket.get("lvl") or "global"
        key = _level_key(gate.get("resource", ""), level, ticket)
        visible = tenant is None or level != "global"
        count, cap = numbers.get(key, (None, None)) if visible and key else (None, None)
        items.append(WaiterView(
            ticket_id=str(ticket.get("id", "")), resource=gate.get("resource", ""), gate=gate["_id"],
            tenant_id=ticket.get("t", ""), project_id=ticket.get("p", ""), user_id=ticket.get("u", ""),
            position=place, waiting_since=ticket.get("at"), last_seen=ticket.get("seen") or ticket.get("at"),
            ttl_ms=int(ticket.get("ttl", 0)), stale=stale, level=level,
            blocked_key=key if visible else None, blocked_count=count, blocked_cap=cap,
            priority=ticket.get("pn"),
            estimated_grant_at=None if stale or place is None else grant_times[gate["_id"]].get(str(ticket.get("id", "")))))
    items.sort(key=lambda w: (w.resource, w.gate, w.position is None, w.position or 0,
                              w.waiting_since or now, w.ticket_id))
    return WaiterList(items, now)


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
