"""Commands that the threads of a process share: one in flight per kind, the rest go together.

A burst of requests into a deep queue (500 Celery tasks on a cap of 4, a class opening its
sessions at 9:00) writes one holder and one backlog ticket per request, and each would be a
command of its own, answered in turn by the store. Here the threads of a process that send
the same kind of write at once share it (flat combining): the first sends, those that arrive
while its command is in flight go together in the next one, and each is told its own result.
A write that arrives alone goes at once, as it would have; a burst costs a few commands a
process instead of one a request.

The one command in flight per kind is also this process's admission for those writes (see
:mod:`leases.store.admission`): a caller need not hold a step's turn while it waits here.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import pymongo.errors

from ..conf import lease_settings

#: The most items a command carries: a batch's own time at the store stays short, so that the
#: commands of a burst queue there behind nothing long. The embedded server runs a thread per
#: connection under one interpreter lock, handed round every 5 ms: a command that needs k such
#: slices waits k times behind every other command in flight, so its time grows with its size
#: times the load. 100 holders a command from each of 8 processes at once made the store answer
#: in 1.5 s; 32 (about 15 ms alone) still timed out past 2 s under 1,000 threads, failing 32
#: callers each (96 to 3,013 ``LeaseUnavailable`` a 30 s run); 8: none in three runs.
MAX_ITEMS = 8

#: What a batch's sender does with the items of a batch (id → item): the result of each
#: (id → result; an id it leaves out gets None).
Send = Callable[[dict[str, Any]], dict[str, Any]]


class _Batch:
    def __init__(self) -> None:
        self.items: dict[str, Any] = {}
        self.sender: object | None = None  # the caller that sends it
        self.done = False
        self.results: dict[str, Any] = {}
        self.error: BaseException | None = None


_lock = threading.Lock()
_changed = threading.Condition(_lock)
_open: dict[Hashable, list[_Batch]] = {}  # kind -> the batches its next commands carry, oldest first
_sending: set[Hashable] = set()  # kinds with a command in flight from this process
_ended: dict[Hashable, int] = {}  # kind -> commands of it that ended (the waiters' sign of progress)


def _forked() -> None:
    # A command in flight in the parent has no sender in the child, and a lock another thread
    # of the parent held at the fork would stay held.
    global _lock, _changed
    _lock = threading.Lock()
    _changed = threading.Condition(_lock)
    _open.clear()
    _sending.clear()
    _ended.clear()


os.register_at_fork(after_in_child=_forked)


def bound_s() -> float:
    """The longest a caller waits here for the next command of its kind to end: the command
    in flight and then its own, each bounded by ``LEASES_MONGO_TIMEOUT_MS``. Each command
    that ends starts the bound again, so a caller behind ``k`` batches (a burst of more than
    :data:`MAX_ITEMS` threads) waits at most ``k + 1`` bounds — and a command that never ends
    fails everybody behind it within one."""
    return 2 * int(lease_settings.MONGO_TIMEOUT_MS) / 1000.0


def _bounded(send: Send, items: dict[str, Any]) -> dict[str, Any]:
    with pymongo.timeout(int(lease_settings.MONGO_TIMEOUT_MS) / 1000.0):
        return send(items)


def combine(kind: Hashable, item_id: str, item: Any, send: Send) -> Any:
    """Have ``item`` (named ``item_id``, unique within ``kind``) written by the next command
    of ``kind`` (``send`` of its batch); returns what ``send`` answered for it.

    Raises:
        pymongo.errors.PyMongoError: the command failed (for all of its batch: each caller
            rolls back its own), or the command ahead did not end within :func:`bound_s`
            (``NetworkTimeout``; then this item was not sent).
    """
    me = object()
    deadline = time.monotonic() + bound_s()
    with _changed:
        ended = _ended.get(kind, 0)
        waiting = _open.setdefault(kind, [])
        if not waiting or len(waiting[-1].items) >= MAX_ITEMS:
            waiting.append(_Batch())
        batch = waiting[-1]
        batch.items[item_id] = item
        # The oldest batch goes first, sent by its first caller once the command ahead has
        # landed; the others wait for its answer (and one of them sends it should the first
        # give up).
        while not batch.done:
            if batch.sender is None:
                batch.sender = me
            if batch.sender is me and kind not in _sending and waiting[0] is batch:
                waiting.pop(0)
                if not waiting:
                    _open.pop(kind, None)
                _sending.add(kind)
                break
            if _ended.get(kind, 0) != ended:
                # A command ahead ended: the queue moves, the bound starts again.
                ended = _ended.get(kind, 0)
                deadline = time.monotonic() + bound_s()
            left = deadline - time.monotonic()
            if left <= 0:
                if batch in waiting:  # not sent yet: leave it
                    batch.items.pop(item_id, None)
                    if batch.sender is me:
                        batch.sender = None
                    if not batch.items:
                        waiting.remove(batch)
                        if not waiting:
                            _open.pop(kind, None)
                    _changed.notify_all()
                raise pymongo.errors.NetworkTimeout(f"the store command ahead of this {kind!r} did not end in time")
            _changed.wait(left)
    if batch.sender is me and not batch.done:
        # What the others are told should this thread not finish (anything but a store error).
        batch.error = pymongo.errors.PyMongoError(f"the sender of a {kind!r} batch did not finish")
        try:
            # Under a bound of its own: the step that sends it may have spent its own
            # bound waiting for the command ahead, and the batch is everybody's.
            batch.results = contextvars.Context().run(_bounded, send, batch.items)
            batch.error = None
        except pymongo.errors.PyMongoError as exc:
            batch.error = exc
        finally:
            with _changed:
                _sending.discard(kind)
                _ended[kind] = _ended.get(kind, 0) + 1
                batch.done = True
                _changed.notify_all()
    if batch.error is not None:
        raise batch.error
    return batch.results.get(item_id)
