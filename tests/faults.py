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
                when: Callable[..., bool] | None = None, any_thread: bool = False) -> list[tuple[Any, ...]]:
    """Make the next ``times`` calls of ``Collection.<method>`` on ``collection`` (its name)
    for which ``when(*args, **kwargs)`` holds raise ``NetworkTimeout`` — after the server
    applied them (``applied``), or without sending them.

    Only calls from the calling thread lose their answer unless ``any_thread``: a waiter's
    or a timer's thread sending the same kind of command at about the same time must not
    take the fault meant for the command under test (whichever comes first would, on a
    loaded machine).

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
            raise pymongo.errors.NetworkTimeout(f"{method} on {collection}: the answer was lost (test fault)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Collection, method, lossy)
    return hits
