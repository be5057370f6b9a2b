"""The step and timeout policy: one store bound per step, rollback on failure.

Every store step of an acquisition (an attempt with its rollback, one keep-alive, one
turn) runs under one ``pymongo.timeout`` of ``LEASES_MONGO_TIMEOUT_MS``, so an outage ends
the step within that bound instead of once per command. A step that fails rolls the
attempt back under the same bound; what it cannot undo is left to reap and repair, and the
caller gets ``LeaseUnavailable``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pymongo
import pymongo.errors

from ..conf import lease_settings
from ..errors import LeaseUnavailable
from ..store import admission, client as store
from .funnel import Attempt, _Vanished

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
                    log.warning("rollback of %s failed (%s); reap and repair clean up", attempt.token, again)
                if isinstance(exc, _Vanished):
                    raise LeaseUnavailable(f"lease attempt on {attempt.definition.resource} was reaped mid-acquire") from None
                raise
    except pymongo.errors.PyMongoError as exc:
        log.warning("store step failed: %r", exc)
        raise LeaseUnavailable(f"lease store error at {store.where()} mid-acquire: {exc.__class__.__name__}") from None
