"""Upkeep rounds an operator runs on demand, in this process (the ``lease`` CLI).

:func:`reconcile_until_done` repeats :func:`leases.upkeep.sweeps.reconcile` until nothing
is left (bounded); :func:`sweep_without_handlers` runs the beat sweep here with NO
revocation handler (``lease sweep --force``) and returns the holders it reaped, so the
operator can be told what nobody stopped.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidLeaseRequest
from ..revocation import listener
from ..revocation.handlers import RevokedHolder
from . import sweeps, tasks

MAX_RECONCILE_ROUNDS = 100


def reconcile_until_done(*, safety_ms: int | None = None, max_rounds: int = MAX_RECONCILE_ROUNDS) -> dict[str, Any]:
    """Reconcile rounds until no counter is left to correct, or ``max_rounds`` ran.

    Returns ``{"corrected": n, "rounds": r, "hasMore": bool}``; ``hasMore`` is true when the
    bound stopped it with work left.

    Raises:
        InvalidLeaseRequest: a negative ``safety_ms``; nothing ran.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    if safety_ms is not None and safety_ms < 0:
        raise InvalidLeaseRequest("--safety-ms must be >= 0")
    total, rounds, more = 0, 0, True
    while more and rounds < max_rounds:
        corrected, more = sweeps.reconcile(safety_ms=safety_ms)
        total += corrected
        rounds += 1
    return {"corrected": total, "rounds": rounds, "hasMore": more}


class _Recorder:
    """A revocation listener that records the round's revocations and runs nothing."""

    def __init__(self) -> None:
        self.reaped: list[RevokedHolder] = []

    def on_revoked(self, holders: list[RevokedHolder]) -> None:
        self.reaped.extend(holders)


def sweep_without_handlers() -> tuple[dict[str, Any], list[RevokedHolder]]:
    """The beat sweep's rounds here, with NO handler: returns its tally and the holders it reaped.

    The process's revocation listener is swapped for a recorder for the duration, so the
    reaped holders are reported instead of dispatched; the previous listener is restored
    whatever happens. Meant for an operator process with no pod to run handlers.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable (holders reaped before it
            stay reaped).
    """
    recorder = _Recorder()
    previous = listener.get_listener()
    listener.set_listener(recorder)
    try:
        result = tasks.sweep()
    finally:
        listener.set_listener(previous)
    return result, recorder.reaped
