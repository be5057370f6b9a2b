"""A booking given back to book again later frees the fence slot it recorded.

With ``fence:`` on a narrower level of cap >= 2, a newcomer books that level (recording its
entry on a slot), finds the gate full, gives the level back and queues; at its turn the same
entry books again, maybe on another slot. The give-back clears the slot it recorded in the
same update, so one booking never counts on two slots and the level keeps its capacity.
"""

from __future__ import annotations

import pytest

import leases
from leases.queue import fences
from leases.store import client as store, entries
from tests.helpers import define, lease_request, queue_up, quiet_handler_fixture

handler = quiet_handler_fixture()
GATE = "res|global|*"
PROJECT = "res|project|acme/p1"


@pytest.fixture
def blind_process():
    fences.forget()
    yield
    fences.forget()


def turn_on_slot(monkeypatch, slot: int):
    """From the moment the returned event is set, the next proposal of each entry names
    ``slot`` (as when this process's view, or a wake-up's hint, shows that slot free at the
    entry's turn); the booking's filter still decides whether it may take it."""
    import threading

    armed, forced = threading.Event(), set()
    real = fences.plan

    def plan(spec, entry, **kw):
        proposal = real(spec, entry, **kw)
        if armed.is_set() and entry not in forced:
            forced.add(entry)
            return fences.Plan(proposal.key, slot, proposal.generation, entry)
        return proposal

    monkeypatch.setattr(fences, "plan", plan)
    return armed


def slots_naming(key: str, token: str) -> list[str]:
    recorded = (store.counters().find_one({"_id": key}) or {}).get("fence") or {}
    return sorted(name for name, value in recorded.items() if entries.token_of(str(value.get("e") or "")) == token)


def test_given_a_fenced_narrower_level_when_a_newcomer_gives_it_back_and_books_again_then_one_slot_is_its(
        blind_process, monkeypatch):
    # Given: fence on the project level (cap 2) under a global cap of 2; p1/a holds project
    # slot 0, p2/b holds the second global slot.
    define("res", "levels: {global: 2, project: 2}\nfence: project\nwaitMs: 10000\nttlSeconds: 60")
    fences.note({"_id": PROJECT, "holders": [], "fence": {}})  # this process proposes slot 0 first
    a = leases.acquire(lease_request(user="a", pod=""))
    b = leases.acquire(lease_request(project="p2", user="b", pod=""))
    # When: p1/c books project slot 1 (the free one), finds the gate full, gives the project
    # level back and queues; a releases, and c books again at its turn, proposing slot 0.
    c = queue_up(lease_request(user="c", pod=""), GATE)
    turn_on_slot(monkeypatch, 0).set()
    a.release()
    c.join(10)
    assert c.lease is not None, c.error
    assert slots_naming(PROJECT, a.token) == []
    # Then: one fence slot names c's booking, not two.
    assert slots_naming(PROJECT, c.ticket) == ["s0"]
    # And when b releases, p1 holds 1/2 of its project and 1/2 of global: another p1 request
    # gets a lease at once.
    b.release()
    d = leases.acquire(lease_request(user="d", pod="", wait_ms=0))
    assert store.counters().find_one({"_id": PROJECT})["count"] == 2
    d.release()
    c.lease.release()


def test_given_a_grant_undone_at_a_full_narrower_level_then_the_gate_slot_it_recorded_names_it_no_more(monkeypatch):
    # Given: the gate fences (global 1, project 1); p1/h holds; p2/w is a kept ticket whose
    # grant books the project level in the grant's bulk; a p2 newcomer holds that level on
    # its way to the queue.
    from leases import service
    from tests.engine.test_kept_stranded import newcomer_on_its_way

    define("res", "levels: {global: 1, project: 1}\nwaitMs: 10000\nttlSeconds: 60")
    held = leases.acquire(lease_request(user="h", pod=""))
    ticket = service.acquire_or_ticket(lease_request(project="p2", user="w", pod="", wait_ms=0), keep_ms=10000)
    assert isinstance(ticket, service.Ticket)
    go, newcomer, _ = newcomer_on_its_way(monkeypatch)
    # When: h releases; the grant books the gate for w (recording slot 0), finds the project
    # level full and is undone (w queued again, with the same entry).
    held.release()
    assert [t["id"] for t in store.counters().find_one({"_id": GATE}).get("queue") or ()] == [ticket.id]
    # Then: no fence slot names w's entry any more (its next grant may take another slot).
    assert slots_naming(GATE, ticket.id) == []
    go.set()
    newcomer.join(10)
    lease = service.resume(ticket.id, scope={"tenantId": "acme"}, keep_ms=10000)
    assert isinstance(lease, service.Lease)
    assert slots_naming(GATE, ticket.id) == ["s0"]
    lease.release()
