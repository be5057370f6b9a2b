"""A held lease: check-at-use and renew, replace the payload, release (idempotent).

The renewal and the release are the store's (:func:`leases.engine.holders.renew`,
:func:`leases.engine.holders.release`); a release whose first try failed part-way returns its
own booking entries by value, which nobody can pull twice. ``NOOP`` is the lease of an
unlimited resource: it sends no command at all.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any, Protocol

import pymongo.errors

from ..definitions.model import LeaseDefinition
from ..errors import LeaseLost, LeaseUnavailable
from ..ids import validation
from ..queue import slots
from ..store import client as store
from ..store.documents import HolderDoc
from ..telemetry import metrics
from . import holders
from .request import LeaseRequest

log = logging.getLogger(__name__)


class PendingClaim(Protocol):
    """A grant's mark ``HELD`` still under way (:class:`leases.engine.claims.PendingClaim`)."""

    def wait(self) -> None: ...

    def drop(self) -> None: ...


class Lease:
    """A held lease. Use as a context manager or call :meth:`release` (idempotent)."""

    is_noop = False
    #: Seconds the wait estimate said this grant would take when the request queued (None:
    #: it did not queue, or the gate had no hold history yet).
    estimated_wait_s: float | None = None
    #: How that estimate came out, as update operators for the gate: a grant claimed from a
    #: direct hand-off booked nothing itself, so its release's gate update records it.
    grant_outcome: dict[str, Any] | None = None

    def __init__(self, token: str, definition: LeaseDefinition, request: LeaseRequest, levels: list[str],
                 expires_at: datetime | None = None, acquired_at: datetime | None = None,
                 last_seen_at: datetime | None = None, interval_seconds: int | None = None,
                 attempt_id: str | None = None, fence: str | None = None):
        self.token = token
        #: The fence its grant issued (:mod:`leases.fencing`): an opaque string the resource
        #: checks with ``FenceGuard.admit``; None only for a lease granted before fences existed.
        self.fence = fence
        self.attempt_id = attempt_id  # the holder's attemptId, named by its booking entries
        self.definition = definition
        self.request = request
        self.levels = levels
        self.expires_at = expires_at  # MongoDB's clock, as of the grant or the last renewal
        self.acquired_at = acquired_at
        self.last_seen_at = last_seen_at  # MongoDB's clock at the grant or the last renewal
        self.interval_seconds = interval_seconds  # the server-issued renewal interval
        self._released = False
        # Set before a release sends anything: from then on the lease is over for its owner,
        # whatever the store answers (a command applied whose answer was lost may have handed
        # the slot on), so check() refuses and only release() may still be called (a retry).
        self._ending = False
        self._release_failed = False
        self._granted = time.monotonic()  # a duration for wait estimates, never a TTL
        #: A grant answered before its holder was marked HELD (:mod:`leases.engine.claims`):
        #: every store call on the lease waits for the mark first.
        self.pending_claim: PendingClaim | None = None

    @property
    def resource(self) -> str:
        return self.definition.resource

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.release()
        except LeaseUnavailable:
            if exc_type is None:
                raise
            # The body's own error matters more; the slot comes back through reap/repair.
            log.warning("release of %s failed after an error in the lease's block", self.token)

    def __repr__(self) -> str:
        return f"<Lease {self.definition.name} {self.token[:8]}… on {self.resource}>"

    def _scope(self) -> holders.Scope:
        return holders.scope(self.request.tenant_id, self.request.project_id)

    def wait_claimed(self) -> None:
        """Block until the holder's record says ``HELD``: a grant handed over by a release
        is answered at once and marked later, in the background (:mod:`leases.engine.claims`),
        or now by this call; meanwhile :attr:`expires_at` is the claim window's end.
        A no-op for any other lease. :meth:`check` and :meth:`update_payload` call it first
        (:meth:`release` needs no mark: it ends the holder as it is).

        Raises:
            LeaseLost: the claim came too late (``LeaseExpired``, reason ``unclaimed``).
            LeaseUnavailable: the store failed while claiming (the next call tries again).
        """
        if self.pending_claim is not None:
            self.pending_claim.wait()
            self.pending_claim = None

    def _renew(self, payload: dict[str, Any] | None = None) -> None:
        self.wait_claimed()
        doc = holders.renew(self.token, bound=self._scope(), payload=payload)
        self.expires_at, self.last_seen_at = doc["expiresAt"], doc["lastSeenAt"]

    def check(self) -> None:
        """Check-at-use and renew: call at every usage step; the TTL runs from here.

        The renewal rule is the one of every path (:func:`leases.engine.holders.renew`): a lease
        past its deadline is not revived but ends (``LeaseExpired``, reaped now).

        Raises:
            LeaseLost: the lease ended: ``LeaseExpired`` (reaped, revoked, released — the
                reason says which) or ``StaleLease`` (the store forgot it).
            LeaseUnavailable: the store is unreachable.
        """
        if self._ending:
            # Also after a release that failed: its commands may have landed, the slot gone on.
            metrics.CHECK.labels(resource=metrics.resource_tag(self.resource), outcome="lost").inc()
            raise LeaseLost(f"lease {self.token} was released")
        self._renew()

    def update_payload(self, payload: dict[str, Any]) -> None:
        """Replace the payload the revocation handler will get (also a renewal).

        Raises:
            InvalidLeaseRequest: the payload is not a safe JSON-like dict.
            LeaseLost: the lease is no longer held (``LeaseExpired`` / ``StaleLease``).
            LeaseUnavailable: the store is unreachable.
        """
        validation.payload(payload)
        if self._ending:
            raise LeaseLost(f"lease {self.token} was released")
        self._renew(payload)

    def release(self) -> bool:
        """Give the slots back. Idempotent; True once, for the call that completed the release
        (a retry after a try that failed part-way included), False for any later one.

        A regular release never calls the type's handler: the holder cleans up itself. A
        grant whose claim came too late (:meth:`wait_claimed`) was never held for sure: its
        release answers False. It does not wait for a claim under way.

        The lease is over for its owner from the moment this is called, whatever the store
        answers: :meth:`check` and :meth:`update_payload` raise ``LeaseLost`` from then on.

        Raises:
            LeaseUnavailable: the store failed part-way (perhaps after the holder was deleted
                and the slot handed on); calling ``release()`` again finishes it, and a slot
                nobody retries for comes back by repair (holder gone) or by the reap of the
                holder (still there, with its slots booked: nobody renews it).
        """
        tag = metrics.resource_tag(self.resource)
        if self._released:
            metrics.RELEASE.labels(resource=tag, outcome="already-released").inc()
            return False
        self.drop_claim()
        self._ending = True
        try:
            held_ms = (time.monotonic() - self._granted) * 1000
            doc = holders.release_owned(self.token, list(self.levels), self._booking(), bound=self._scope(),
                                        hold_ms=held_ms, outcome=self.grant_outcome, known=self._holder(),
                                        retry=self._release_failed)
        except pymongo.errors.PyMongoError as exc:
            self._release_failed = True
            metrics.RELEASE.labels(resource=tag, outcome="error").inc()
            raise LeaseUnavailable(store.unreachable("lease store", exc, " during release")) from None
        self._released = True
        if doc is None:
            metrics.RELEASE.labels(resource=tag, outcome="already-released").inc()
        return doc is not None

    def drop_claim(self) -> None:
        """Before a release: the release ends the holder as it is, PENDING or HELD, and waits
        for no mark: one not sent yet never is; one under way lands before the delete, or
        after it and matches nobody (it marks only the holder as written). A grant whose mark
        came too late finds its entry gone and answers False."""
        if self.pending_claim is not None:
            self.pending_claim.drop()
            self.pending_claim = None

    def _holder(self) -> HolderDoc:
        """What this lease knows of its holder document: what a release needs of it."""
        r = self.request
        doc: HolderDoc = {"_id": self.token, "keys": list(self.levels), "levels": list(self.levels),
                          "resource": self.resource, "tenantId": r.tenant_id, "projectId": r.project_id,
                          "userId": r.user_id, "state": "HELD"}
        if self.attempt_id is not None:  # a holder written before attempts existed has none
            doc["attemptId"] = self.attempt_id
        return doc

    def _booking(self) -> str:
        r = self.request
        return slots.entry(r.tenant_id, r.project_id, r.user_id, self.token, self.attempt_id)


class NoopLease:
    """The lease of an unlimited resource: every operation succeeds without MongoDB."""

    is_noop = True
    token = None
    resource = None
    definition = None
    fence = None  # an unlimited resource is never fenced

    def __enter__(self) -> "NoopLease":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def check(self) -> None:
        return None

    def update_payload(self, payload: dict[str, Any]) -> None:
        validation.payload(payload)

    def release(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<Lease NOOP>"


NOOP = NoopLease()


def release_token(token: str, *, resource: str | None = None) -> bool:
    """Release the holder ``token``.

    Returns:
        True if this call deleted the holder, False if it was already gone.

    Raises:
        LeaseUnavailable: the store failed before the holder was deleted (retryable).
    """
    try:
        doc = holders.release(token)
    except pymongo.errors.PyMongoError as exc:
        metrics.RELEASE.labels(resource=metrics.resource_tag(resource or "unknown"), outcome="error").inc()
        raise LeaseUnavailable(store.unreachable("lease store", exc, " during release")) from None
    if doc is None:
        metrics.RELEASE.labels(resource=metrics.resource_tag(resource or "unknown"), outcome="already-released").inc()
        return False
    return True
