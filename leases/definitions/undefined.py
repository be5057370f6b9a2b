"""Lease names acquired that no layer defines: recorded cheaply, listed for operators.

By the spec an undefined name acquires ``NOOP`` (unlimited), so a misspelt ``lease="txe"``
runs unprotected with nothing but a log line. Each process records such a name at most once
per :data:`RECORD_INTERVAL_S` per (tenant, name), in one upsert that carries MongoDB's clock,
so Insights and ``manage.py lease undefined`` can list the names acquired in the last hour.
A defined lease never comes here: its hot path is unchanged. The record is best effort: a
store error is logged and never fails (or delays past a short bound) the acquisition.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pymongo
import pymongo.errors

from .. import ids
from ..errors import LeaseError
from ..ids import validation
from ..store import client as store

log = logging.getLogger(__name__)

COLLECTION = "lease_undefined_names"
# One record per (tenant, name) per process and interval: a hot loop on a misspelt name
# costs one write a minute, not one per acquisition.
RECORD_INTERVAL_S = 60.0
# Names a process remembers having recorded; past this it forgets them all (a flood of
# distinct names then costs at most one write per name and interval, never unbounded memory).
MAX_REMEMBERED = 1024
# The record must not hold up a NOOP acquisition behind a slow store.
RECORD_TIMEOUT_S = 0.25
# Records are dropped by a TTL index a day after their last acquisition.
KEEP_SECONDS = 24 * 3600
LISTED_WINDOW = timedelta(hours=1)
MAX_LISTED = 200

_lock = threading.Lock()
_recorded: dict[tuple[str, str, str], float] = {}


def ensure_index(database: Any) -> None:
    """The TTL index that drops a record a day after the name was last acquired."""
    database[COLLECTION].create_index([("lastAt", 1)], name="lastAt_ttl", expireAfterSeconds=KEEP_SECONDS)


store.register_indexes(ensure_index)


def _due(key: tuple[str, str, str]) -> bool:
    now = time.monotonic()
    with _lock:
        last = _recorded.get(key)
        if last is not None and now - last < RECORD_INTERVAL_S:
            return False
        if len(_recorded) >= MAX_REMEMBERED:
            _recorded.clear()
        _recorded[key] = now  # before the write: a failing store is not retried on every call
        return True


def forget() -> None:
    """Forget what this process recorded (tests; the next acquisition records again)."""
    with _lock:
        _recorded.clear()


def record(name: str, tenant_id: str, project_id: str) -> None:
    """Note that ``name`` (defined by no layer) was acquired in (tenant, project); rate-limited.

    Never raises: a store error is logged and the acquisition goes on.
    """
    if not _due((store.database_name(), tenant_id, name)):
        return
    try:
        with pymongo.timeout(RECORD_TIMEOUT_S):
            store.db()[COLLECTION].update_one(
                {"_id": f"{ids.encode(tenant_id)}|{name}"},
                # $literal: ids are plain strings, never field paths.
                [{"$set": {"name": {"$literal": name}, "tenantId": {"$literal": tenant_id},
                           "projectId": {"$literal": project_id}, "lastAt": "$$NOW",
                           "firstAt": {"$ifNull": ["$firstAt", "$$NOW"]},
                           "records": {"$add": [{"$ifNull": ["$records", 0]}, 1]}}}],
                upsert=True)
    except pymongo.errors.PyMongoError as exc:
        log.warning("could not record undefined lease %s (%s): %s", name, tenant_id, exc.__class__.__name__)


@dataclass(frozen=True)
class UndefinedName:
    """A lease name no layer defines that a tenant acquired; ``records`` counts the
    rate-limited records (at most one per process and minute), not acquisitions."""

    name: str
    tenant_id: str
    project_id: str
    first_at: datetime | None
    last_at: datetime
    records: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tenantId": self.tenant_id, "projectId": self.project_id,
                "firstAt": self.first_at, "lastAt": self.last_at, "records": self.records}


def recent(tenant_id: str | None = None, window: timedelta = LISTED_WINDOW) -> list[UndefinedName]:
    """Undefined names acquired within ``window`` (an hour) on MongoDB's clock, newest first;
    one tenant's only with ``tenant_id``. A name defined since is left out.

    Raises:
        InvalidLeaseRequest: a malformed ``tenant_id``.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    from . import model as definitions

    query: dict[str, Any] = {"lastAt": {"$gte": store.server_now() - window}}
    if tenant_id is not None:
        query["tenantId"] = validation.entity_id(tenant_id, "tenant id")
    docs = list(store.db()[COLLECTION].find(query).sort([("lastAt", -1), ("_id", 1)]).limit(MAX_LISTED))
    out = []
    for doc in docs:
        name, tenant, project = doc.get("name", ""), doc.get("tenantId", ""), doc.get("projectId", "")
        try:
            if definitions.resolve(name, tenant, project).defined:
                continue  # someone defined it since: nothing to fix any more
        except LeaseError:
            pass  # a broken layer or a stale id still lists the name; the load says why elsewhere
        out.append(UndefinedName(name=name, tenant_id=tenant, project_id=project, first_at=doc.get("firstAt"),
                                 last_at=doc["lastAt"], records=int(doc.get("records") or 0)))
    return out
