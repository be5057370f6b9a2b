"""leases.upkeep.rounds: the operator's on-demand rounds (reconcile until done, a sweep with no handler).

Against the embedded store; the ``optest`` type's recording handler shows whether a handler ran.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from leases.errors import InvalidLeaseRequest
from leases.revocation import listener
from leases.store import client as store
from leases.upkeep import rounds
from tests.helpers import hold, operator_leases

TENANT_COUNTER = "opres|tenant|acme"


@pytest.fixture(autouse=True)
def handler():
    with operator_leases() as recording:
        yield recording


def _drift(by: int) -> None:
    """Raise the tenant counter by ``by`` with no holder behind it, old enough for reconcile."""
    store.counters().update_one({"_id": TENANT_COUNTER},
                                {"$inc": {"count": by}, "$set": {"updatedAt": store.server_now() - timedelta(minutes=5)}})


def test_given_a_drifted_counter_when_reconciling_until_done_then_it_books_its_holders_again():
    # given: one holder, and its tenant counter two above it
    hold()
    _drift(2)

    # when
    result = rounds.reconcile_until_done()

    # then: corrected in the rounds it took, nothing left
    assert result["corrected"] == 1 and result["rounds"] >= 1 and result["hasMore"] is False
    assert store.counters().find_one({"_id": TENANT_COUNTER})["count"] == 1


def test_given_a_bound_of_no_rounds_then_nothing_runs_and_more_remains():
    hold()
    _drift(1)

    result = rounds.reconcile_until_done(max_rounds=0)

    assert result == {"corrected": 0, "rounds": 0, "hasMore": True}
    assert store.counters().find_one({"_id": TENANT_COUNTER})["count"] == 2  # untouched


def test_given_a_negative_safety_margin_then_it_is_refused_and_nothing_changes():
    hold()
    _drift(1)

    with pytest.raises(InvalidLeaseRequest, match="--safety-ms"):
        rounds.reconcile_until_done(safety_ms=-1)

    assert store.counters().find_one({"_id": TENANT_COUNTER})["count"] == 2


class _Listener:
    def __init__(self):
        self.notified = []

    def on_revoked(self, holders):
        self.notified.extend(holders)


def test_given_an_idle_holder_when_sweeping_without_handlers_then_it_is_reaped_reported_and_no_handler_runs(handler):
    # given: an idle holder, a live holder, and a listener that would dispatch
    idle = hold(user="alice")
    live = hold(user="bob")
    store.holders().update_one({"_id": idle.token}, {"$set": {"expiresAt": store.server_now() - timedelta(seconds=1)}})
    previous = listener.get_listener()
    watching = _Listener()
    listener.set_listener(watching)
    try:
        # when
        result, reaped = rounds.sweep_without_handlers()

        # then: the idle one is reported as reaped (reason idle); the live one stays
        assert [(h.token, h.reason) for h in reaped] == [(idle.token, "idle")]
        assert result["done"] >= 1 and result["hasMore"] is False
        assert store.holders().find_one({"_id": idle.token}) is None
        assert store.holders().find_one({"_id": live.token}) is not None
        # nothing was dispatched: the process's listener is back and heard nothing, no handler ran
        assert listener.get_listener() is watching and watching.notified == []
        assert handler.revoked == []
    finally:
        listener.set_listener(previous)
