"""Holders paused past their TTL between check() and use, in real processes: every use goes
through a FenceGuard, which admits no stale use while cap other holders are live and refuses
no live holder (tests.fence_pauses judges)."""

from __future__ import annotations

from tests import fence_pauses
from tests.helpers import child_env


def test_given_holders_paused_past_their_ttl_then_the_guard_refuses_every_stale_use_and_no_live_one():
    # Given: 6 processes on {global: 2, tenant: 1}, TTL 1 s, each pausing 1.6 s between a
    # successful check() and its use, 4 times (24 pauses); the parent reaps every 100 ms.
    verdict, _ = fence_pauses.run(child_env(), processes=6, pauses_each=4, seconds=90)
    # Then: enough pauses happened, and some of them came back to a slot granted again.
    assert verdict.pauses >= 20, verdict
    assert verdict.stale_attempted >= 5 and verdict.stale_refused >= 5, verdict
    # And: no stale use admitted while cap others were live, no live use refused.
    assert verdict.violations == [], verdict.violations[:5]
    assert verdict.stale_admitted == 0 and verdict.live_refused == 0
    # And: each admit is one command of the resource's store, refusals included (a race to
    # create a slot's first record may cost one more).
    assert verdict.admit_commands.count(1) >= verdict.uses - 1
