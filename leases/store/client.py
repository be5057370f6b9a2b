"""MongoDB access for the lease hot path: one pymongo client per process, bounded timeouts.

The Django ORM maps the same collections (``leases.models``) for the admin and the views;
the engine talks to pymongo directly because acquisition needs exact, atomic conditional
updates. Every time the engine compares against "now" it uses MongoDB's clock.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Callable
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
#: One heartbeat document per waiting process (leases.queue.presence).
PRESENCE = "lease_presence"
#: The tickets of a long queue beyond its gate's head (leases.queue.backlog).
TICKETS = "lease_tickets"
TOMBSTONE_SECONDS = 7 * 24 * 3600

# What the engine needs from MongoDB, set on its client whatever the URI says (keyword
# options win over the URI's): a grant is acknowledged only once a majority of the replica set
# has it, so a failover cannot roll back a slot a caller already holds; the funnel reads its
# counters and holders from the primary (a secondary may lag behind a grant, and a stale read
# there would let a cap be exceeded); a write or read that meets a failover is retried once on
# the new primary instead of surfacing as an error. On a standalone server these cost nothing.
# leases.checks warns when MONGODB_URI asks for something else.
REQUIRED_CLIENT_OPTIONS: dict[str, Any] = {
    "w": "majority",
    "readPreference": "primary",
    "retryWrites": True,
    "retryReads": True,
}

_lock = threading.Lock()
_client: pymongo.MongoClient | None = None
_client_pid: int | None = None
_client_override: pymongo.MongoClient | None = None
_indexed: set[str] = set()
# Collections owned by higher layers (the history recorder's, the undefined-names record)
# register the function that creates their indexes (register_indexes), so the store runs it
# with its own and never imports them: the store stays the bottom of the import order.
_index_hooks: list[Callable[[Database], None]] = []


def _settings() -> tuple[str, int]:
    from leases.conf import lease_settings

    return lease_settings.MONGODB_URI, int(lease_settings.MONGO_TIMEOUT_MS)


def database_name() -> str:
    """The database the engine shares with the lease apps' models (the test database under pytest).

    That is the ``NAME`` of the alias ``LEASES_DATABASE`` names (``default`` unless the host
    routes the lease apps to a MongoDB alias of their own).
    """
    from django.db import connections

    from leases.conf import lease_settings

    return connections[lease_settings.DATABASE].settings_dict["NAME"]


def client() -> pymongo.MongoClient:
    """The process's pymongo client; recreated after ``fork`` (pymongo is not fork-safe)."""
    global _client, _client_pid
    if _client_override is not None:
        return _client_override
    pid = os.getpid()
    if _client is None or _client_pid != pid:
        with _lock:
            if _client is None or _client_pid != pid:
                uri, options = client_options()
                _client = pymongo.MongoClient(uri, **options)
                _client_pid = pid
    return _client


def where(uri: str | None = None) -> str:
    """The host(s) a MongoDB URI names, for error messages: ``127.0.0.1:27018``, never its credentials.

    The URI's user and password (before ``@``), database and options are cut off, so a
    message that says which store it could not reach leaks nothing an operator must not see.
    A URI that does not parse says ``an unparsable MONGODB_URI`` rather than echoing it.
    """
    if uri is None:
        uri = _settings()[0]
    scheme, sep, rest = (uri or "").partition("://")
    if not sep or scheme not in {"mongodb", "mongodb+srv"}:
        return "an unparsable MONGODB_URI" if uri else "an empty MONGODB_URI"
    hosts = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    return hosts or "an unparsable MONGODB_URI"


def unreachable(what: str, exc: BaseException, during: str = "") -> str:
    """The message of a ``LeaseUnavailable`` for a store that did not answer: names the host tried.

    ``unreachable("lease store", exc, " during release")`` →
    ``lease store unreachable at 127.0.0.1:27018 during release: ServerSelectionTimeoutError``.
    """
    return f"{what} unreachable at {where()}{during}: {exc.__class__.__name__}"


def client_options() -> tuple[str, dict[str, Any]]:
    """The URI and options of the engine's clients, sync and async alike."""
    uri, timeout_ms = _settings()
    # timeoutMS bounds every operation (client-side operation timeout), so an unreachable
    # server answers LeaseUnavailable in about this time instead of pymongo's 30 s
    # server-selection default.
    return uri, {"timeoutMS": timeout_ms, "serverSelectionTimeoutMS": timeout_ms,
                 "connectTimeoutMS": timeout_ms, "tz_aware": False, "appname": "django-leases",
                 **REQUIRED_CLIENT_OPTIONS}


# One async client per event loop: an AsyncMongoClient must not be shared across loops.
_async_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, pymongo.AsyncMongoClient]]" = (
    weakref.WeakKeyDictionary())


_async_factory: Callable[[], pymongo.AsyncMongoClient] | None = None


def async_client() -> pymongo.AsyncMongoClient:
    """The running event loop's async client (created on first use in that loop)."""
    loop = asyncio.get_running_loop()
    pid = os.getpid()
    known = _async_clients.get(loop)
    if known is None or known[0] != pid:
        if _async_factory is not None:
            made = _async_factory()
        else:
            uri, options = client_options()
            made = pymongo.AsyncMongoClient(uri, **options)
        known = (pid, made)
        _async_clients[loop] = known
    return known[1]


def set_async_client_factory(factory: Callable[[], pymongo.AsyncMongoClient] | None) -> None:
    """Build each loop's async client with ``factory`` (benchmarks add command listeners);
    None goes back to the settings-built client. Clients already made stay until closed."""
    global _async_factory
    _async_factory = factory


async def aclose() -> None:
    """Close the running event loop's async client (call it before the loop ends)."""
    known = _async_clients.pop(asyncio.get_running_loop(), None)
    if known is not None and known[0] == os.getpid():
        await known[1].close()


def async_db() -> "pymongo.asynchronous.database.AsyncDatabase":
    """The lease database on the running loop's async client. Indexes are ensured by the
    sync :func:`db` (the async executor calls it once per process from a thread)."""
    return async_client()[database_name()]


def indexed() -> bool:
    """Whether this process has ensured the indexes of the lease database."""
    return database_name() in _indexed


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


_index_lock = threading.RLock()


def db() -> Database:
    """The lease database, with indexes ensured once per process and database."""
    database = client()[database_name()]
    if database.name not in _indexed:
        with _index_lock:  # the threads of a process starting at once ensure them once
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


def presence() -> Collection:
    return db()[PRESENCE]


def tickets() -> Collection:
    return db()[TICKETS]


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
    database[TICKETS].create_index([("g", 1), ("at", 1)], name="gate_at")
    for ensure in tuple(_index_hooks):  # e.g. history's TTL, which follows LEASES_HISTORY_HOURS
        ensure(database)
    _indexed.add(database.name)


def register_indexes(ensure: Callable[[Database], None]) -> None:
    """Have :func:`ensure_indexes` also run ``ensure`` (idempotent index creation of a
    collection a higher layer owns); registering the same function twice runs it once.

    The owners register when imported, and importing any ``leases`` module imports the
    package, which imports the engine and with it every owner, so no database is indexed
    before they are registered.
    """
    if ensure not in _index_hooks:
        _index_hooks.append(ensure)


def bounded() -> Any:
    """One store timeout (``LEASES_MONGO_TIMEOUT_MS``) for a whole step of several commands
    (an attempt with its rollback, a release with its give-back): an outage ends the step
    within this bound instead of once per command."""
    return pymongo.timeout(_settings()[1] / 1000.0)


def server_now() -> datetime:
    """MongoDB's clock (``hello.localTime``), the only clock TTLs are decided by.

    Raises:
        pymongo.errors.PyMongoError: the server is unreachable.
    """
    return client().admin.command("hello")["localTime"]


def now_plus_ms(ms: int) -> dict[str, Any]:
    """Aggregation expression ``$$NOW + ms`` for pipeline updates (server-side time)."""
    return {"$add": ["$$NOW", int(ms)]}
