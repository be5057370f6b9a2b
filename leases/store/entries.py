"""Booking entries: which holder (written as which attempt) books a slot, as one string.

A counter's ``holders`` list holds one entry ``tenant/project/user/attempt/token`` per
booked slot (:mod:`leases.queue.slots` takes and returns them). The codec lives in the store
layer because the entry is part of the counter document's shape: the queue, the engine,
the upkeep and the history recorder all read entries, and none of them needs the others
to do so.
"""

from __future__ import annotations

import secrets

from .. import ids
from .documents import HolderDoc

SEPARATOR = "/"


def entry(tenant_id: str, project_id: str, user_id: str, token: str, attempt: str | None = None) -> str:
    """The booking entry of one holder written as ``attempt``; without ``attempt``, the
    entry of a holder written before attempts existed.

    Each id is encoded (:func:`leases.ids.encode`): a user id may contain the separator
    (``a/b``), and two holders that differ only there must never share an entry. An id
    without ``%``, ``/`` or ``|`` (every id valid before user ids widened) is itself.
    """
    ids_part = (ids.encode(tenant_id), ids.encode(project_id), ids.encode(user_id))
    return SEPARATOR.join((*ids_part, *((attempt,) if attempt else ()), token))


def new_attempt_id() -> str:
    """A fresh ``attemptId`` for a holder document about to be written (no separator in it)."""
    return secrets.token_hex(6)


def token_of(value: str) -> str:
    """The holder token inside a booking entry."""
    return value.rsplit(SEPARATOR, 1)[-1]


def attempt_of(value: str) -> str | None:
    """The ``attemptId`` inside a booking entry; None for an entry without one."""
    bits = value.split(SEPARATOR)
    return bits[3] if len(bits) == 5 else None


def parts_of(value: str) -> tuple[str, str, str]:
    """``(tenant, project, user)`` of a booking entry, decoded; empty strings for a malformed one."""
    bits = value.split(SEPARATOR)
    if len(bits) not in (4, 5):
        return ("", "", "")
    return (ids.decode(bits[0]), ids.decode(bits[1]), ids.decode(bits[2]))


def holder_entry(doc: HolderDoc) -> str:
    """The booking entry of a holder document."""
    return entry(doc.get("tenantId") or "", doc.get("projectId") or "", doc.get("userId") or "", doc["_id"],
                 doc.get("attemptId"))


def superseded(value: str, holder: HolderDoc | None) -> bool:
    """Whether the entry ``value`` books for nobody: its holder (as read, ``_id`` and
    ``attemptId``) is gone, or was written again since the entry was booked. An entry
    without an attempt counts for any holder of its token (it predates attempts)."""
    if holder is None:
        return True
    attempt = attempt_of(value)
    return attempt is not None and attempt != holder.get("attemptId")


def holder_keys(doc: HolderDoc) -> list[str]:
    """The counter keys a holder may book: the ones it set out to take (``keys``), else the
    ones it registered (documents written before bookings had entries)."""
    return list(doc.get("keys") or doc.get("levels") or ())
