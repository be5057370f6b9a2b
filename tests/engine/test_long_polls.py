"""leases.engine.long_polls: a process's long-poll slots go to the tickets nearest their turn."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from leases.engine import long_polls

T0 = datetime(2026, 12, 7, 12, 0, 0)


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def test_given_full_slots_when_a_nearer_ticket_polls_then_the_farthest_gives_its_slot_up(settings):
    settings.LEASES_HTTP_LONG_POLLS = 2
    near, far = threading.Event(), threading.Event()
    first, second = long_polls.enter(at(1), near), long_polls.enter(at(3), far)
    try:
        assert first is not None and second is not None and long_polls.under_way() == 2
        # A ticket expected between them takes the farthest one's slot: that poll is woken
        # and told (once) to answer at once.
        nearer = long_polls.enter(at(2), threading.Event())
        assert nearer is not None and far.is_set() and not near.is_set()
        assert long_polls.preempted(second) and not long_polls.preempted(second)
        assert not long_polls.preempted(first)
        # One expected later than every poll under way gets no slot; nor does one expected
        # at the same time as the farthest.
        assert long_polls.enter(at(5), threading.Event()) is None
        assert long_polls.enter(at(2), threading.Event()) is None
        # A ticket without an estimate yet counts as nearest.
        unknown = long_polls.enter(None, threading.Event())
        assert unknown is not None and long_polls.preempted(nearer)
    finally:
        for handle in (first, second, nearer, unknown):
            long_polls.leave(handle)
    assert long_polls.under_way() == 0


def test_given_free_slots_then_any_poll_takes_one_and_leaving_frees_it(settings):
    settings.LEASES_HTTP_LONG_POLLS = 1
    handle = long_polls.enter(at(10), threading.Event())
    assert handle is not None and long_polls.enter(at(20), threading.Event()) is None
    long_polls.leave(handle)
    again = long_polls.enter(at(20), threading.Event())
    assert again is not None
    long_polls.leave(again)
