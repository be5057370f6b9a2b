"""Holders as operators see them: one page of a filtered listing, or one holder by token.

Frozen views of ``resource_lease_holders`` documents with the holder's pod state (by the
one liveness rule, :mod:`leases.pods.liveness`) and its TTL left on MongoDB's clock. Reads
only. Tenant binding lives in the filter (tokens are global): another tenant's token is
simply "not found".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from ... import ids
from ...errors import HolderNotFound, InvalidFence
from ...ids import validation
from ...pods.liveness import liveness
from ...store import client as store, fence_codec as codec

MAX_PER_PAGE = 500
MAX_PAGE = 1_000_000


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
    fence: str | None = None  # the fence its grant issued (None: waiting, or granted before fences)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def fence_summary(self) -> str:
        """The fence as people read it: slot and generation on its counter ("" without one)."""
        if not self.fence:
            return ""
        try:
            fence = codec.decode(self.fence)
        except InvalidFence:
            return "unreadable"
        return f"slot {fence.slot}, generation {fence.generation} on {ids.readable_key(fence.counter)}"


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
        ttl_remaining_seconds=remaining, fence=doc.get("fence"),
    )


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
    live = liveness.alive_pods() if docs else None
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
    return _holder_view(doc, store.server_now(), liveness.alive_pods())
