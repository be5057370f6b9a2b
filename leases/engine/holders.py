"""The holder protocol: renewing, updating and ending a holder, the same way for every caller.

A holder document (``resource_lease_holders``) is a lease once it is ``HELD``. Whoever
renews it (``Lease.check`` in process, ``POST …/renew`` over HTTP), replaces its payload,
releases it, revokes it or reaps it goes through this module, so a token answers the same
whichever path touched it last:

* **Renewal** moves the deadline to ``max(previous deadline, now + ttl)`` on MongoDB's
  clock, so duplicate, delayed or replayed renewals never move it backwards. A holder
  already past its deadline is not revived: the renewal command itself leaves its
  deadline (and payload) as they were, answers ``EXPIRED`` and reaps it on the spot (the
  slot comes back and the handler is dispatched, as the sweep would); if that reap fails,
  the next renewal finds it expired again.
* **Ending** a holder (release, revocation, idle or pod reap) deletes it, returns its
  slots by entry (handing the gate slot to the next waiter) and leaves a tombstone, so a
  later renewal or release answers ``EXPIRED`` with the reason, not ``STALE_LEASE``.
  Every tombstone has the one shape of :func:`leases.store.tombstones.tombstone_fields` (tenant, project,
  resource, reason, time), whoever writes it: an ended holder, a dropped or abandoned
  ticket (:func:`drop_ticket`, the queue's prune), the dispatcher's claim.
* **Scope**: a caller bound to a tenant (an API key, a tenant's operator) passes its
  scope; it is part of every filter, so another tenant's token answers like one that
  never existed.

The embedded server compares a stored date with ``$$NOW`` wrongly (it does compare them
as epoch milliseconds, ``$toLong``), so the renewal command decides in those terms whether
to move the deadline, keeps the previous deadline in ``priorExpiresAt``, and the caller's
verdict is made on the two server-clock values the command returns. The common renewal
is therefore one command; only a kept later deadline costs a second one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pymongo
import pymongo.errors
from pymongo import ReturnDocument

from ..errors import LeaseExpired, LeaseUnavailable, StaleLease
from ..queue import estimates, waiting
from ..revocation import listener
from ..revocation.handlers import RevokedHolder
from ..store import client as store, entries
from ..store.documents import HolderDoc
from ..store.holder_commands import (
    GRANT_FIELDS,
    Scope,
    deletion,
    ended_lookup,
    held,
    keep_later,
    pending_deletion,
    renewal,
    scope,
    scoped,
)
from ..store.tombstones import tombstone_upsert
from ..telemetry import history, metrics
from .intervals import interval_expression
from .pausepoints import pause_point

log = logging.getLogger(__name__)

# The builders (leases.store.holder_commands) callers of this module reach through it.
__all__ = ["GRANT_FIELDS", "Scope", "deletion", "ended_lookup", "keep_later", "renewal", "scope", "scoped"]

RENEWED = "renewed"
EXPIRED = "expired"      # it was past its deadline: end it, answer EXPIRED
KEEP_LATER = "keep-later"  # renewed, but the replaced deadline was later: keep that one


def verdict(doc: HolderDoc) -> str:
    """What the renewal that returned ``doc`` means: :data:`RENEWED`, :data:`EXPIRED` or
    :data:`KEEP_LATER` (both times are MongoDB's, from the same command)."""
    prior = doc.get("priorExpiresAt")
    if prior is None:
        return RENEWED
    if prior < doc["lastSeenAt"]:
        return EXPIRED
    return KEEP_LATER if prior > doc["expiresAt"] else RENEWED


def _interval(proposed: int | None) -> dict[str, Any] | None:
    """The renewal's re-negotiated interval as a pipeline expression (none: kept)."""
    return None if proposed is None else interval_expression(proposed)


def answer_for(token: str, tombstone: dict[str, Any] | None, *, noun: str = "lease") -> LeaseExpired | StaleLease:
    """Why ``token`` matched no renewal (or no poll, ``noun="ticket"``): its tombstone says
    it ended (EXPIRED with the reason), without one it is unknown in the caller's scope
    (STALE_LEASE)."""
    if tombstone is not None:
        return LeaseExpired(f"{noun} {token} has ended ({tombstone.get('reason', 'ended')})",
                            reason=tombstone.get("reason"))
    return StaleLease(f"unknown lease token {token}" if noun == "lease" else f"unknown {noun} {token}")


def count_check(doc: HolderDoc | None, ok: bool) -> None:
    """The check metric of one renewal (resource from the document, never from input)."""
    tag = metrics.resource_tag((doc or {}).get("resource") or "unknown")
    metrics.CHECK.labels(resource=tag, outcome="ok" if ok else "lost").inc()


def renew(token: str, *, bound: Scope | None = None, payload: dict[str, Any] | None = None,
          proposed_interval: int | None = None) -> HolderDoc:
    """Renew the ``HELD`` holder ``token``: deadline ``max(previous, now + ttl)``, and
    optionally a new payload (stored literally) and a re-negotiated interval.

    The caller validated ``token`` and ``payload``. One command; a second one only when
    the previous deadline was later than ``now + ttl`` (a replayed renewal after a clock
    step, or a deadline set further out by a poll) and is kept.

    Returns:
        The holder after the renewal (:data:`GRANT_FIELDS`).

    Raises:
        StaleLease: no such holder (in ``bound``), never issued or long forgotten.
        LeaseExpired: it ended (with the tombstone's reason), or it was past its deadline:
            then it is reaped now, reason ``idle``.
        LeaseUnavailable: the store is unreachable.
    """
    error: LeaseExpired | StaleLease | None = None
    try:
        with store.bounded():
            doc = store.holders().find_one_and_update(
                *renewal(scoped(token, bound), payload=payload, interval=_interval(proposed_interval)),
                projection=GRANT_FIELDS, return_document=ReturnDocument.AFTER)
            if doc is None:
                error = answer_for(token, store.tombstones().find_one(*ended_lookup(token, bound)))
            elif verdict(doc) == EXPIRED:
                error = expire(token)
            elif verdict(doc) == KEEP_LATER:
                store.holders().update_one(*keep_later(token, doc["priorExpiresAt"]))
                doc["expiresAt"] = doc["priorExpiresAt"]
    except pymongo.errors.PyMongoError as exc:
        raise LeaseUnavailable(store.unreachable("lease store", exc, " during renewal")) from None
    count_check(doc, error is None)
    if error is not None:
        raise error
    assert doc is not None  # no error means the renewal matched
    return doc


def expire(token: str) -> LeaseExpired:
    """A renewal came after the deadline: the holder must not live on (the reaper may
    already count on its slot), so end it now instead of waiting for the sweep — slot
    back, tombstone ``idle``, handler dispatched. Never raises; returns the answer.
    """
    try:
        doc = end(held(token), "idle")
        if doc is not None and doc.get("state") == "HELD":  # not one its owner had released
            listener.notify([RevokedHolder.from_doc(doc, "idle")])
    except pymongo.errors.PyMongoError as exc:
        # The sweep reaps it; the next renewal finds it expired again.
        log.warning("holder %s past its deadline: reaping it failed (%s)", token, exc)
    return LeaseExpired(f"lease {token} passed its expiry deadline", reason="idle")


def ended(token: str, bound: Scope | None, *, noun: str = "lease") -> LeaseExpired | StaleLease:
    """Why ``token`` is no lease (or ticket) any more, from its tombstone (one read).

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    return answer_for(token, store.tombstones().find_one(*ended_lookup(token, bound)), noun=noun)


def needs_tombstone(doc: HolderDoc, reason: str) -> bool:
    """A holder that was handed out (``HELD``) — or released by its caller — is asked
    about later; a reaped ``PENDING`` one never reached its consumer, unless it is a kept
    ticket (``polledAt``): its client polls it, and is told EXPIRED, not "unknown"."""
    return reason == "release" or doc.get("state") == "HELD" or doc.get("polledAt") is not None


def record_tombstone(doc: HolderDoc, reason: str) -> None:
    """Remember that a token ended (reaped, revoked, released) so protocols can tell
    "expired" from "never existed"; tombstones expire through a MongoDB TTL index
    (they book no counter, so plain deletion is right for them).

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    store.tombstones().update_one(*tombstone_upsert(doc, reason), upsert=True)


def drop_ticket(query: dict[str, Any], reason: str, *, known: HolderDoc | None = None,
                dequeue: bool = False) -> HolderDoc | None:
    """End a ticket that was never granted: delete its ``PENDING`` holder (``query``, the
    caller's tenant binding included) and tombstone it, so a later poll answers EXPIRED.

    A waiting holder books no slot, so nothing goes back to a counter. ``dequeue``: also
    take the ticket out of its gate's queue (between the delete and the tombstone, as
    the queue itself does). ``known``: the caller already knows the ticket is over (its
    holder as read): it is tombstoned even when someone else deleted the holder first
    (the queue's prune does, and tombstones it too: this writes the same document again).

    Returns:
        The deleted holder, or ``None`` when none matched.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    doc = store.holders().find_one_and_delete(pending_deletion(query))
    if doc is not None and dequeue:
        keys = entries.holder_keys(doc)
        if keys:
            waiting.dequeue(keys[-1], doc["_id"])
    ticket = doc if doc is not None else known
    if ticket is not None:
        record_tombstone(ticket, reason)
    return doc


@dataclass(frozen=True)
class Ending:
    """What is left to do once the holder ``doc`` is deleted, as data, so the sync path
    (:func:`end`) and the async one (``leases.aio``) do the same and differ only in the
    client that sends it, in this order:

    1. return the slots: ``booking`` on each counter of ``keys`` (the gate last, which
       records ``hold_ms`` for wait estimates and hands the freed slot to the next ticket);
    2. write ``tombstone`` (filter, pipeline; an upsert) unless it is ``None``;
    3. :meth:`account` for it.
    """

    doc: HolderDoc
    reason: str
    keys: list[str]
    booking: str
    hold_ms: float | None
    tombstone: tuple[dict[str, Any], list[dict[str, Any]]] | None

    @classmethod
    def of(cls, doc: HolderDoc, reason: str, *, hold_ms: float | None = None) -> Ending:
        """The ending of the deleted holder ``doc``.

        Only a release of a ``HELD`` holder records a hold: ``hold_ms`` as its caller
        measured it, else from the holder's ``heldAt``. A reap records none (an idle or
        dead holder's hold says nothing about how long the resource is used), nor does a
        holder that never held its slots.
        """
        if reason != "release" or doc.get("state") != "HELD":
            hold_ms = None
        elif hold_ms is None:
            hold_ms = estimates.held_ms(doc.get("heldAt"))
        return cls(doc, reason, entries.holder_keys(doc), entries.holder_entry(doc), hold_ms,
                   tombstone_upsert(doc, reason) if needs_tombstone(doc, reason) else None)

    def account(self, failure: Exception | None = None) -> None:
        """Count the ending (a release's outcome, or the reap and its history entry).

        ``failure``: returning the slots or writing the tombstone failed after the delete.
        It is logged and left to repair (an entry whose holder is gone is pulled by the
        next process that finds the counter full, or by the sweep) and to the dispatcher's
        claim (which writes a missing tombstone): the holder has ended all the same, so a
        reap is counted as one; a release is counted as an error.
        """
        if failure is not None:
            log.warning("%s of %s: returning its slots or its tombstone failed (%s); repair returns them",
                        self.reason, self.doc["_id"], failure)
        if self.reason == "release":
            tag = metrics.resource_tag(self.doc.get("resource") or "unknown")
            metrics.RELEASE.labels(resource=tag, outcome="ok" if failure is None else "error").inc()
        else:
            metrics.REAP.labels(reason=self.reason).inc()
            history.reaped(self.doc, self.reason)


def end(query: dict[str, Any], reason: str, *, hold_ms: float | None = None) -> HolderDoc | None:
    """Delete one holder matching ``query`` (:func:`deletion`), then do its
    :class:`Ending`: return its slots, tombstone it, count it.

    Only the one who deletes the holder returns its slots (by entry, so a repairer racing
    it returns each at most once). A holder that was handed out (``HELD``) — or released
    by its caller — gets a tombstone with ``reason``; a ``PENDING`` one that is reaped
    never reached its consumer, so nobody will ask about it as a lease. ``hold_ms``: how
    long a released holder held its slot, as its caller measured it (see :meth:`Ending.of`).

    What fails after the delete is logged and left to repair (:meth:`Ending.account`).

    Returns:
        The deleted holder document, or ``None`` when nothing matched.

    Raises:
        pymongo.errors.PyMongoError: the delete failed; nothing ended.
    """
    with store.bounded():
        doc = store.holders().find_one_and_delete(*deletion(query, reason))
    if doc is None:
        return None
    if reason == "release":
        pause_point("release")  # crash-window tests stop here: deleted, slots not yet returned
    ending = Ending.of(doc, reason, hold_ms=hold_ms)
    try:
        with store.bounded():
            # Whatever this finds, the ending is the one its delete decided: an entry already
            # gone was pulled by a repair that saw the holder gone (after this delete), never
            # by the owner — an owner's release deletes its holder before it returns a slot
            # (release_owned) — so a reap stays a reap, with its handler and its reason.
            waiting.give_back(ending.keys, ending.booking, hold_ms=ending.hold_ms)
    except pymongo.errors.PyMongoError as exc:
        ending.account(exc)
        return doc
    return _closed(doc, ending)


def _closed(doc: HolderDoc, ending: Ending) -> HolderDoc:
    """Write the ending's tombstone and account for it (a failed write is accounted, not raised:
    the holder is gone either way). Returns ``doc``."""
    try:
        with store.bounded():
            if ending.tombstone is not None:
                store.tombstones().update_one(*ending.tombstone, upsert=True)
    except pymongo.errors.PyMongoError as exc:
        ending.account(exc)
        return doc
    ending.account()
    return doc


def release_owned(token: str, keys: list[str], booking: str, *, bound: Scope | None = None,
                  hold_ms: float | None = None, outcome: dict[str, Any] | None = None,
                  known: HolderDoc | None = None, retry: bool = False) -> HolderDoc | None:
    """Release ``token`` by its owner, who knows its ``keys`` and its entry ``booking``:
    delete the holder, then return the slots — the gate's update hands the freed slot over
    to the next ticket at once (:mod:`leases.queue.grants`) — then tombstone it.

    The delete comes first so that a holder whose slot has gone on never exists: a
    release that fails half-way (a command applied whose answer was lost, a timeout, a
    crash) leaves either the holder with its slots booked (nothing happened yet), or slots
    booked for a holder that is gone — which repair pulls (the next process that finds the
    counter full, ≤ 1 s) and a retry of the release returns by value. Never a live ``HELD``
    holder whose slot another lease holds: nobody can renew it past the cap, and whoever
    reaps a ``HELD`` holder knows it was not released (its handler runs). The price is one
    command by ``_id`` before the hand-off, not one more command.

    ``known``: what the owner knows of its ``HELD`` holder (the fields of
    :data:`leases.store.holder_commands.RELEASE_PROJECTION`): the delete then answers only
    whether it deleted — a plain ``delete``, not a ``findAndModify`` (on the embedded server
    several times cheaper). ``retry``: an earlier try of this release failed, perhaps after
    its delete landed: when the delete finds nothing, the tombstone tells whether the
    holder was ended by this release (none yet: it is written now, ``release``) or by a
    reap or revoke (its reason stays).

    Returns:
        The deleted holder (``known``, when given), or ``None`` when it was already gone
        (reaped, revoked, or released).

    Raises:
        pymongo.errors.PyMongoError: the store failed; a retry returns what is left.
    """
    with store.bounded():
        if known is not None:
            doc = known if store.holders().delete_one(scoped(token, bound)).deleted_count else None
        else:
            doc = store.holders().find_one_and_delete(*deletion(scoped(token, bound), "release"))
    pause_point("release")  # crash-window tests stop here: holder deleted, slots not yet returned
    with store.bounded():
        # Also when the holder was gone: by value, so nothing comes back twice, and a slot an
        # earlier try of this release left booked (its delete landed, its answer was lost)
        # comes back now rather than at the next repair.
        waiting.give_back(keys, booking, hold_ms=hold_ms if doc is not None else None, more=outcome)
    if doc is None:
        return released_before(known) if retry and known is not None else None
    return _closed(doc, Ending.of(doc, "release", hold_ms=hold_ms))


def released_before(known: HolderDoc) -> HolderDoc | None:
    """Whether the holder a retried release found gone was deleted by an earlier try of the
    release (its answer lost): then no tombstone exists yet, or one saying ``release``, and
    it is written now (an existing reason stays: a reap's or a revoke's tombstone wins).

    Returns:
        ``known`` when the release was this owner's, else ``None``.

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    with store.bounded():
        tombstone = store.tombstones().find_one_and_update(
            *tombstone_upsert(known, "release", keep=True), upsert=True, projection={"reason": 1},
            return_document=ReturnDocument.AFTER)
    if (tombstone or {}).get("reason") != "release":
        return None
    Ending.of(known, "release").account()
    return known


def release(token: str, *, bound: Scope | None = None, hold_ms: float | None = None) -> HolderDoc | None:
    """Release ``token`` (its caller gives it back): :func:`end` with reason ``release``.

    A regular release never calls the type's handler: the holder cleans up itself.

    Returns:
        The deleted holder, or ``None`` when it was already gone.

    Raises:
        pymongo.errors.PyMongoError: the delete failed; nothing was released.
    """
    return end(scoped(token, bound), "release", hold_ms=hold_ms)


def server_time(doc: HolderDoc) -> datetime:
    """The server time a renewal or grant wrote on the holder (MongoDB's clock)."""
    return doc["lastSeenAt"]


# The queue's repair reaps holders past their TTL with end() (the queue cannot import the engine).
waiting.set_holder_end(end)
