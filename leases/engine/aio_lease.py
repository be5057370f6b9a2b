"""A held lease for asyncio code: the sync lease's renewal and release, on the async client.

The same commands and verdicts as :class:`leases.engine.lease.Lease` (``holders.renewal``,
``holders.deletion``, the ending's give-back and tombstone), each step under the same
store bound; ending a holder found past its deadline runs in a thread (the engine's reap).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pymongo.errors
from pymongo import ReturnDocument

from ..errors import LeaseLost, LeaseUnavailable
from ..ids import validation
from ..queue import estimates
from ..store import client as store
from ..telemetry import metrics
from . import holders
from .aio_counters import give_back
from .lease import Lease
from .step import store_bound

log = logging.getLogger(__name__)


class AsyncLease:
    """A held lease for asyncio code; ``async with`` releases it (:meth:`arelease`, idempotent)."""

    is_noop = False

    def __init__(self, lease: Lease):
        self._lease = lease
        self._released = False
        self._ending = False  # a release began: over for its owner, whatever the store answers
        self._release_failed = False

    token = property(lambda self: self._lease.token)
    definition = property(lambda self: self._lease.definition)
    request = property(lambda self: self._lease.request)
    levels = property(lambda self: self._lease.levels)
    expires_at = property(lambda self: self._lease.expires_at)
    acquired_at = property(lambda self: self._lease.acquired_at)
    #: The fence its grant issued (an opaque string; see :attr:`leases.Lease.fence`).
    fence = property(lambda self: self._lease.fence)
    resource = property(lambda self: self._lease.resource)

    def __repr__(self) -> str:
        return f"<AsyncLease {self.definition.name} {self.token[:8]}… on {self.resource}>"

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        try:
            await self.arelease()
        except LeaseUnavailable:
            if exc_type is None:
                raise
            # The body's own error matters more; the slot comes back through reap/repair.
            log.warning("release of %s failed after an error in the lease's block", self.token)

    async def _renew(self, payload: dict[str, Any] | None = None) -> None:
        """:func:`leases.engine.holders.renew` on the async client: the same command and verdict;
        ending a holder found past its deadline runs in a thread (the engine's reap)."""
        if self._lease.pending_claim is not None:
            # Granted by a hand-off and answered before its mark: the renewal needs the holder
            # HELD (the mark is sent now if not due yet; bounded by the store bound and the
            # claim window).
            await asyncio.to_thread(self._lease.wait_claimed)
        bound = holders.scope(self.request.tenant_id, self.request.project_id)
        db = store.async_db()
        error: LeaseLost | None = None
        try:
            with store_bound():
                doc = await db[store.HOLDERS].find_one_and_update(
                    *holders.renewal(holders.scoped(self.token, bound), payload=payload),
                    projection=holders.GRANT_FIELDS, return_document=ReturnDocument.AFTER)
                if doc is None:
                    tombstone = await db[store.TOMBSTONES].find_one(*holders.ended_lookup(self.token, bound))
                    error = holders.answer_for(self.token, tombstone)
                elif holders.verdict(doc) == holders.EXPIRED:
                    error = await asyncio.to_thread(holders.expire, self.token)
                elif holders.verdict(doc) == holders.KEEP_LATER:
                    await db[store.HOLDERS].update_one(*holders.keep_later(self.token, doc["priorExpiresAt"]))
                    doc["expiresAt"] = doc["priorExpiresAt"]
        except pymongo.errors.PyMongoError as exc:
            raise LeaseUnavailable(store.unreachable("lease store", exc, " during renewal")) from None
        holders.count_check(doc, error is None)
        if error is not None:
            raise error
        assert doc is not None  # no error means the renewal matched
        self._lease.expires_at, self._lease.last_seen_at = doc["expiresAt"], doc["lastSeenAt"]

    async def acheck(self) -> None:
        """Check-at-use and renew, as :meth:`leases.Lease.check` (the same renewal rule).

        Raises:
            LeaseLost: the lease ended (``LeaseExpired`` with the reason, or ``StaleLease``).
            LeaseUnavailable: the store is unreachable.
        """
        if self._ending:
            metrics.CHECK.labels(resource=metrics.resource_tag(self.resource), outcome="lost").inc()
            raise LeaseLost(f"lease {self.token} was released")
        await self._renew()

    async def aupdate_payload(self, payload: dict[str, Any]) -> None:
        """Replace the payload the revocation handler will get (also a renewal).

        Raises:
            InvalidLeaseRequest: the payload is not a safe JSON-like dict.
            LeaseLost: the lease is no longer held (``LeaseExpired`` / ``StaleLease``).
            LeaseUnavailable: the store is unreachable.
        """
        validation.payload(payload)
        if self._ending:
            raise LeaseLost(f"lease {self.token} was released")
        await self._renew(payload)

    async def arelease(self) -> bool:
        """Give the slots back, as :meth:`leases.Lease.release`: idempotent, True only for
        the call that released; the freed gate slot is handed to the next waiting ticket.

        Raises:
            LeaseUnavailable: the store failed part-way; calling ``arelease()`` again finishes
                it (slots already returned are not returned twice). :meth:`acheck` refuses
                from the first call on, whatever the store answered.
        """
        tag = metrics.resource_tag(self.resource)
        if self._released:
            metrics.RELEASE.labels(resource=tag, outcome="already-released").inc()
            return False
        self._lease.drop_claim()  # as the sync release
        self._ending = True
        booking = self._lease._booking()
        # How long the slot was held, kept on the gate for wait estimates (as the sync release).
        hold_ms = (time.monotonic() - self._lease._granted) * 1000
        bound = holders.scope(self.request.tenant_id, self.request.project_id)
        db = store.async_db()
        try:
            with store_bound():
                # The holder first, as the sync release (holders.release_owned): a holder whose
                # slot has gone on must never be left to renew. Then the slots, by value, so a
                # retry returns nothing twice; shielded: a caller cancelled now must not strand
                # them until repair.
                # A plain delete, as the sync release with what the owner knows of its holder
                # (a findAndModify the embedded server answers by scanning the holders).
                known = self._lease._holder()
                deleted = await db[store.HOLDERS].delete_one(holders.scoped(self.token, bound))
                doc = known if deleted.deleted_count else None
                await asyncio.shield(give_back(list(self.levels), booking, record=estimates.merged(
                    estimates.hold_update(hold_ms if doc is not None else None), self._lease.grant_outcome)))
            if doc is None and self._release_failed:
                # An earlier try's delete may have landed, its answer lost: the tombstone says.
                doc = await asyncio.to_thread(holders.released_before, self._lease._holder())
                if doc is not None:
                    self._released = True
                    return True
        except pymongo.errors.PyMongoError as exc:
            self._release_failed = True
            metrics.RELEASE.labels(resource=tag, outcome="error").inc()
            raise LeaseUnavailable(store.unreachable("lease store", exc, " during release")) from None
        self._released = True
        if doc is None:
            metrics.RELEASE.labels(resource=tag, outcome="already-released").inc()
            return False
        # The rest of leases.engine.holders.release_owned, the same steps on this client.
        ending = holders.Ending.of(doc, "release", hold_ms=hold_ms)
        try:
            with store_bound():
                if ending.tombstone is not None:
                    await db[store.TOMBSTONES].update_one(*ending.tombstone, upsert=True)
        except pymongo.errors.PyMongoError as exc:
            ending.account(exc)
            return True
        ending.account()
        return True


class AsyncNoopLease:
    """The async lease of an unlimited resource: no MongoDB traffic at all."""

    is_noop = True
    token = None
    resource = None
    definition = None
    fence = None  # an unlimited resource is never fenced

    async def __aenter__(self) -> "AsyncNoopLease":
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def acheck(self) -> None:
        return None

    async def aupdate_payload(self, payload: dict[str, Any]) -> None:
        validation.payload(payload)

    async def arelease(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<AsyncLease NOOP>"


ANOOP = AsyncNoopLease()
