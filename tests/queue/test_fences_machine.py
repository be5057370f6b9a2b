"""A hypothesis state machine over the ways a slot is granted and ends (leases.queue.fences):
acquire, release, reap, revoke, repair, reconcile, cap change and a server restart (the
embedded server stopped and started again on the same storage, with fresh clients and a
process that has forgotten every counter it saw).

Invariants after every step: a fence is never issued twice; each grant of a (counter,
slot) has a generation above every earlier one of it; no two live holders share a
(counter, slot); the counter records each live holder's entry and generation on its slot.
"""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule

import leases
from leases.definitions import layers as config, model as definitions
from leases.definitions.model import document_path
from leases.queue import fences, waiting
from leases.store import client as store, fence_codec
from leases.store.embedded import start_server
from leases.upkeep import reaper, sweeps
from tests.helpers import quiet_handler_fixture

handler = quiet_handler_fixture()
GATE = "res|global|*"
USERS = [("acme", "a1"), ("acme", "a2"), ("beta", "b1"), ("beta", "b2"), ("gamma", "g1")]


class Server:
    """A private embedded server on a storage directory, restartable in place."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="fences-machine-")
        self.server = start_server(self.path)

    def restart(self, django_settings) -> None:
        port = self.server.port
        self.server.stop()
        self.server = start_server(self.path, port=port)
        django_settings.MONGODB_URI = self.server.uri
        store.reset()


@pytest.fixture
def private_server(settings):
    server = Server()
    settings.MONGODB_URI = server.server.uri
    settings.LEASES_REPAIR_INTERVAL_MS = 0
    store.reset()
    definitions.cache.clear()
    fences.forget()
    try:
        yield server
    finally:
        store.reset()
        server.server.stop()
        definitions.cache.clear()
        fences.forget()


def put_caps(global_cap: int) -> None:
    config.put_document("_vance", "_tenant", document_path("res"),
                        f"levels: {{global: {global_cap}, tenant: 2}}\nttlSeconds: 60")
    definitions.cache.clear()


def run_machine(server: Server, django_settings) -> None:
    class Fences(RuleBasedStateMachine):
        held = Bundle("held")

        def __init__(self) -> None:
            super().__init__()
            for name in (store.HOLDERS, store.COUNTERS, store.TOMBSTONES):
                store.db()[name].delete_many({})
            fences.forget()
            put_caps(2)
            self.cap = 2
            self.issued: set[str] = set()
            self.newest: dict[tuple[str, int], int] = {}
            self.live: dict[str, leases.Lease] = {}
            self.restarts = 0

        def granted(self, lease: leases.Lease) -> leases.Lease:
            fence = fence_codec.decode(lease.fence)
            assert lease.fence not in self.issued, "a fence was issued twice"
            slot = (fence.counter, fence.slot)
            assert fence.generation > self.newest.get(slot, 0), "a slot's generation went back"
            assert fence.slot < self.cap, "a grant took a slot above the cap"
            self.issued.add(lease.fence)
            self.newest[slot] = fence.generation
            self.live[lease.token] = lease
            return lease

        def ended(self, lease: leases.Lease) -> None:
            self.live.pop(lease.token, None)

        @rule(target=held, who=st.sampled_from(USERS))
        def acquire(self, who):
            tenant, user = who
            try:
                lease = leases.acquire(leases.LeaseRequest(type="test", lease="res", tenant_id=tenant,
                                                           project_id="p1", user_id=user, pod=""))
            except leases.LeaseBusy:
                return None
            assert isinstance(lease, leases.Lease)
            return self.granted(lease)

        def live_one(self, lease):
            return lease is not None and lease.token in self.live

        @rule(lease=consumes(held))
        def release(self, lease):
            if self.live_one(lease):
                lease.release()
                self.ended(lease)

        @rule(lease=consumes(held))
        def reap(self, lease):
            if self.live_one(lease):
                store.holders().update_one({"_id": lease.token},
                                           [{"$set": {"expiresAt": {"$subtract": ["$$NOW", 1000]}}}])
                reaper.reap_idle()
                self.ended(lease)

        @rule(lease=consumes(held))
        def revoke(self, lease):
            if self.live_one(lease):
                reaper.reap({"_id": lease.token}, "revoke")
                self.ended(lease)

        @rule(lease=consumes(held))
        def repair(self, lease):
            # The holder vanished without its pull (a crash mid-release); repair returns it.
            if self.live_one(lease):
                store.holders().delete_one({"_id": lease.token})
                self.ended(lease)
                doc = waiting.read_gate(GATE)
                waiting.repair(doc, doc["clock"])

        @rule(lease=consumes(held))
        def reconcile(self, lease):
            if self.live_one(lease):
                store.holders().delete_one({"_id": lease.token})
                self.ended(lease)
            sweeps.reconcile(safety_ms=0)

        @rule(cap=st.integers(min_value=1, max_value=4))
        def change_cap(self, cap):
            put_caps(cap)
            self.cap = cap

        @precondition(lambda self: self.restarts < 1)
        @rule()
        def restart_server(self):
            self.restarts += 1
            before = store.counters().find_one({"_id": GATE})
            server.restart(django_settings)
            definitions.cache.clear()
            fences.forget()  # a new process: it has seen no counter
            # The storage is reopened intact, so the slots' generations came back with it.
            assert store.counters().find_one({"_id": GATE}) == before

        @invariant()
        def live_holders_have_their_own_slots_as_recorded(self):
            seen: set[tuple[str, int]] = set()
            gate = store.counters().find_one({"_id": GATE}) if self.live else None
            for lease in self.live.values():
                fence = fence_codec.decode(lease.fence)
                assert (fence.counter, fence.slot) not in seen, "two live holders share a slot"
                seen.add((fence.counter, fence.slot))
                assert gate is not None
                assert gate["fence"][f"s{fence.slot}"] == {"e": lease._booking(), "g": fence.generation}

    Fences.TestCase.settings = settings(max_examples=8, stateful_step_count=25, deadline=None,
                                        suppress_health_check=list(HealthCheck))
    Fences.TestCase().runTest()


def test_fences_never_repeat_and_slots_only_grow_over_every_ending_and_a_restart(private_server, settings):
    run_machine(private_server, settings)
