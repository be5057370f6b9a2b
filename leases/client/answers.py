"""How the HTTP lease API's answers read: times, the engine's exceptions, the server's pauses.

Pure functions of a ``requests`` response: a problem answer (status and ``code``) becomes
the exception the engine raises for the same condition (:func:`error_from`), and
``Retry-After`` or the body's hint becomes a pause (:func:`poll_pause`).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import requests

from ..errors import (
    ApiKeyRejected,
    HttpProblem,
    InvalidLeaseRequest,
    LeaseBusy,
    LeaseError,
    LeaseExpired,
    LeaseLost,
    LeaseUnavailable,
    StaleLease,
    by_code,
)


def parse_time(value: str | None) -> datetime | None:
    """An ISO time of the API (``Z`` for UTC) as an aware datetime; None for none."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


def error_from(response: requests.Response) -> LeaseError:
    """The exception for a problem answer: the engine's class for the status or code, else :class:`HttpProblem`."""
    try:
        body = response.json()
        if not isinstance(body, dict):
            body = {}
    except ValueError:
        body = {}
    code = body.get("code") or ""
    detail = body.get("detail") or f"HTTP {response.status_code}"
    status = response.status_code
    if status == 429 or code == "LEASE_BUSY":
        return LeaseBusy(resource=body.get("resource", "?"), level=body.get("level", "?"),
                         scope=body.get("scope", "?"), count=body.get("count"), cap=body.get("cap", 0),
                         retry_after=_retry_after(response, body))
    if status == 410 or code in ("STALE_LEASE", "EXPIRED"):
        if code == "EXPIRED":
            return LeaseExpired(detail, reason=body.get("reason"))
        return StaleLease(detail)
    if status == 503 or code == "LEASE_UNAVAILABLE":
        return LeaseUnavailable(detail)
    if status == 401:
        return ApiKeyRejected(detail, status=status, problem_code=code or None, body=body)
    known = by_code(code) if code else None
    if known is not None and (issubclass(known, (HttpProblem, LeaseBusy, LeaseLost, LeaseUnavailable))):
        known = None  # answered by status above; a code alone does not make them
    if status == 400:
        # The server's own class when the code names one (INVALID_BODY, UNKNOWN_LEASE_TYPE...).
        if known is None or not issubclass(known, InvalidLeaseRequest):
            known = InvalidLeaseRequest
        return known(detail)
    if status >= 500:
        return LeaseUnavailable(f"lease server error {status}: {detail}")
    if known is not None:
        return known(detail)  # e.g. 403 PROJECT_FORBIDDEN
    return HttpProblem(detail, status=status, problem_code=code or None, body=body)


def _retry_after(response: requests.Response, body: dict[str, Any]) -> float:
    """The server's suggested delay: ``Retry-After``, else ``retryAfterSeconds``, else 1 s."""
    for value in (response.headers.get("Retry-After"), body.get("retryAfterSeconds")):
        try:
            return max(0.0, float(value))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
    return 1.0


def poll_pause(response: requests.Response, ticket: dict[str, Any]) -> float:
    """Seconds until the next ticket poll: ``Retry-After`` (0 after a poll that waited for the
    grant to its end: poll again now), else ``pollIntervalSeconds``."""
    for value, least in ((response.headers.get("Retry-After"), 0.0), (ticket.get("pollIntervalSeconds"), 0.001)):
        try:
            pause = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if pause >= least and not math.isnan(pause):
            return min(pause, 60.0)
    return 1.0
