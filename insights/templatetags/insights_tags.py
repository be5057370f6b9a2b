"""Small display filters for Insights pages (times relative to MongoDB's clock, JSON)."""

from __future__ import annotations

import json
from datetime import datetime

from django import template

register = template.Library()


@register.simple_tag
def brand() -> str:
    """The host's name for the Insights pages (``LEASES_BRAND``, default the seed's "Vance")."""
    from leases.conf import lease_settings

    return str(lease_settings.BRAND)


def _duration(seconds: float) -> str:
    seconds = int(round(abs(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    return f"{hours // 24}d {hours % 24}h"


@register.filter
def since(value: datetime | None, now: datetime | None) -> str:
    """``value`` relative to ``now`` (both server time): "12s ago"."""
    if value is None or now is None:
        return "—"
    return f"{_duration((now - value).total_seconds())} ago"


@register.filter
def due_in(value: datetime | None, now: datetime | None) -> str:
    """A future server time relative to ``now``: "in 3s" ("now" once it has passed)."""
    if value is None or now is None:
        return "—"
    seconds = (value - now).total_seconds()
    return "now" if seconds < 1 else f"in {_duration(seconds)}"


@register.filter
def remaining(seconds: float | None) -> str:
    """TTL remaining; a negative value is a holder the next sweep reaps."""
    if seconds is None:
        return "—"
    if seconds < 0:
        return f"expired {_duration(seconds)} ago"
    return _duration(seconds)


@register.filter
def compact_json(value) -> str:
    """One-line JSON for payload cells."""
    if not value:
        return ""
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), default=str)


@register.filter
def pretty_json(value) -> str:
    return json.dumps(value or {}, sort_keys=True, indent=2, default=str)


@register.filter
def readable_key(value: str | None) -> str:
    """A counter key with its scope's ids decoded (``r|user|acme/a%2Fb`` → ``r|user|acme/a/b``);
    display only, links keep the stored key."""
    from leases import ids

    return "" if not value else ids.readable_key(value)
