"""The Busy answer: which level blocked, its occupancy, the place held, when to ask again.

Built from the documents in hand (no command of its own): the blocking counter as read,
the gate as last seen, and the queue's estimate of the attempt's turn.
"""

from __future__ import annotations

from ..conf import lease_settings
from ..errors import LeaseBusy
from ..queue import estimates
from ..store.documents import CounterDoc
from ..store.shapes import queue_of
from .funnel import Attempt, _Blocked


def busy(attempt: Attempt, blocked: _Blocked, *, position: int | None = None,
         gate: CounterDoc | None = None, placed: bool = True, queue_full: bool = False) -> LeaseBusy:
    """The Busy answer of ``attempt``, blocked at ``blocked``; ``gate`` is the gate as last
    seen (default: the blocking counter, when that is the gate) and ``placed`` whether the
    attempt still has its place there, for the retry delay (:func:`retry_after_s`)."""
    counter = blocked.counter
    count = None if counter is None else int(counter.get("count", 0))
    return LeaseBusy(resource=attempt.definition.resource, level=blocked.spec.level, scope=blocked.spec.scope,
                     count=count, cap=blocked.spec.cap, position=position,
                     retry_after=retry_after_s(attempt, counter if gate is None else gate, placed=placed),
                     queue_full=queue_full)


def retry_after_s(attempt: Attempt, gate: CounterDoc | None, *, placed: bool = True) -> float:
    """Suggested seconds before ``attempt`` asks again (``LeaseBusy.retry_after``), from
    the gate document in hand (no command of its own); never below
    ``LEASES_RETRY_AFTER_MIN_MS`` (100 ms), so a caller that sleeps it does not spin.

    The queue's estimate of the attempt's turn (:mod:`leases.queue.estimates`): its own ticket's
    when it is queued and live (and ``placed``: it has not lost its place), else that of a
    newcomer of its class at the back of the queue (a request that did not wait, or whose
    kept ticket was lost). When the walk does not reach it, the gate's typical hold. The
    walk assumes the holders release within the typical hold; once every current holder
    has held longer than that, their remaining expected hold
    (:func:`leases.queue.estimates.overdue_hold_ms`) is the least wait. Without a gate document (a
    narrower level blocked: its counter keeps no holds) or any hold on record at the gate,
    ``LeaseBusy.DEFAULT_RETRY_AFTER_S`` (1 s, as HTTP's ``Retry-After``).
    """
    floor = int(lease_settings.RETRY_AFTER_MIN_MS) / 1000.0
    unknown = max(LeaseBusy.DEFAULT_RETRY_AFTER_S, floor)
    if gate is None or gate.get("_id") != attempt.gate.key or gate.get("clock") is None:
        return unknown
    now = gate["clock"]
    ms = estimates.wait_ms(gate, attempt.token, now) if placed else None
    if ms is None:
        queue = [t for t in queue_of(gate) if t.get("id") != attempt.token]
        newcomer = attempt.ticket(attempt.gate.level, now)
        ms = estimates.wait_ms({**gate, "queue": [*queue, newcomer]}, attempt.token, now)
    if ms is None:
        ms = estimates.mean_hold_ms(gate)
    if ms is None:
        return unknown
    ms = max(ms, estimates.overdue_hold_ms(gate, now) or 0.0)
    return round(max(ms / 1000.0, floor), 3)
