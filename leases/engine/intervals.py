"""The renewal interval a grant issues: the policy and its twin as a pipeline expression.

The engine's holder commands (:mod:`leases.store.holder_commands`), the renewal
(:mod:`leases.engine.holders`) and the HTTP protocol (:mod:`leases.api.protocol`) all
choose it here, so an interval is the same whichever path issued it.
"""

from __future__ import annotations

from typing import Any


def interval_bounds(ttl_seconds: int) -> tuple[int, int]:
    """The renewal intervals the server accepts for a lease of ``ttl_seconds``.

    ``[max(1, ttl // 10), max(lo, ttl // 2)]``: at most half the TTL, so one lost or late
    renewal never loses the lease; at least a tenth, so clients cannot hammer the store.
    """
    low = max(1, ttl_seconds // 10)
    return low, max(low, ttl_seconds // 2)


def choose_interval(ttl_seconds: int, proposed: int | None) -> int:
    """The server-issued interval: ``proposed`` clamped into :func:`interval_bounds`;
    without a proposal a third of the TTL (two renewals may be lost before expiry)."""
    low, high = interval_bounds(ttl_seconds)
    wanted = ttl_seconds // 3 if proposed is None else proposed
    return min(high, max(low, wanted))


def interval_expression(proposed: int) -> dict[str, Any]:
    """:func:`choose_interval` as a pipeline expression on the holder's own ``ttlSeconds``."""
    ttl = {"$ifNull": ["$ttlSeconds", 1]}
    low = {"$max": [1, {"$floor": {"$divide": [ttl, 10]}}]}
    high = {"$max": [low, {"$floor": {"$divide": [ttl, 2]}}]}
    return {"$toInt": {"$min": [high, {"$max": [low, int(proposed)]}]}}
