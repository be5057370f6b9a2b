"""leases.revocation.listener: the revocation seam between the engine and whoever runs the handlers."""

from __future__ import annotations

import logging

import pytest

from leases.revocation import listener
from leases.store import client as store
from leases.upkeep import reaper
from tests.helpers import hold, operator_leases


class Recording:
    def __init__(self):
        self.calls = []

    def on_revoked(self, holders):
        self.calls.append([h.token for h in holders])


class Broken:
    def on_revoked(self, holders):
        raise RuntimeError("listener bug")


@pytest.fixture
def installed():
    """Swap the process's listener for the test; the app's dispatcher comes back afterwards."""
    previous = listener.get_listener()
    yield lambda chosen: listener.set_listener(chosen)
    listener.set_listener(previous)


@pytest.fixture
def revoked():
    """Two really reaped holders (deleted, levels returned), as a sweep hands them over."""
    with operator_leases():
        tokens = [hold(user="alice").token, hold(user="bob").token]
        holders = [reaper.reap_holder({"_id": token}, "revoke") for token in tokens]
    assert store.holders().count_documents({}) == 0
    return holders


def test_given_a_listener_when_holders_are_reaped_then_it_gets_them_in_one_call(installed, revoked):
    recording = Recording()
    installed(recording)
    assert listener.get_listener() is recording
    listener.notify(revoked)
    assert recording.calls == [[h.token for h in revoked]]


def test_given_nothing_reaped_then_the_listener_is_not_called(installed):
    recording = Recording()
    installed(recording)
    listener.notify([])
    assert recording.calls == []


def test_given_no_listener_then_each_reap_is_logged_and_nothing_fails(installed, revoked, caplog):
    installed(None)
    with caplog.at_level(logging.INFO, logger="leases.revocation.listener"):
        listener.notify(revoked)
    logged = [r.getMessage() for r in caplog.records if r.name == "leases.revocation.listener"]
    assert len(logged) == 2 and all("no revocation listener installed" in m for m in logged)
    assert {h.token for h in revoked} == {m.split()[1] for m in logged}


def test_given_a_broken_listener_then_the_reaper_is_not_failed_and_the_failure_is_logged(installed, revoked, caplog):
    installed(Broken())
    with caplog.at_level(logging.ERROR, logger="leases.revocation.listener"):
        listener.notify(revoked)  # does not raise
    (record,) = [r for r in caplog.records if r.name == "leases.revocation.listener"]
    assert "revocation listener failed for 2 holders" in record.getMessage() and record.exc_info
