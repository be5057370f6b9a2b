"""The fence string: what a grant hands its holder and the resource checks.

A fence names three things: the *counter* it belongs to (its key, ``<resource>|<level>|<scope>``),
the *slot* within that counter (``0 <= slot < cap`` when it was issued) and the slot's
*generation*, which strictly increases each time the slot is granted (see
:mod:`leases.queue.fences`). It travels as one opaque, header-safe string::

    1.<counter key, base64url without padding>.<slot>.<generation>

Holders treat it as opaque (it may change shape with its version prefix); the resource's
guard (:mod:`leases.fencing`) decodes it here. Nothing in this module needs Django.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from ..errors import InvalidFence

VERSION = "1"
# A counter key is a few hundred characters at most (ids are bounded); a fence is bounded
# so that a header or a job's metadata can carry it and a guard never decodes megabytes.
MAX_FENCE_CHARS = 1024
MAX_SLOT = 10**9  # a cap's upper bound (leases.definitions)
MAX_GENERATION = 2**63 - 1  # stored as a BSON int64
# Decimal without leading zeros (so that one number has one spelling, and Redis can compare
# generations as strings: longer is larger, equal lengths compare digit by digit).
_NUMBER = r"(?:0|[1-9][0-9]{0,18})"
_FENCE_RE = re.compile(rf"{VERSION}\.([A-Za-z0-9_-]{{1,{MAX_FENCE_CHARS}}})\.({_NUMBER})\.({_NUMBER})")


@dataclass(frozen=True)
class Fence:
    """A decoded fence: ``counter`` key, ``slot`` and ``generation``."""

    counter: str
    slot: int
    generation: int

    def __str__(self) -> str:
        return encode(self.counter, self.slot, self.generation)


def encode(counter: str, slot: int, generation: int) -> str:
    """The fence string of ``generation`` on ``slot`` of ``counter``.

    Raises:
        InvalidFence: a value out of range (the engine never issues one).
    """
    if not counter or not 0 <= slot < MAX_SLOT or not 1 <= generation <= MAX_GENERATION:
        raise InvalidFence(f"no fence for counter {counter!r} slot {slot} generation {generation}")
    key = base64.urlsafe_b64encode(counter.encode("utf-8")).decode("ascii").rstrip("=")
    return f"{VERSION}.{key}.{slot}.{generation}"


def decode(fence: object) -> Fence:
    """Parse a fence string (strictly: one spelling per fence).

    Raises:
        InvalidFence: not a string, too long, another version or shape, a slot or
            generation out of range, or a counter key that is not base64url UTF-8.
    """
    if not isinstance(fence, str):
        raise InvalidFence(f"a fence is a string, got {type(fence).__name__}")
    if len(fence) > MAX_FENCE_CHARS:
        raise InvalidFence(f"a fence has at most {MAX_FENCE_CHARS} characters, got {len(fence)}")
    match = _FENCE_RE.fullmatch(fence)
    if match is None:
        raise InvalidFence("malformed fence (expected 1.<counter>.<slot>.<generation>)")
    raw, slot_text, generation_text = match.groups()
    slot, generation = int(slot_text), int(generation_text)
    if slot >= MAX_SLOT or not 1 <= generation <= MAX_GENERATION:
        raise InvalidFence(f"fence slot {slot} or generation {generation} out of range")
    try:
        counter = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidFence("malformed fence: its counter is not base64url UTF-8") from None
    if not counter or encode(counter, slot, generation) != fence:
        raise InvalidFence("malformed fence: not in its one spelling")
    return Fence(counter, slot, generation)
