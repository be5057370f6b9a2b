"""Half-done commands for tests: a command the real server applied whose answer the client
never got (a timeout after the write), or one that failed before it was sent.

The command goes to the real embedded server and is applied there; only its answer is
replaced by ``pymongo.errors.NetworkTimeout``, as a client whose socket times out after the
server wrote would see it. Nothing of the store is faked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pymongo.errors
from pymongo.collection import Collection


def answer_lost(monkeypatch: Any, method: str, collection: str, *, applied: bool = True, times: int = 1,
                when: Callable[..., bool] | None = None, any_thread: bool = False,
                then: Callable[[], Any] | None = None) -> list[tuple[Any, ...]]:
    """Make the next ``times`` calls of ``Collection.<method>`` on ``collection`` (its name)
    for which ``when(*args, **kwargs)`` holds raise ``NetworkTimeout`` — after the server
    applied them (``applied``), or without sending them.

    Only calls from the calling thread lose their answer unless ``any_thread``: a waiter's
    or a timer's thread sending the same kind of command at about the same time must not
    take the fault meant for the command under test (whichever comes first would, on a
    loaded machine). ``then``: run after the server applied the command and before its
    caller hears of the timeout (what another process does in between).

    Returns:
        The arguments of each call that lost its answer (filled in as they happen).
    """
    real = getattr(Collection, method)
    hits: list[tuple[Any, ...]] = []
    mine = threading.current_thread()

    def lossy(self: Collection, *args: Any, **kwargs: Any) -> Any:
        if (self.name == collection and len(hits) < times and (any_thread or threading.current_thread() is mine)
                and (when is None or when(*args, **kwargs))):
            hits.append(args)
            if applied:
                real(self, *args, **kwargs)
            if then is not None:
                then()
            raise pymongo.errors.NetworkTimeout(f"{method} on {collection}: the answer was lost (test fault)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Collection, method, lossy)
    return hits


def quiet_waiter(settings: Any, request: Any, gate_key: str) -> Any:
    """A waiter queued for ``request`` at the full gate ``gate_key`` (which exists) that
    sends nothing until it is woken (:func:`quiet`), so a fault meets the command under test
    and no waiter command, however the machine schedules threads."""
    from tests import helpers

    quiet(settings, gate_key)
    return helpers.queue_up(request, gate_key)


def quiet(settings: Any, gate_key: str) -> None:
    """Make waiters at the existing gate ``gate_key`` send nothing until woken: no keep-alive
    poll within the test (ticket TTL 60 s, poll 30 s) and no repair check of the gate (its
    ``checkedAt`` stamped now, the interval 60 s). Otherwise a waiter's thread, scheduled
    late on a loaded machine, may poll, or read the holders and pull an entry whose holder a
    release has just deleted, at any moment of the test.
    """
    from leases.store import client as store

    settings.LEASES_TICKET_TTL_MS = 60_000
    settings.LEASES_WAIT_POLL_MS = 30_000
    settings.LEASES_REPAIR_INTERVAL_MS = 60_000
    assert store.counters().update_one({"_id": gate_key}, {"$currentDate": {"checkedAt": True}}).matched_count
