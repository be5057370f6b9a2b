"""leases.store.client against a replica set: the options the engine needs, whatever the URI says.

The embedded server runs here in its single-node replica-set mode (a set named
``secantus`` with an oplog), reached through replica-set discovery like a production URI.
"""

from __future__ import annotations

import pytest
from django.test import override_settings
from pymongo import ReadPreference

import leases
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.revocation import handlers
from leases.store import client as store
from leases.store.embedded import start_server
from tests.helpers import discard_server


class Quiet(handlers.LeaseHandler):
    type = "rstest"

    def on_revoked(self, holder):
        pass


@pytest.fixture(scope="module")
def replica_set():
    server = start_server(":memory:", replica_set=True)
    try:
        yield server
    finally:
        discard_server(server)


@pytest.fixture
def engine_on(replica_set):
    """The engine's client built from a replica-set URI that asks for less than it needs."""
    handlers.register_handler(Quiet())
    uri = replica_set.uri + "&w=1&readPreference=secondaryPreferred&retryWrites=false"
    with override_settings(MONGODB_URI=uri):
        store.reset()
        try:
            yield store.client()
        finally:
            store.reset()
            handlers.unregister_handler("rstest")


def test_given_a_replica_set_uri_asking_for_w1_and_secondary_reads_then_the_engine_client_uses_majority_and_primary(engine_on):
    client = engine_on
    client.admin.command("ping")  # discovery happens on first use
    assert client.topology_description.topology_type_name == "ReplicaSetWithPrimary"
    assert client.write_concern.document == {"w": "majority"}
    assert client.read_preference == ReadPreference.PRIMARY
    assert client.options.retry_writes is True and client.options.retry_reads is True


def test_given_a_single_node_replica_set_when_acquiring_checking_and_releasing_then_the_grant_is_in_the_oplog(engine_on):
    client = engine_on
    config.put_document("_vance", "_tenant", document_path("rslease"),
                        "resource: rsres\nlevels: {global: 1, tenant: 1, user: 1}\nttlSeconds: 60")
    request = leases.LeaseRequest(type="rstest", lease="rslease", tenant_id="acme", project_id="docs",
                                  user_id="alice", pod="")
    lease = leases.acquire(request)
    lease.check()
    with pytest.raises(leases.LeaseBusy):
        leases.acquire(leases.LeaseRequest(**{**request.__dict__, "user_id": "bob", "wait_ms": 0}))
    assert client.admin.command("hello")["setName"] == "secantus"
    holders_ns = f"{store.database_name()}.{store.HOLDERS}"
    assert client.local["oplog.rs"].find_one({"ns": holders_ns, "o._id": lease.token}) is not None
    lease.release()
    assert store.holders().find_one({"_id": lease.token}) is None


def test_given_a_single_node_replica_set_when_acquiring_from_asyncio_then_the_async_client_has_the_same_options(engine_on):
    import asyncio

    from leases import aio

    config.put_document("_vance", "_tenant", document_path("rslease"),
                        "resource: rsres\nlevels: {global: 1, tenant: 1, user: 1}\nttlSeconds: 60")

    async def cycle():
        async_client = store.async_client()
        assert async_client.write_concern.document == {"w": "majority"}
        assert async_client.read_preference == ReadPreference.PRIMARY
        try:
            async with leases.aacquire(leases.LeaseRequest(type="rstest", lease="rslease", tenant_id="acme",
                                                           project_id="docs", user_id="alice", pod="")) as lease:
                await lease.acheck()
                return lease.token
        finally:
            await aio.aclose()

    token = asyncio.run(cycle())
    assert store.holders().find_one({"_id": token}) is None
    assert engine_on.local["oplog.rs"].find_one({"ns": f"{store.database_name()}.{store.HOLDERS}", "o._id": token})
