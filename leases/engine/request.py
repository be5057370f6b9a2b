"""What a consumer asks for: :class:`LeaseRequest`, validated before anything is written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidLeaseRequest
from ..ids import validation
from ..revocation import handlers


@dataclass(frozen=True)
class LeaseRequest:
    """What a consumer asks for; ``lease`` (a name) or ``inline`` (a definition), not both.

    Attributes:
        type: the handler type (registered with :func:`leases.revocation.handlers.register_handler`).
        tenant_id, project_id: ``[A-Za-z0-9_][A-Za-z0-9_-]{0,63}``, not starting with ``_``.
        user_id: any Django username or email address (``alice.smith``, ``bob@example.com``),
            1 to 150 characters without whitespace or control characters; compared exactly.
        lease: the name of a defined lease. A name no layer defines acquires ``NOOP``, or
            raises :class:`~leases.errors.UnknownLease` with ``LEASES_UNDEFINED_LEASE = "error"``.
        wait_ms: can only *shorten* the wait: the request waits at most
            ``min(wait_ms, definition waitMs)`` (the definition's default is 0, no wait), so
            ``wait_ms=3000`` on a lease without ``waitMs`` answers :class:`LeaseBusy` at
            once. The operator's ``waitMs`` is the ceiling: a caller cannot hold workers or
            queue places longer than the lease allows. None: the definition's ``waitMs``.
        priority: a class of the definition's ``priorities``; None: its default class.
        interval_seconds: a proposed renewal interval; the server clamps it (HTTP).
    """

    type: str
    tenant_id: str
    project_id: str
    user_id: str
    lease: str | None = None
    inline: dict[str, Any] | None = None
    holder_ref: str = ""
    pod: str | None = None  # None: this process's pod; "": detached (HTTP clients), idle reap only
    pod_bound: bool = False
    wait_ms: int | None = None  # shortens the definition's waitMs, never lengthens it (docstring)
    priority: str | None = None  # a class of the definition's ``priorities``; None: its default
    interval_seconds: int | None = None  # proposed renewal interval; the server clamps it (HTTP)

    def validated(self) -> "LeaseRequest":
        """Check every field; returns self.

        Raises:
            InvalidLeaseRequest: a bad id, name or flag.
            UnknownLeaseType: ``type`` has no registered handler.
        """
        handlers.get_handler(self.type)
        # request_id: the reserved layer ids (_vance, _tenant) are no request's tenant or project.
        validation.request_id(self.tenant_id, "tenant id")
        validation.request_id(self.project_id, "project id")
        validation.user_id(self.user_id)
        validation.holder_ref(self.holder_ref)
        if self.pod:
            validation.pod_id(self.pod)
        elif self.pod is not None and self.pod != "":
            raise InvalidLeaseRequest("pod must be a pod id, '' (detached) or None (this pod)")
        if not isinstance(self.pod_bound, bool):
            raise InvalidLeaseRequest("pod_bound must be a bool")
        if self.lease is not None and self.inline is not None:
            raise InvalidLeaseRequest("give either lease (a name) or inline (a definition), not both")
        if self.lease is not None:
            validation.lease_name(self.lease)
        if self.wait_ms is not None and (isinstance(self.wait_ms, bool) or not isinstance(self.wait_ms, int) or self.wait_ms < 0):
            raise InvalidLeaseRequest("wait_ms must be a non-negative int")
        if self.priority is not None:
            validation.priority_class(self.priority)
            if self.inline is not None:
                # An inline definition names no classes: refused whether or not it has caps
                # (an uncapped one would otherwise answer NOOP, a capped one this error).
                raise InvalidLeaseRequest(f"inline lease definitions define no priority classes; got {self.priority!r}")
        if self.interval_seconds is not None and (isinstance(self.interval_seconds, bool) or not isinstance(
                self.interval_seconds, int) or self.interval_seconds < 1):
            raise InvalidLeaseRequest("interval_seconds must be a positive int")
        return self
