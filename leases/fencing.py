"""The resource's side of fencing: refuse a holder whose lease is gone.

``check()`` at every usage step narrows the window but cannot close it: a holder that
passes ``check()`` and then stalls past its TTL is reaped, its slot goes to someone else,
and when it wakes it would use the resource anyway. Every grant carries a *fence*
(``Lease.fence``, ``"fence"`` over HTTP): the counter it was granted on, the slot in that
counter and the slot's generation, which strictly increases each time the slot is granted
again (:mod:`leases.queue.fences`; the string: :mod:`leases.store.fence_codec`). The resource keeps, in its own store, the highest generation
it has admitted per (counter, slot) and refuses anything older::

    guard = FenceGuard(my_db["lease_fences"], resource="tex2pdf")   # once
    guard.admit(lease.fence)        # before each use; raises StaleFence for a stale holder
    do_the_work()

With cap N, N holders are legitimately concurrent: each has its own slot, so admitting one
never refuses another. A holder is refused only once a newer grant of *its* slot has been
admitted, i.e. once the slot went to someone else — a live holder always passes, as often
as it asks (equal generations pass).

Two implementations of one contract, neither needs Django: :class:`FenceGuard` on a pymongo
collection of the resource's own (one update per admit, refusals included) and
:class:`RedisFenceGuard` on a redis-py client (one Lua script per admit).
"""

from __future__ import annotations

from typing import Any

import pymongo.errors
from pymongo import ReturnDocument

from .errors import InvalidFence, StaleFence
from .ids.validation import RESOURCE_RE
from .store.fence_codec import Fence, decode
from .telemetry import metrics

__all__ = ["FenceGuard", "RedisFenceGuard", "StaleFence", "InvalidFence"]

# Compare two generations given as decimal strings without leading zeros (as the codec
# spells them): no float conversion, so every int64 compares exactly. Returns the recorded
# generation when it is newer than ARGV[1] (stale: nothing written), else records ARGV[1].
_ADMIT_LUA = """
local seen = redis.call('GET', KEYS[1])
if seen then
  local a, b = string.len(seen), string.len(ARGV[1])
  if a > b or (a == b and seen > ARGV[1]) then
    return seen
  end
  if seen == ARGV[1] then
    return false
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return false
"""


def _resource_label(resource: str) -> str:
    """The metric label a guard counts under, from its constructor (validated once).

    Raises:
        InvalidFence: ``resource`` is no resource name.
    """
    if not isinstance(resource, str) or RESOURCE_RE.fullmatch(resource) is None:
        raise InvalidFence(f"a guard's resource must be a resource name, got {resource!r}")
    return metrics.resource_tag(resource)


def _stale(fence: Fence, label: str, seen: int | None) -> StaleFence:
    metrics.FENCE_REJECTED.labels(resource=label).inc()
    newer = f" (the guard holds generation {seen})" if seen is not None else ""
    return StaleFence(f"stale fence: slot {fence.slot} of {fence.counter} was granted again since generation "
                      f"{fence.generation}{newer}", counter=fence.counter, slot=fence.slot,
                      generation=fence.generation, seen=seen)


def record_id(fence: Fence) -> str:
    """The guard's record of ``fence``'s (counter, slot): ``<counter>#<slot>``."""
    return f"{fence.counter}#{fence.slot}"


class FenceGuard:
    """Admit uses by fence, recording the highest generation per (counter, slot) in a
    MongoDB collection of the resource's own (documents ``{_id: "<counter>#<slot>", g}``).

    Args:
        collection: a ``pymongo.collection.Collection``; its ``_id`` index is all it needs.
        resource: the resource this guard protects: the label of
            ``vance_lease_fence_rejected_total`` (never taken from a fence).

    Raises:
        InvalidFence: ``resource`` is no resource name.
    """

    def __init__(self, collection: Any, *, resource: str = "unknown"):
        self.collection = collection
        self.label = _resource_label(resource)

    def admit(self, fence: str) -> None:
        """Let the holder of ``fence`` use the resource now, or refuse it.

        One ``findAndModify``, upserted on ``_id``: ``g = max(g, generation)``, answering the
        record as it was. A newer recorded generation is the refusal (the update left it as
        it was). Two admits racing to create a slot's first record can collide on ``_id``
        (MongoDB retries such an upsert itself; a server that does not is tried once more).

        Raises:
            StaleFence: a newer grant of the same slot was admitted: the lease is gone.
            InvalidFence: ``fence`` is no fence the engine issued; nothing was recorded.
            pymongo.errors.PyMongoError: the guard's store failed (fail closed: do not use).
        """
        parsed = decode(fence)
        update = [{"$set": {"g": {"$max": [{"$ifNull": ["$g", 0]}, {"$literal": parsed.generation}]}}}]
        for attempt in range(2):
            try:
                before = self.collection.find_one_and_update(
                    {"_id": record_id(parsed)}, update, projection={"g": 1}, upsert=True,
                    return_document=ReturnDocument.BEFORE)
                break
            except pymongo.errors.DuplicateKeyError:
                if attempt:
                    raise
        seen = int((before or {}).get("g") or 0)
        if seen > parsed.generation:
            raise _stale(parsed, self.label, seen)


class RedisFenceGuard:
    """The same contract on Redis: one key ``<prefix><counter>#<slot>`` per slot holding the
    highest admitted generation, checked and raised by one Lua script.

    Args:
        client: a ``redis.Redis`` client.
        prefix: the key prefix (e.g. ``"tex2pdf:fence:"``), so the guard's keys are its own.
        resource: the label of ``vance_lease_fence_rejected_total``, as :class:`FenceGuard`.

    Raises:
        InvalidFence: ``resource`` is no resource name, or ``prefix`` is not a string.
    """

    def __init__(self, client: Any, prefix: str, *, resource: str = "unknown"):
        if not isinstance(prefix, str):
            raise InvalidFence(f"a guard's key prefix must be a string, got {prefix!r}")
        self.client = client
        self.prefix = prefix
        self.label = _resource_label(resource)
        self._script = client.register_script(_ADMIT_LUA)

    def admit(self, fence: str) -> None:
        """As :meth:`FenceGuard.admit`: one ``EVALSHA`` (the first call on a connection
        whose server lacks the script loads it first).

        Raises:
            StaleFence: a newer grant of the same slot was admitted: the lease is gone.
            InvalidFence: ``fence`` is no fence the engine issued; nothing was recorded.
            redis.exceptions.RedisError: the guard's store failed (fail closed: do not use).
        """
        parsed = decode(fence)
        seen = self._script(keys=[self.prefix + record_id(parsed)], args=[str(parsed.generation)])
        if seen is not None:
            raise _stale(parsed, self.label, int(seen))
