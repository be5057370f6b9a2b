"""Session-wide MongoDB for the test suite.

Order of events (pytest-django imports DJANGO_SETTINGS_MODULE in its
``pytest_load_initial_conftests`` hook, *before* this file is imported):

1. pytest-django imports ``config.settings_test``; when ``MONGODB_URI`` is unset that
   module calls ``leases.store.embedded.ensure_test_server()``, which spawns ONE in-memory
   ``secantusd-py`` process and exports ``MONGODB_URI`` (children inherit it). With
   ``MONGODB_URI`` set, that server is used instead and nothing is spawned.
2. This conftest is imported (the fallback below covers runs where settings were not
   loaded yet, e.g. ``-p no:django``).
3. The first test pulls pytest-django's session-scoped ``django_db_setup``: the test
   database ``test_<MONGODB_DB>`` (``test_leases``) is dropped and migrated.
4. Before every test, ``_fresh_lease_store`` empties every collection except
   django_migrations / django_content_type / auth_permission (indexes are kept), and
   unblocks Django DB access for the test.
5. ``pytest_unconfigure`` stops the server.

Writing tests:

* pymongo: use the ``mongo_db`` fixture (``pymongo.database.Database`` of the test DB);
  no marker needed.
* ORM: plain test functions may use the ORM (access is unblocked for every test, and
  isolation comes from the pre-test cleanup, not from transactions, which MongoDB/Django
  lack here). ``@pytest.mark.django_db`` / ``@pytest.mark.django_db(transaction=True)``
  work as well; both behave like TransactionTestCase on this backend (flush afterwards).
"""

from __future__ import annotations

import os
import sys

import pytest

from leases.store import embedded

# Fallback: settings not imported yet (pytest-django disabled or DSM not configured).
embedded.ensure_test_server()

KEEP_COLLECTIONS = frozenset({"django_migrations", "django_content_type", "auth_permission"})


def pytest_report_header(config):
    server = embedded.current_test_server()
    if server is not None:
        return [f"mongodb: embedded SecantusDB pid={server.pid} {server.uri} (log {server.log_path})"]
    return [f"mongodb: external {os.environ.get('MONGODB_URI', '?')}"]


def pytest_unconfigure(config):
    embedded.stop_test_server()


@pytest.fixture(scope="session")
def mongo_uri() -> str:
    from django.conf import settings

    return settings.MONGODB_URI


@pytest.fixture(scope="session")
def _mongo_client(mongo_uri):
    import pymongo

    client = pymongo.MongoClient(mongo_uri, serverSelectionTimeoutMS=5000, tz_aware=False)
    yield client
    client.close()


@pytest.fixture(scope="session")
def mongo_db(django_db_setup, _mongo_client):
    """The pymongo Database of the (migrated) test database, e.g. ``test_leases``."""
    from django.db import connections

    return _mongo_client[connections["default"].settings_dict["NAME"]]


def _non_empty(database, names: list[str]) -> list[str]:
    """Which of ``names`` hold at least one document, in one command: a ``$limit: 1`` of each
    collection, unioned. A test touches a few collections of the dozens the suite creates, and
    each command to the embedded server is a round trip of milliseconds; a ``delete_many`` on
    every collection before each of the ~1,500 tests was most of the per-test set-up time."""
    if not names:
        return []

    def first(name: str) -> list[dict]:
        return [{"$limit": 1}, {"$project": {"_id": 0, "c": {"$literal": name}}}]

    pipeline = first(names[0]) + [{"$unionWith": {"coll": name, "pipeline": first(name)}} for name in names[1:]]
    return [doc["c"] for doc in database[names[0]].aggregate(pipeline)]


def _empty_collections(database) -> None:
    names = [name for name in database.list_collection_names()
             if name not in KEEP_COLLECTIONS and not name.startswith("system.")]
    # A write by another thread or process after the union looked is left, as one after the
    # old one-by-one loop had passed its collection was: the clean-up was never atomic.
    for name in _non_empty(database, names):
        database[name].delete_many({})


@pytest.fixture(autouse=True)
def _fresh_lease_store(mongo_db, django_db_blocker):
    """Each test starts with empty lease/config/pod/holder/counter (and user) collections."""
    _empty_collections(mongo_db)
    with django_db_blocker.unblock():
        yield


@pytest.fixture(scope="session", autouse=True)
def _adoption_installs_early(request, tmp_path_factory):
    """Start tests/test_adoption.py's installs (two venvs, pip) at the session's first test,
    for the series whose adoption test is among the selected ones, so that they run beside
    the rest of the suite instead of before that module's tests: the suite mostly waits (on
    sleeps, bounds and child processes) and pip fits in beside it."""
    adoption = sys.modules.get("tests.test_adoption")  # imported when collected
    if adoption is not None:
        adoption.start_installs(tmp_path_factory, adoption.selected_series(request.session.items))
    yield
    if adoption is not None:
        adoption.stop_installs()


@pytest.fixture
def pod_settings(settings):
    """The pod-lease bounds the pod tests reason about (interval 10 s in [2, 60], factor 3)."""
    settings.LEASES_POD_INTERVAL_SECONDS = 10
    settings.LEASES_POD_INTERVAL_MIN = 2
    settings.LEASES_POD_INTERVAL_MAX = 60
    settings.LEASES_POD_EXPIRY_FACTOR = 3
    return settings
