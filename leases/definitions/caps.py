"""Cap stamps: a lowered cap is in force on every process the moment its write returns.

Definitions are cached per process and a change reaches the other processes over Redis
(:mod:`leases.definitions.invalidation`); while Redis is frozen a process keeps serving its cached
definition for up to ``LEASES_INVALIDATION_LIVENESS_MS``, and a waiting attempt keeps the
definition it started with for its whole wait. The counters live in MongoDB with the
writer, so the writer puts the new cap there too:

* A definition write *stamps* every existing counter it governs with the cap it now has:
  ``capStamps.<lease>: {cap, at}`` (``at`` on MongoDB's clock), and ``cap`` itself.
* Every definition records when its load began (``loaded_at``, MongoDB's clock estimated
  low, :mod:`leases.store.server_clock`). A booking from a view loaded before the lease's stamp on
  that counter (with :data:`MARGIN` to spare) must fit under the stamped cap as well as its
  own: ``count < min(own cap, stamped cap)``. A view loaded after it has the write in it and
  books on its own cap alone.
* Only a *fresh* view (loaded after the stamp) sets ``cap`` when it books; an older view
  never raises it. So the queue (:mod:`leases.queue.order`), which reads ``cap`` to decide who
  fits, sees the lowered cap too.

The stamp binds the views of the lease that wrote it (``capStamps`` is keyed by lease name):
another lease on the same resource is not held to it. A raise needs no stamp to be safe;
it is stamped as well, and views loaded before it keep their own lower cap until they
reload (the liveness window delays raising, never lowering).

A counter that does not exist at the stamp (nobody booked it yet, or reconcile dropped it
idle, stamp and all) is created by a booking whose view may be older than the write — a
waiter's, which lasts its whole wait, a kept ticket's ``lv``, a stale cache. So a counter is
born *pending* (:func:`leases.store.counter_commands.seed`): bound to its creator's entry alone
(cap 1 for every view of the lease) until :func:`settle` stamps it with the cap of a fresh
read, taken after the creation — its creator does so at once, anybody a pending counter
blocks does it too. A write's stamp pass that finds the counter first stamps it instead
(the settle then matches nothing), and one that missed it ran before the creation, so the
fresh read sees its write. Hence a lowered cap binds every booking of the lease made after
its write returns, on counters old and new.

What a stamp does not reach: a user counter is shared by the projects of its tenant, whose
project layers may give the user level different caps, so its stamp is the largest of them
(a project that lowered it below another project's cap is held to the larger one until its
views reload); and a counter is born pending for its creator's lease only, so another lease
on the same resource books one it did not create on its own view's cap.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pymongo.errors
from pymongo import UpdateOne

from ..errors import LeaseUnavailable
from ..store import client as store, counter_commands
from ..store.documents import CounterDoc
from . import model as definitions
from .model import INLINE_RESOURCE_PREFIX, SYSTEM_TENANT, TENANT_PROJECT, LeaseDefinition, LevelSpec, document_path

log = logging.getLogger(__name__)

# A view counts as loaded after a stamp only when its load began this long after it: spare
# for the clock estimate and the millisecond resolution of stored times. A view inside the
# margin obeys the stamp, which is then its own cap.
MARGIN = timedelta(seconds=1)


def _stamp_at(spec: LevelSpec) -> dict[str, Any]:
    """The filter part "this counter's stamp of ``spec.lease``, if any, is older than the view"."""
    path = f"capStamps.{spec.lease}.at"
    if spec.loaded_at is None:
        return {path: {"$exists": False}}  # a view of unknown age is older than any stamp
    return {path: {"$not": {"$gte": spec.loaded_at - MARGIN}}}


def obeyed(spec: LevelSpec) -> dict[str, Any]:
    """The booking filter's clause: the view is newer than the lease's stamp on the counter,
    or the counter's count is below the stamped cap (field against field; no clock)."""
    if not spec.lease:
        return {}
    return {"$or": [_stamp_at(spec), {"$expr": {"$lt": ["$count", f"$capStamps.{spec.lease}.cap"]}}]}


def refresh_op(spec: LevelSpec) -> UpdateOne | None:
    """Set the counter's ``cap`` to ``spec``'s when its view is newer than the lease's
    stamp there (a raise no write stamped: a new bundled default); None for a view of
    unknown age. Never upserts, so it never fails the ordered bulk it is part of."""
    if not spec.lease or spec.loaded_at is None:
        return None
    return counter_commands.refresh_cap(spec.key, spec.cap, _stamp_at(spec))


def born(spec: LevelSpec, resource: str) -> str | None:
    """The lease a counter first booked from ``spec`` is born pending for (its seed's
    ``lease``), or None: no lease, or an inline definition (its caps come with each request;
    no layer is written to stamp them, and its name is not a stored lease's)."""
    if not spec.lease or resource.startswith(INLINE_RESOURCE_PREFIX):
        return None
    return spec.lease


def pending(spec: LevelSpec, counter: CounterDoc | None) -> bool:
    """Whether ``counter`` (as read) is still pending for ``spec``'s lease: born, not settled."""
    stamps: Any = (counter or {}).get("capStamps")
    mine = stamps.get(spec.lease) if isinstance(stamps, dict) and spec.lease else None
    return isinstance(mine, dict) and mine.get("at") == counter_commands.PENDING_AT


def settle(specs: Sequence[LevelSpec], resource: str) -> int:
    """Stamp the counters of ``specs``, born pending, each with the cap a fresh read of its
    lease gives it (the stamp pass's rule, :func:`_cap`; the spec's own when no view caps it
    there any more), one read of the layers for all. Call it after the counters were
    created — the read must follow the creation.

    Never raises: a counter left pending is safe (cap 1 binds every view of the lease) and
    whoever it blocks next, or reconcile, settles it.

    Returns:
        How many this call settled (not those settled already, nor those whose read or
        stamp failed).
    """
    views: dict[str, _Views] = {}
    settled = 0
    for spec in specs:
        lease = born(spec, resource)
        if lease is None:
            continue
        try:
            seen = views[lease] = views.get(lease) or _Views(lease)
            cap = _cap(seen, {"level": spec.level, "tenantId": spec.tenant_id, "scope": spec.scope,
                              "resource": resource})
            command = counter_commands.settle_cap(spec.key, lease, spec.cap if cap is None else cap)
            settled += store.counters().update_one(*command).modified_count
        except (LeaseUnavailable, pymongo.errors.PyMongoError) as exc:
            log.warning("counter %s stays pending (cap 1): its cap could not be read fresh or stamped: %s", spec.key,
                        exc)
    return settled


def settle_left(counter: CounterDoc) -> int:
    """Settle every lease ``counter`` (as read, with its level, scope, tenant, resource and
    stamps) is still pending for: its creator stopped between the creation and its settle
    and no booking it blocked has settled it (reconcile's net). Never raises.

    Returns:
        How many stamps this call settled.
    """
    stamps: Any = counter.get("capStamps")
    tenant = counter.get("tenantId")
    specs = [LevelSpec(level=str(counter.get("level")), scope=str(counter.get("scope", "")),
                       cap=int(counter.get("cap") or 1), key=str(counter["_id"]),
                       tenant_id=tenant if isinstance(tenant, str) else None, lease=str(lease))
             for lease, stamp in (stamps.items() if isinstance(stamps, dict) else ())
             if isinstance(stamp, dict) and stamp.get("at") == counter_commands.PENDING_AT]
    return settle(specs, str(counter.get("resource") or "")) if specs else 0


class _Views:
    """Fresh loads (never the cache) of one lease as seen from (tenant, project), memoised."""

    def __init__(self, name: str):
        self.name = name
        self._loaded: dict[tuple[str, str], LeaseDefinition] = {}
        self.own_projects: dict[str, set[str]] = {}  # tenant -> projects with a layer of their own
        for doc in store.config_documents().find({"path": document_path(name)}, {"tenantId": 1, "projectId": 1}):
            tenant, project = doc.get("tenantId"), doc.get("projectId")
            if isinstance(tenant, str) and isinstance(project, str) and tenant != SYSTEM_TENANT:
                projects = self.own_projects.setdefault(tenant, set())
                if project != TENANT_PROJECT:
                    projects.add(project)

    def of(self, tenant: str, project: str = TENANT_PROJECT) -> LeaseDefinition:
        """The view from (tenant, project); a project without a layer of its own sees its tenant's.

        Raises:
            LeaseUnavailable: the layers could not be read or do not merge.
        """
        if project not in self.own_projects.get(tenant, ()):
            project = TENANT_PROJECT
        key = (tenant, project)
        if key not in self._loaded:
            self._loaded[key] = definitions.load(self.name, tenant, project)
        return self._loaded[key]

    def of_tenant(self, tenant: str) -> list[LeaseDefinition]:
        """Every distinct view inside ``tenant``: its own and each of its projects' with a layer."""
        return [self.of(tenant)] + [self.of(tenant, p) for p in sorted(self.own_projects.get(tenant, ()))]


def _cap(views: _Views, counter: dict[str, Any]) -> int | None:
    """The cap ``counter`` has now under the lease, or None when no view caps it there."""
    level, tenant, scope, resource = counter.get("level"), counter.get("tenantId"), counter.get("scope", ""), \
        counter.get("resource")
    if level == "global":
        # Owned by the classpath and System layers: the same in every view.
        return views.of(SYSTEM_TENANT).levels.get("global")
    if not isinstance(tenant, str):
        return None
    if level == "tenant":
        candidates = [views.of(tenant)]
    elif level == "project":
        candidates = [views.of(tenant, scope.split("/", 1)[-1])]
    elif level == "user":
        candidates = views.of_tenant(tenant)  # a user counter is booked from every project
    else:
        return None
    caps = [v.levels[level] for v in candidates if v.resource == resource and level in v.levels]
    return max(caps) if caps else None


def stamp(tenant_id: str, project_id: str, name: str) -> int:
    """Stamp the caps a write of lease ``name``'s layer at (tenant, project) put in force onto
    the existing counters it governs: a System write every counter of the lease's resources,
    a Tenant write that tenant's, a Project write that project's counter and its tenant's
    user counters. Call it after the document is stored, before the change event.

    Returns:
        How many counters were stamped.

    Raises:
        LeaseUnavailable: a view of the lease could not be loaded (nothing stamped).
        pymongo.errors.PyMongoError: the store failed (some counters may be stamped).
    """
    views = _Views(name)
    if tenant_id == SYSTEM_TENANT and project_id == TENANT_PROJECT:
        resources = {views.of(SYSTEM_TENANT).resource} | {views.of(t).resource for t in views.own_projects}
        query: dict[str, Any] = {"resource": {"$in": sorted(resources)}}
    elif project_id == TENANT_PROJECT:
        query = {"resource": views.of(tenant_id).resource, "tenantId": tenant_id,
                 "level": {"$in": ["tenant", "project", "user"]}}
    else:
        query = {"resource": views.of(tenant_id).resource, "tenantId": tenant_id,
                 "$or": [{"level": "project", "scope": f"{tenant_id}/{project_id}"}, {"level": "user"}]}
    ops = []
    for counter in store.counters().find(query, {"level": 1, "tenantId": 1, "scope": 1, "resource": 1}):
        cap = _cap(views, counter)
        if cap is not None:
            ops.append(UpdateOne(*counter_commands.stamp_cap(counter["_id"], name, cap)))
    if ops:
        store.counters().bulk_write(ops, ordered=False)
    return len(ops)
