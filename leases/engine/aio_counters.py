"""Booking entries given back on the async client (``waiting.give_back``'s commands)."""

from __future__ import annotations

import asyncio
from typing import Any

from pymongo import ReturnDocument

from ..queue import slots, waiting
from ..store import client as store, shapes
from ..store.documents import CounterDoc


async def give_back(keys: list[str], booking: str, *, record: dict[str, Any] | None = None,
                    fence: tuple[str, str] | None = None) -> CounterDoc | None:
    """``waiting.give_back`` on the async client: the narrower levels in one bulk, the last
    one returning its document (:func:`leases.store.counter_commands.gate_pull`, as ``slots.give_back``); a
    queue there is handed off (in a thread: the hand-off's wake-up publish and prune are
    the engine's). ``fence``: (counter key, ``fence.sN``) the booking recorded, freed with
    its pull, as in ``waiting.give_back``.

    Raises:
        pymongo.errors.PyMongoError: the store failed part-way (repair returns the rest).
    """
    if not keys:
        return None
    counters = store.async_db()[store.COUNTERS]
    *narrow, gate_key = keys
    if narrow:
        await counters.bulk_write(slots.pull_ops(narrow, booking, fence=fence), ordered=False)
    gate = await counters.find_one_and_update(*slots.gate_pull(gate_key, booking, record, fence=fence),
                                              return_document=ReturnDocument.AFTER)
    waiting.note_queue(gate)
    if shapes.has_waiters(gate):
        await asyncio.to_thread(waiting.hand_off, gate)
    return gate


