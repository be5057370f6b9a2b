"""The revocation seam: the engine only knows this interface; ``leases.revocation.dispatch`` implements it.

Without a listener installed, a reap is only logged.
"""

from __future__ import annotations

import logging
from typing import Protocol

from .handlers import RevokedHolder

log = logging.getLogger(__name__)


class LeaseRevocationListener(Protocol):
    """Receives holders that were reaped or revoked; must not block the caller."""

    def on_revoked(self, holders: list[RevokedHolder]) -> None:
        """Schedule the handlers of ``holders`` (asynchronously)."""


_listener: LeaseRevocationListener | None = None


def set_listener(listener: LeaseRevocationListener | None) -> None:
    """Install (or remove, with ``None``) the process's revocation listener."""
    global _listener
    _listener = listener


def get_listener() -> LeaseRevocationListener | None:
    """The installed listener, if any."""
    return _listener


def notify(holders: list[RevokedHolder]) -> None:
    """Hand reaped holders to the listener, or log them when there is none."""
    if not holders:
        return
    if _listener is None:
        for holder in holders:
            log.info("lease %s (%s) reaped (%s); no revocation listener installed", holder.token, holder.type, holder.reason)
        return
    try:
        _listener.on_revoked(holders)
    except Exception:  # a broken listener must never fail the reaper or an acquisition
        log.exception("revocation listener failed for %d holders", len(holders))
