"""The step and timeout policy: one store bound per step, rollback on failure.

Every store step of an acquisition (an attempt with its rollback, one keep-alive, one
turn) runs under one ``pymongo.timeout`` of ``LEASES_MONGO_TIMEOUT_MS``, so an outage ends
the step within that bound instead of once per command. A step that fails rolls the
attempt back under the same bound, and the caller gets ``LeaseUnavailable``; a rollback
that could not be sent or failed (a step that timed out has spent its bound: its rollback
would never leave the process) is sent once more from a background thread under a bound
of its own. What neither undoes is left to reap and repair.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pymongo
import pymongo.errors

from ..conf import lease_settings
from ..errors import LeaseUnavailable
from ..store import admission, client as store
from .funnel import Attempt, _Vanished
from .per_process import PerProcess

log = logging.getLogger(__name__)


def store_bound() -> Any:
    """One store timeout for a whole step (an attempt with its rollback, one keep-alive):
    an outage ends the step within this bound instead of once per command."""
    return pymongo.timeout(int(lease_settings.MONGO_TIMEOUT_MS) / 1000.0)


class Bypass:
    """Whether a step goes without its turn among this process's steps, because its writes
    are shared by the threads of the process (:mod:`leases.store.batches`), whose one batch
    in flight is their admission: asked before the step waits and while it waits, and once
    true it stays true — the step then sends only those writes (:attr:`chosen`)."""

    def __init__(self, condition: Callable[[], bool]) -> None:
        self.condition = condition
        self.chosen = False

    def now(self) -> bool:
        if not self.chosen and self.condition():
            self.chosen = True
        return self.chosen


def step(attempt: Attempt, fn: Any, *, admit: bool = True, bypass: Bypass | None = None) -> Any:
    """Run one store step under one bound; on a store failure roll the attempt back (same
    bound: what it cannot undo is left to reap and repair) and answer LeaseUnavailable.

    ``admit``: the step waits its turn among this process's steps first
    (:mod:`leases.store.admission`), its bound starting once it runs; a step that completes
    a grant (a claim) goes at once — it frees the way, and its window is short. ``bypass``:
    whether it needs no turn (asked before it waits, and while it waits: see
    :func:`leases.store.admission.admitted`); ``fn`` reads the answer, :attr:`Bypass.chosen`.

    Raises:
        LeaseUnavailable: the store failed, the step was not admitted in time, or the holder
            vanished mid-acquire.
    """
    try:
        if bypass is not None and bypass.now():
            admit = False
        with admission.admitted(bypass.now if bypass else None) if admit else contextlib.nullcontext(), store_bound():
            try:
                return fn()
            except (pymongo.errors.PyMongoError, _Vanished) as exc:
                try:
                    attempt.rollback()
                except pymongo.errors.PyMongoError as again:
                    log.info("rollback of %s failed (%s); sent again in the background", attempt.token, again)
                    rollback_later(attempt)
                if isinstance(exc, _Vanished):
                    raise LeaseUnavailable(f"lease attempt on {attempt.definition.resource} was reaped mid-acquire") from None
                raise
    except pymongo.errors.PyMongoError as exc:
        log.warning("store step failed: %r", exc)
        raise LeaseUnavailable(f"lease store error at {store.where()} mid-acquire: {exc.__class__.__name__}") from None


#: The most rollbacks waiting to be sent again at once in a process (an outage makes many;
#: beyond these, reap and repair clean up).
LATER_LIMIT = 256
# One thread per process sends them (fork-aware: a forked child starts its own).
_later = PerProcess(lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="leases-rollback"))
_later_lock = threading.Lock()
_later_waiting = 0


def rollback_later(attempt: Attempt) -> bool:
    """Send ``attempt``'s rollback again from a background thread, under a bound of its own:
    what it booked comes back as soon as the store answers — not when its holder's deadline
    passes (a waiting holder's covers its whole wait) or repair finds its entries.

    Returns:
        False when :data:`LATER_LIMIT` rollbacks wait already (reap and repair clean up).
    """
    global _later_waiting
    with _later_lock:
        if _later_waiting >= LATER_LIMIT:
            log.warning("rollback of %s not sent again (%d waiting); reap and repair clean up", attempt.token,
                        _later_waiting)
            return False
        _later_waiting += 1
        pool = _later.get()
    try:
        pool.submit(_rollback_again, attempt)
    except RuntimeError:  # the interpreter is exiting
        _done_waiting()
        return False
    return True


def _done_waiting() -> None:
    global _later_waiting
    with _later_lock:
        _later_waiting -= 1


def _rollback_again(attempt: Attempt) -> None:
    try:
        rollback_bounded(attempt)
    finally:
        _done_waiting()


def rollback_bounded(attempt: Attempt) -> None:
    """Roll ``attempt`` back under a bound of its own (what it cannot undo is left to reap
    and repair). Never raises on a store failure."""
    try:
        with store_bound():
            attempt.rollback()
    except pymongo.errors.PyMongoError as exc:
        log.warning("rollback of %s failed (%s); reap and repair clean up", attempt.token, exc)
