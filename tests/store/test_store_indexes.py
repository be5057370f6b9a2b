"""leases.store.client's index seam: collections of higher layers register their indexes.

The store is the bottom layer, so it may not import the history recorder or the
undefined-names record; they hand it their index functions (``register_indexes``) when
imported, and importing any ``leases`` module imports them.
"""

from __future__ import annotations

import os
import subprocess
import sys

from leases.definitions import undefined
from leases.store import client as store
from leases.telemetry import history


def _index_names(database, collection):
    return {index["name"] for index in database[collection].list_indexes()}


def test_given_a_fresh_database_when_the_store_ensures_its_indexes_then_the_registered_collections_get_theirs(
        _mongo_client):
    # Given: a database nobody indexed yet
    database = _mongo_client["test_leases_index_seam"]
    try:
        # When
        store.ensure_indexes(database)
        # Then: the history's TTL and the undefined record's TTL exist beside the store's own
        assert history.TTL_INDEX in _index_names(database, history.COLLECTION)
        assert "lastAt_ttl" in _index_names(database, undefined.COLLECTION)
        assert "expiresAt" in _index_names(database, store.HOLDERS)
    finally:
        _mongo_client.drop_database(database.name)


def test_given_a_function_registered_twice_when_indexes_are_ensured_then_it_runs_once(_mongo_client, monkeypatch):
    # Given
    calls = []
    monkeypatch.setattr(store, "_index_hooks", list(store._index_hooks))
    store.register_indexes(calls.append)
    store.register_indexes(calls.append)
    database = _mongo_client["test_leases_index_twice"]
    try:
        # When
        store.ensure_indexes(database)
        # Then
        assert [d.name for d in calls] == [database.name]
    finally:
        _mongo_client.drop_database(database.name)


def test_given_a_process_that_imports_only_the_store_then_history_and_undefined_are_registered():
    # Given / When: a fresh interpreter importing nothing but the store client
    code = ("from leases.store import client as store\n"
            "print(sorted(f.__module__ for f in store._index_hooks))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings_test"}).stdout
    # Then: the package import brought in both owners, so no database is indexed without them
    assert out.strip() == "['leases.definitions.undefined', 'leases.telemetry.history']"

