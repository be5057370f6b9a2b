"""Fail-fast repair: a request that may not wait gets one repair before its Busy answer.

A leaked slot (an entry whose holder is gone) must not turn a free resource into Busy, and
stale tickets at the gate must not keep a newcomer out: repair the full counter, or prune
the gate, once; book again if that freed something.
"""

from __future__ import annotations

from ..queue import order, waiting
from ..store import shapes
from .busy import busy
from .funnel import Attempt, _Blocked
from .lease import Lease


def fail_fast(attempt: Attempt, blocked: _Blocked) -> Lease:
    """No wait allowed: repair a full counter once (a leaked slot must not turn a free
    resource into Busy) or drop stale tickets at the gate, try again if that freed
    something, else answer Busy.

    Raises:
        LeaseBusy: still no room; the attempt's holder document is dropped.
        pymongo.errors.PyMongoError: the store failed (the caller's step rolls back).
    """
    counter = blocked.counter
    if counter is not None:
        retry = False
        if blocked.spec is attempt.gate and order.stale_ids(counter, counter["clock"]):
            counter = waiting.prune(counter)
            retry = not shapes.has_waiters(counter) and not waiting.is_full(counter)
        if waiting.is_full(counter) or (blocked.spec is attempt.gate and shapes.has_waiters(counter)):
            retry = waiting.repair(counter, counter["clock"])
        if retry:
            try:
                return attempt.book(privileged=False, allow_queue=False)
            except _Blocked as again:
                blocked = again
    attempt.discard()
    raise busy(attempt, blocked)
