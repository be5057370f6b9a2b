"""MongoDB's clock as this process can tell it without asking on every call.

A definition records when its load began on MongoDB's clock (``LeaseDefinition.loaded_at``),
so a counter can tell a view loaded before a cap stamp from one loaded after it
(:mod:`leases.definitions.caps`). Asking the server each time would add a command to every cache miss;
instead the process reads ``hello.localTime`` once (again every :data:`RESYNC_SECONDS`) and
moves it on with its own monotonic clock, which a step of the local wall clock does not
touch. The reading is taken as of the moment the answer arrived, so the estimate never runs
ahead of the server: a view may look older than it is (it then obeys a stamp it did not
need to), never younger.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import datetime, timedelta

import pymongo.errors

from . import client as store

log = logging.getLogger(__name__)

RESYNC_SECONDS = 600.0

_lock = threading.Lock()
# (pid, server time read, monotonic time its answer arrived); None until the first reading.
_anchor: tuple[int, datetime, float] | None = None


def at(moment: float) -> datetime | None:
    """MongoDB's clock at ``moment`` (this process's ``time.monotonic()``, past or now),
    estimated no later than it was; None when the clock cannot be read.

    One ``hello`` command on the first call of a process and every ``RESYNC_SECONDS`` after;
    none otherwise. A caller that asks after its own reads (``moment`` taken before them)
    adds no wait when the store is down. Never raises: a caller with None treats its view as
    older than any stamp.
    """
    global _anchor
    anchor = _anchor
    if anchor is None or anchor[0] != os.getpid() or time.monotonic() - anchor[2] > RESYNC_SECONDS:
        with _lock:
            try:
                server = store.server_now()
            except pymongo.errors.PyMongoError as exc:
                log.debug("server clock unreadable: %r", exc)
                return None
            anchor = _anchor = (os.getpid(), server, time.monotonic())
    return anchor[1] + timedelta(seconds=moment - anchor[2])


def reset() -> None:
    """Forget the reading (tests that switch databases or servers)."""
    global _anchor
    _anchor = None
