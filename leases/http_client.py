"""The one JSON-over-HTTP client for the calls lease processes make, and their time bounds.

Used for a pod's revocation POST to another pod (:mod:`leases.revocation.dispatch`), the operator CLI's
calls to a pod (``manage.py lease``), a session consumer's calls to its remote service
(:mod:`leases.contrib.sessions`) and the demo consumer's job calls
(:mod:`leases.contrib.demo`). Every call is bounded: the timeouts below are the only ones,
so "how long can this wait" has one answer per kind of call. Standard library only: these
calls run inside handlers and sweeps, where a pooled session of a third-party client
would outlive a fork.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from .errors import HttpCallFailed

__all__ = ["HttpCallFailed", "JsonAnswer", "call_json", "OPERATOR_SWEEP_TIMEOUT_SECONDS", "OPERATOR_TIMEOUT_SECONDS",
           "PEER_TIMEOUT_SECONDS", "REMOTE_TIMEOUT_SECONDS"]

# A revocation offered to a peer pod: the peer only parses, authenticates and schedules.
PEER_TIMEOUT_SECONDS = 3.0
# A consumer's remote service (session handshake, call, DELETE; the demo's job service).
REMOTE_TIMEOUT_SECONDS = 5.0
# The operator CLI to a pod's admin API: the pod answers after waiting up to 5 s for the
# dispatched handlers.
OPERATOR_TIMEOUT_SECONDS = 15.0
# The operator CLI's sweep: a sweep budget of 10 s plus up to 12 s for its dispatches.
OPERATOR_SWEEP_TIMEOUT_SECONDS = 40.0


@dataclass(frozen=True)
class JsonAnswer:
    """An HTTP answer of any status with its JSON body (``None`` when the body was empty)."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def call_json(method: str, url: str, *, timeout: float, body: Any = None,
              headers: dict[str, str] | None = None) -> JsonAnswer:
    """Send ``body`` (JSON; none when ``None``) and return the answer, whatever its status.

    4xx and 5xx answers are answers (callers decide what each means), not exceptions.

    Raises:
        HttpCallFailed: no answer within ``timeout`` seconds per socket operation, the
            connection failed, the URL is malformed, or the body is not JSON.
    """
    sent = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
    data = json.dumps(body).encode() if body is not None else None
    try:
        request = urllib.request.Request(url, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, raw, answer_headers = response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            with exc:
                status, raw, answer_headers = exc.code, exc.read(), dict(exc.headers or {})
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HttpCallFailed(method, url, getattr(exc, "reason", exc)) from None
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        raise HttpCallFailed(method, url, f"HTTP {status} with a body that is not JSON") from None
    return JsonAnswer(status, parsed, answer_headers)
