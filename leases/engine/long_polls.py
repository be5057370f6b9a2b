"""This process's long polls of kept tickets, nearest turn first.

Every long poll holds a web worker thread, so a process runs at most
``LEASES_HTTP_LONG_POLLS`` at once. Which ones matter: the grant goes to the ticket whose turn
comes first, and a grant to a ticket that is not long-polled waits, booked and idle, for its
client's next poll. So when the slots are full, a poll whose turn is expected sooner than that
of the farthest one under way takes its place: the farther one answers at once ("still
waiting", with its Retry-After) and its client polls again later.
"""

from __future__ import annotations

import threading
from datetime import datetime

from ..conf import lease_settings

_lock = threading.Lock()
# handle -> (expected grant on MongoDB's clock, or None when not estimated, its wake-up event)
_active: dict[int, tuple[datetime | None, threading.Event]] = {}
_preempted: set[int] = set()
_handles = 0


def size() -> int:
    """How many long polls this process runs at once (``LEASES_HTTP_LONG_POLLS``, at least 1)."""
    return max(1, int(lease_settings.HTTP_LONG_POLLS))


def _later(a: datetime | None, b: datetime | None) -> bool:
    """Whether a turn expected at ``a`` comes after one at ``b`` (not estimated: soonest)."""
    return a is not None and (b is None or a > b)


def enter(expected: datetime | None, event: threading.Event) -> int | None:
    """Take a long-poll slot for a ticket whose turn is expected at ``expected``; ``event`` is
    the poll's wake-up, set to tell it to give its slot up. None when every slot is taken by
    a poll expected no later.

    Returns:
        The handle to pass to :func:`leave` and :func:`preempted`.
    """
    global _handles
    with _lock:
        if len(_active) >= size():
            farthest = max(_active, key=lambda h: (_active[h][0] is not None, _active[h][0] or datetime.min))
            if not _later(_active[farthest][0], expected):
                return None
            _preempted.add(farthest)
            _active.pop(farthest)[1].set()
        _handles += 1
        _active[_handles] = (expected, event)
        return _handles


def preempted(handle: int) -> bool:
    """Whether the poll of ``handle`` was told to give its slot up (once)."""
    with _lock:
        if handle in _preempted:
            _preempted.discard(handle)
            return True
        return False


def leave(handle: int) -> None:
    """The poll of ``handle`` ended (also after it was preempted)."""
    with _lock:
        _active.pop(handle, None)
        _preempted.discard(handle)


def under_way() -> int:
    """How many long polls run in this process now."""
    with _lock:
        return len(_active)
