"""Lease types and their revocation handlers.

Every lease ``type`` names a :class:`LeaseHandler`; the request's type must be registered
before acquiring, so the reaper can always dispatch a revocation later.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, cast

from ..errors import HandlerAlreadyRegistered, InvalidLeaseRequest, UnknownLeaseType
from ..ids.validation import LEASE_NAME_RE
from ..store.documents import HolderDoc


@dataclass(frozen=True)
class RevokedHolder:
    """What a handler gets to clean up a revoked lease: the holder document as it was."""

    token: str
    type: str
    resource: str
    lease_name: str
    tenant_id: str
    project_id: str
    user_id: str
    holder_ref: str
    pod: str
    pod_bound: bool
    payload: dict[str, Any] = field(default_factory=dict)
    levels: tuple[str, ...] = ()
    reason: str = "idle"
    acquired_at: datetime | None = None
    last_seen_at: datetime | None = None

    @classmethod
    def from_doc(cls, doc: HolderDoc, reason: str) -> "RevokedHolder":
        """Build from a holder document as stored in ``resource_lease_holders``."""
        return cls(
            token=doc["_id"],
            type=doc.get("type", ""),
            resource=doc.get("resource", ""),
            lease_name=doc.get("leaseName", ""),
            tenant_id=doc.get("tenantId", ""),
            project_id=doc.get("projectId", ""),
            user_id=doc.get("userId", ""),
            holder_ref=doc.get("holderRef", ""),
            pod=doc.get("pod", ""),
            pod_bound=bool(doc.get("podBound", False)),
            payload=dict(doc.get("payload") or {}),
            levels=tuple(doc.get("levels") or ()),
            reason=reason,
            acquired_at=doc.get("acquiredAt"),
            last_seen_at=doc.get("lastSeenAt"),
        )

    def to_wire(self) -> dict[str, Any]:
        """JSON-safe form for the cross-pod revocation POST."""
        return {
            "token": self.token, "type": self.type, "resource": self.resource,
            "leaseName": self.lease_name, "tenantId": self.tenant_id,
            "projectId": self.project_id, "userId": self.user_id,
            "holderRef": self.holder_ref, "pod": self.pod, "podBound": self.pod_bound,
            "payload": self.payload, "levels": list(self.levels), "reason": self.reason,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> "RevokedHolder":
        """Inverse of :meth:`to_wire`."""
        doc = {"_id": data["token"], **{k: v for k, v in data.items() if k not in ("token", "reason")}}
        return cls.from_doc(cast(HolderDoc, doc), data.get("reason", "revoke"))


class LeaseHandler:
    """Cleans up a resource whose lease was revoked (reaped or revoked by an operator).

    Subclasses set the class attribute ``type`` and implement :meth:`on_revoked`. A regular
    ``release()`` never calls the handler: the holder cleans up its own resource.
    """

    type: ClassVar[str] = ""

    def on_revoked(self, holder: RevokedHolder) -> None:
        """Clean up after ``holder`` lost its lease."""
        raise NotImplementedError


_lock = threading.Lock()
_registry: dict[str, LeaseHandler] = {}


def register_handler(handler: LeaseHandler, *, replace: bool = False) -> LeaseHandler:
    """Register ``handler`` for its ``type``.

    A type has one handler: a second, different handler for it is refused unless the
    caller says ``replace=True`` — two plug-ins claiming one type would otherwise decide
    silently, by import order, which cleanup runs. Registering the same handler object
    again changes nothing.

    Raises:
        InvalidLeaseRequest: the handler has no valid ``type`` or no ``on_revoked``.
        HandlerAlreadyRegistered: another handler has that type and ``replace`` is False.
    """
    handler_type = getattr(handler, "type", "")
    if not isinstance(handler_type, str) or LEASE_NAME_RE.fullmatch(handler_type) is None:
        raise InvalidLeaseRequest(f"handler type {handler_type!r} is not a valid type name")
    if not callable(getattr(handler, "on_revoked", None)):
        raise InvalidLeaseRequest(f"handler for {handler_type!r} has no on_revoked")
    with _lock:
        current = _registry.get(handler_type)
        if current is not None and current is not handler and not replace:
            raise HandlerAlreadyRegistered(
                f"lease type {handler_type!r} already has a handler ({type(current).__qualname__}); "
                "pass replace=True to replace it")
        _registry[handler_type] = handler
    return handler


def unregister_handler(handler_type: str) -> None:
    """Remove the handler of ``handler_type`` (tests and plug-in unloading)."""
    with _lock:
        _registry.pop(handler_type, None)


def get_handler(handler_type: str) -> LeaseHandler:
    """Return the handler registered for ``handler_type``.

    Raises:
        UnknownLeaseType: no handler is registered for it.
    """
    try:
        return _registry[handler_type]
    except (KeyError, TypeError):
        raise UnknownLeaseType(f"lease type {handler_type!r} has no registered handler") from None


def registered_types() -> list[str]:
    """Names of all registered lease types."""
    return sorted(_registry)
