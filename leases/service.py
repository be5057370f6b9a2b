"""The consumer contract: ``acquire`` → ``Lease.update_payload`` / ``check`` → ``release``.

Acquisition funnel (no transactions needed): create the holder (PENDING, server time),
then per level in check order a conditional
``$inc`` on the counter followed by ``$push`` of its key into the holder's ``levels``;
the last push marks the holder HELD. Any failure mid-funnel rolls back: whoever deletes
the holder document decrements the levels it registered. A full level triggers the lazy
idle reap of that resource before the attempt is retried.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from dataclasses import dataclass
from typing import Any

import pymongo
import pymongo.errors
from pymongo import ReturnDocument

from . import definitions, handlers, metrics, reaper, store, validation
from .definitions import LeaseDefinition, LevelSpec
from .errors import InvalidLeaseRequest, LeaseBusy, LeaseLost, LeaseUnavailable
from .identity import self_pod_id

log = logging.getLogger(__name__)

POLL_MIN_S = 0.02
POLL_MAX_S = 0.5


@dataclass(frozen=True)
class LeaseRequest:
    """What a consumer asks for; ``lease`` (a name) or ``inline`` (a definition), not both."""

    type: str
    tenant_id: str
    project_id: str
    user_id: str
    lease: str | None = None
    inline: dict[str, Any] | None = None
    holder_ref: str = ""
    pod: str | None = None  # None: this process's pod; "": detached (HTTP clients), idle reap only
    pod_bound: bool = False
    wait_ms: int | None = None  # override the definition's waitMs (e.g. the HTTP request bound)

    def validated(self) -> "LeaseRequest":
        """Check every field; returns self.

        Raises:
            InvalidLeaseRequest: a bad id, name or flag.
            UnknownLeaseType: ``type`` has no registered handler.
        """
        handlers.get_handler(self.type)
        validation.entity_id(self.tenant_id, "tenant id")
        validation.entity_id(self.project_id, "project id")
        validation.entity_id(self.user_id, "user id")
        validation.holder_ref(self.holder_ref)
        if self.pod:
            validation.pod_id(self.pod)
        elif self.pod is not None and self.pod != "":
            raise InvalidLeaseRequest("pod must be a pod id, '' (detached) or None (this pod)")
        if not isinstance(self.pod_bound, bool):
            raise InvalidLeaseRequest("pod_bound must be a bool")
        if self.lease is not None and self.inline is not None:
            raise InvalidLeaseRequest("give either lease (a name) or inline (a definition), not both")
        if self.lease is not None:
            validation.lease_name(self.lease)
        if self.wait_ms is not None and (isinstance(self.wait_ms, bool) or not isinstance(self.wait_ms, int) or self.wait_ms < 0):
            raise InvalidLeaseRequest("wait_ms must be a non-negative int")
        return self


class Lease:
    """A held lease. Use as a context manager or call :meth:`release` (idempotent)."""

    is_noop = False

    def __init__(self, token: str, definition: LeaseDefinition, request: LeaseRequest, levels: list[str]):
        self.token = token
        self.definition = definition
        self.request = request
        self.levels = levels
        self._released = False

    @property
    def resource(self) -> str:
        return self.definition.resource

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<Lease {self.definition.name} {self.token[:8]}… on {self.resource}>"

    def _touch(self, extra: dict[str, Any] | None = None) -> bool:
        update: dict[str, Any] = {
            "lastSeenAt": "$$NOW",
            "expiresAt": store.now_plus_ms(self.definition.ttl_seconds * 1000),
        }
        if extra:
            update.update(extra)
        # A touch counts as held when it *matched*: two touches in one millisecond write
        # the same value and MongoDB reports nModified = 0.
        result = store.holders().update_one({"_id": self.token}, [{"$set": update}])
        return result.matched_count == 1

    def check(self) -> None:
        """Check-at-use and touch: call at every usage step; the TTL runs from here.

        Raises:
            LeaseLost: the lease was reaped, revoked or released.
            LeaseUnavailable: the store is unreachable.
        """
        tag = metrics.resource_tag(self.resource)
        if self._released:
            metrics.CHECK.labels(resource=tag, outcome="lost").inc()
            raise LeaseLost(f"lease {self.token} was released")
        try:
            held = self._touch()
        except pymongo.errors.PyMongoError as exc:
            raise LeaseUnavailable(f"lease store unreachable during check: {exc.__class__.__name__}") from None
        if not held:
            metrics.CHECK.labels(resource=tag, outcome="lost").inc()
            raise LeaseLost(f"lease {self.token} on {self.resource} was lost (reaped or revoked)")
        metrics.CHECK.labels(resource=tag, outcome="ok").inc()

    def update_payload(self, payload: dict[str, Any]) -> None:
        """Replace the payload the revocation handler will get (also a touch).

        Raises:
            InvalidLeaseRequest: the payload is not a safe JSON-like dict.
            LeaseLost: the lease is no longer held.
            LeaseUnavailable: the store is unreachable.
        """
        validation.payload(payload)
        if self._released:
            raise LeaseLost(f"lease {self.token} was released")
        try:
            # $literal: a payload string such as "$x" must stay a string in a pipeline update.
            held = self._touch({"payload": {"$literal": payload}})
        except pymongo.errors.PyMongoError as exc:
            raise LeaseUnavailable(f"lease store unreachable: {exc.__class__.__name__}") from None
        if not held:
            raise LeaseLost(f"lease {self.token} on {self.resource} was lost (reaped or revoked)")

    def release(self) -> bool:
        """Give the slots back. Idempotent; True only for the call that actually released.

        A regular release never calls the type's handler: the holder cleans up itself.
        """
        if self._released:
            return False
        self._released = True
        return release_token(self.token, resource=self.resource)


class _NoopLease:
    """The lease of an unlimited resource: every operation succeeds without MongoDB."""

    is_noop = True
    token = None
    resource = None
    definition = None

    def __enter__(self) -> "_NoopLease":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def check(self) -> None:
        return None

    def update_payload(self, payload: dict[str, Any]) -> None:
        validation.payload(payload)

    def release(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<Lease NOOP>"


NOOP = _NoopLease()


def release_holder(query: dict[str, Any], *, resource: str | None = None) -> dict[str, Any] | None:
    """Delete the holder matching ``query`` (``findOneAndDelete``), then one bulk decrement.

    Only the one who deletes the holder decrements. A failed decrement is logged and left
    to reconcile; the holder is released all the same.

    Returns:
        The deleted holder (``levels``, ``resource``, ``tenantId``, ``projectId``), or
        ``None`` when nothing matched.

    Raises:
        pymongo.errors.PyMongoError: the delete failed; nothing was released.
    """
    doc = store.holders().find_one_and_delete(
        query, projection={"levels": 1, "resource": 1, "tenantId": 1, "projectId": 1})
    if doc is None:
        return None
    tag = metrics.resource_tag(doc.get("resource", resource or "unknown"))
    try:
        reaper.decrement(doc.get("levels") or ())
    except pymongo.errors.PyMongoError as exc:
        metrics.RELEASE.labels(resource=tag, outcome="error").inc()
        log.warning("release of %s: decrement failed (%s); reconcile corrects the counters", doc["_id"], exc)
        return doc
    metrics.RELEASE.labels(resource=tag, outcome="ok").inc()
    return doc


def release_token(token: str, *, resource: str | None = None) -> bool:
    """Release the holder ``token``: ``findOneAndDelete`` then one bulk decrement.

    Returns:
        True if this call deleted the holder, False if it was already gone.
    """
    try:
        doc = release_holder({"_id": token}, resource=resource)
    except pymongo.errors.PyMongoError as exc:
        metrics.RELEASE.labels(resource=metrics.resource_tag(resource or "unknown"), outcome="error").inc()
        log.warning("release of %s failed (%s); the idle reap returns the slot after its TTL", token, exc)
        return False
    if doc is None:
        metrics.RELEASE.labels(resource=metrics.resource_tag(resource or "unknown"), outcome="already-released").inc()
        return False
    return True


class _LevelFull(Exception):
    def __init__(self, spec: LevelSpec, server_now: Any = None):
        self.spec = spec
        self.server_now = server_now  # the failed holder's acquiredAt: MongoDB's clock


def _take_level(spec: LevelSpec, resource: str) -> bool:
    """Conditional ``$inc`` on one counter; creates a missing counter with a pure ``_id`` upsert."""
    counters = store.counters()
    update = {"$inc": {"count": 1}, "$currentDate": {"updatedAt": True}, "$set": {"cap": spec.cap}}
    if counters.update_one({"_id": spec.key, "count": {"$lt": spec.cap}}, update).matched_count:
        return True
    # Not matched: full, or the counter does not exist yet. An upsert inside the conditional
    # update would be wrong: a simultaneous first use would collide on _id and report Busy.
    # So: a pure _id upsert (a no-op when the counter exists, whoever created it), then the
    # conditional update a second time. Only that second miss means "full".
    try:
        counters.update_one(
            {"_id": spec.key},
            {"$setOnInsert": {"count": 0, "resource": resource, "level": spec.level, "scope": spec.scope,
                              "tenantId": spec.tenant_id, "cap": spec.cap}},
            upsert=True,
        )
    except pymongo.errors.DuplicateKeyError:
        pass  # another process created it at the same moment
    return bool(counters.update_one({"_id": spec.key, "count": {"$lt": spec.cap}}, update).matched_count)


def _rollback(token: str, taken_unregistered: str | None) -> None:
    """Undo a failed attempt: only the one who deletes the holder decrements its levels."""
    try:
        doc = store.holders().find_one_and_delete({"_id": token}, projection={"levels": 1})
        if doc is None:
            # A reaper took it and returned what it had registered; a counter we
            # incremented but never registered is left to reconcile.
            return
        levels = list(doc.get("levels") or ())
        if taken_unregistered is not None and taken_unregistered not in levels:
            levels.append(taken_unregistered)
        reaper.decrement(levels)
    except pymongo.errors.PyMongoError as exc:
        log.warning("rollback of %s failed (%s); idle reap and reconcile clean up", token, exc)


def _attempt(request: LeaseRequest, definition: LeaseDefinition, specs: list[LevelSpec], pod: str) -> Lease:
    token = secrets.token_urlsafe(24)
    holders = store.holders()
    ttl_ms = definition.ttl_seconds * 1000
    # Holder first (PENDING), on server time. $literal keeps user strings from being read
    # as field paths or operators by the pipeline.
    doc = holders.find_one_and_update(
        {"_id": token},
        [{"$set": {
            "state": "PENDING",
            "resource": {"$literal": definition.resource},
            "leaseName": {"$literal": definition.name},
            "type": {"$literal": request.type},
            "tenantId": {"$literal": request.tenant_id},
            "projectId": {"$literal": request.project_id},
            "userId": {"$literal": request.user_id},
            "holderRef": {"$literal": request.holder_ref},
            "pod": {"$literal": pod},
            "podBound": {"$literal": request.pod_bound},
            "ttlSeconds": {"$literal": definition.ttl_seconds},
            "levels": {"$literal": []},
            "payload": {"$literal": {}},
            "acquiredAt": "$$NOW",
            "lastSeenAt": "$$NOW",
            "expiresAt": store.now_plus_ms(ttl_ms),
        }}],
        upsert=True,
        projection={"acquiredAt": 1},
        return_document=ReturnDocument.AFTER,
    )
    taken: str | None = None
    try:
        registered: list[str] = []
        for index, spec in enumerate(specs):
            taken = None
            if not _take_level(spec, definition.resource):
                raise _LevelFull(spec, doc["acquiredAt"])
            taken = spec.key
            update: dict[str, Any] = {"$push": {"levels": spec.key}}
            if index == len(specs) - 1:
                update["$set"] = {"state": "HELD"}
            if not holders.update_one({"_id": token}, update).matched_count:
                # Reaped mid-funnel (a stall longer than the TTL): the push did not happen.
                reaper.decrement([spec.key])
                raise LeaseUnavailable(f"lease attempt on {definition.resource} was reaped mid-acquire")
            registered.append(spec.key)
            taken = None
        return Lease(token, definition, request, registered)
    except _LevelFull:
        _rollback(token, None)
        raise
    except pymongo.errors.PyMongoError as exc:
        _rollback(token, taken)
        raise LeaseUnavailable(f"lease store error mid-acquire: {exc.__class__.__name__}") from None
    except BaseException:
        _rollback(token, taken)
        raise


def _busy(definition: LeaseDefinition, spec: LevelSpec) -> LeaseBusy:
    count: int | None
    try:
        current = store.counters().find_one({"_id": spec.key}, {"count": 1})
        count = None if current is None else int(current.get("count", 0))
    except pymongo.errors.PyMongoError:
        count = None
    return LeaseBusy(resource=definition.resource, level=spec.level, scope=spec.scope, count=count, cap=spec.cap)


def resolve_definition(request: LeaseRequest) -> LeaseDefinition | None:
    """The definition an acquisition of ``request`` uses; ``None`` when no lease is referenced.

    Raises:
        InvalidDefinition: a refused inline definition.
        LeaseUnavailable: broken or unreadable configuration.
    """
    if request.inline is not None:
        return definitions.inline_definition(request.inline, request.tenant_id, request.project_id)
    if request.lease is None or request.lease == "":
        return None
    return definitions.resolve(request.lease, request.tenant_id, request.project_id)


def acquire(request: LeaseRequest) -> Lease | _NoopLease:
    """Acquire a slot at every capped level of the request's lease, waiting up to ``waitMs``.

    Returns:
        A :class:`Lease`, or ``NOOP`` (no MongoDB traffic) when no lease is referenced or the
        definition has no caps.

    Raises:
        InvalidLeaseRequest: bad input (nothing written); ``UnknownLeaseType`` for a type
            without handler; ``InvalidDefinition`` for a refused inline definition.
        LeaseBusy: a level stayed full for the whole wait.
        LeaseUnavailable: MongoDB unreachable or broken configuration (fail-closed).
    """
    if not isinstance(request, LeaseRequest):
        raise InvalidLeaseRequest("acquire() takes a LeaseRequest")
    request.validated()
    try:
        definition = resolve_definition(request)
    except LeaseUnavailable:
        metrics.ACQUIRE.labels(resource=request.lease or metrics.INLINE_RESOURCE_TAG, outcome="unavailable").inc()
        raise
    if definition is None or definition.is_noop:
        metrics.ACQUIRE.labels(resource=metrics.resource_tag(definition.resource) if definition else "none",
                               outcome="noop").inc()
        return NOOP
    tag = metrics.resource_tag(definition.resource)
    specs = definition.level_specs(request.tenant_id, request.project_id, request.user_id)
    pod = self_pod_id() if request.pod is None else request.pod
    wait_ms = definition.wait_ms if request.wait_ms is None else min(request.wait_ms, definition.wait_ms)
    deadline = time.monotonic() + wait_ms / 1000.0
    delay = POLL_MIN_S
    while True:
        try:
            lease = _attempt(request, definition, specs, pod)
        except _LevelFull as full:
            # Lazy idle reap, this resource only, when a level is full: a crashed holder's
            # slot comes back after its TTL even without the scheduled sweep, and the
            # uncontended path pays nothing for it. Server time comes from our own holder.
            try:
                reaped, _ = reaper.reap_idle(resource=definition.resource, now=full.server_now, limit=50)
            except pymongo.errors.PyMongoError:
                reaped = 0
            if reaped:
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                metrics.ACQUIRE.labels(resource=tag, outcome="busy").inc()
                raise _busy(definition, full.spec) from None
            # Jitter, so waiting pods do not race the counter in lockstep.
            time.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, POLL_MAX_S)
            continue
        except LeaseUnavailable:
            metrics.ACQUIRE.labels(resource=tag, outcome="unavailable").inc()
            raise
        except pymongo.errors.PyMongoError as exc:
            metrics.ACQUIRE.labels(resource=tag, outcome="unavailable").inc()
            raise LeaseUnavailable(f"lease store unreachable: {exc.__class__.__name__}") from None
        metrics.ACQUIRE.labels(resource=tag, outcome="success").inc()
        return lease
