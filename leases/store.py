"""MongoDB access for the lease hot path: one pymongo client per process, bounded timeouts.

The Django ORM maps the same collections (``leases.models``) for the admin and the views;
the engine talks to pymongo directly because acquisition needs exact, atomic conditional
updates. Every time the engine compares against "now" it uses MongoDB's clock.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime
from typing import Any

import pymongo
from pymongo.collection import Collection
from pymongo.database import Database

HOLDERS = "resource_lease_holders"
COUNTERS = "resource_lease_counters"
CONFIG_DOCUMENTS = "lease_config_documents"
PODS = "lease_pods"
AUDIT = "lease_audit"
TOMBSTONES = "lease_tombstones"
TOMBSTONE_SECONDS = 7 * 24 * 3600

_lock = threading.Lock()
_client: pymongo.MongoClient | None = None
_client_pid: int | None = None
_client_override: pymongo.MongoClient | None = None
_indexed: set[str] = set()


def _settings() -> tuple[str, int]:
    from leases.conf import lease_settings

    return lease_settings.MONGODB_URI, int(lease_settings.MONGO_TIMEOUT_MS)


def database_name() -> str:
    """The database the engine shares with Django (the test database under pytest)."""
    from django.db import connections

    return connections["default"].settings_dict["NAME"]


def client() -> pymongo.MongoClient:
    """The process's pymongo client; recreated after ``fork`` (pymongo is not fork-safe)."""
    global _client, _client_pid
    if _client_override is not None:
        return _client_override
    pid = os.getpid()
    if _client is None or _client_pid != pid:
        with _lock:
            if _client is None or _client_pid != pid:
                uri, timeout_ms = _settings()
                # timeoutMS bounds every operation (client-side operation timeout), so an
                # unreachable server answers LeaseUnavailable in about this time instead of
                # pymongo's 30 s server-selection default.
                _client = pymongo.MongoClient(
                    uri,
                    timeoutMS=timeout_ms,
                    serverSelectionTimeoutMS=timeout_ms,
                    connectTimeoutMS=timeout_ms,
                    tz_aware=False,
                    appname="django-leases",
                )
                _client_pid = pid
    return _client


def set_client(new_client: pymongo.MongoClient | None) -> None:
    """Use ``new_client`` instead of the settings-built one (benchmarks add command listeners)."""
    global _client_override
    _client_override = new_client


def reset() -> None:
    """Forget the cached client and index state (after settings change in tests)."""
    global _client, _client_pid
    with _lock:
        if _client is not None and _client_pid == os.getpid():
            _client.close()
        _client = None
        _client_pid = None
        _indexed.clear()


def db() -> Database:
    """The lease database, with indexes ensured once per process and database."""
    database = client()[database_name()]
    if database.name not in _indexed:
        ensure_indexes(database)
    return database


def holders() -> Collection:
    return db()[HOLDERS]


def counters() -> Collection:
    return db()[COUNTERS]


def config_documents() -> Collection:
    return db()[CONFIG_DOCUMENTS]


def pods() -> Collection:
    return db()[PODS]


def audit() -> Collection:
    return db()[AUDIT]


def tombstones() -> Collection:
    return db()[TOMBSTONES]


def ensure_indexes(database: Database | None = None) -> None:
    """Create the engine's indexes; idempotent, run lazily once per process.

    Reaping is index-backed: the idle sweep walks ``expiresAt`` (globally or per resource),
    the pod sweep walks ``pod``, reconcile and the BOOKED column walk ``levels``.
    """
    database = database if database is not None else client()[database_name()]
    h = database[HOLDERS]
    h.create_index([("resource", 1), ("expiresAt", 1)], name="resource_expiresAt")
    h.create_index([("expiresAt", 1)], name="expiresAt")
    h.create_index([("pod", 1)], name="pod")
    h.create_index([("levels", 1)], name="levels")
    h.create_index([("tenantId", 1), ("acquiredAt", -1)], name="tenant_acquiredAt")
    database[COUNTERS].create_index([("tenantId", 1), ("resource", 1)], name="tenant_resource")
    database[CONFIG_DOCUMENTS].create_index(
        [("tenantId", 1), ("projectId", 1), ("path", 1)], name="tenant_project_path", unique=True
    )
    database[TOMBSTONES].create_index([("at", 1)], name="at_ttl", expireAfterSeconds=TOMBSTONE_SECONDS)
    database[AUDIT].create_index([("tenantId", 1), ("at", -1)], name="tenant_at")
    from . import history  # its TTL follows LEASES_HISTORY_HOURS

    history.ensure_index(database)
    _indexed.add(database.name)


def server_now() -> datetime:
    """MongoDB's clock (``hello.localTime``), the only clock TTLs are decided by.

    Raises:
        pymongo.errors.PyMongoError: the server is unreachable.
    """
    return client().admin.command("hello")["localTime"]


def now_plus_ms(ms: int) -> dict[str, Any]:
    """Aggregation expression ``$$NOW + ms`` for pipeline updates (server-side time)."""
    return {"$add": ["$$NOW", int(ms)]}
