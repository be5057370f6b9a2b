"""A direct grant claimed in the background: the granted waiter returns at once.

A waiter told of its grant by the wake-up (the entry, the fence and the grant's time on
MongoDB's clock) holds the slot already: the gate books its entry, and nobody takes it back
before the claim window has passed (repair ends only grants older than ``GRANT_CLAIM_MS``
on MongoDB's clock). Marking its holder ``HELD`` is the one command left, and it need not
stand between one holder's release and the next one's start. So :func:`claim_later` answers
the lease at once, told the deadline it has for sure — the grant's time plus the claim
window (never more than the TTL) — and has the mark sent from a background thread once
:func:`mark_delay_ms` has passed; once it lands, the deadline is the TTL's from
the grant.

The mark waits (``LEASES_GRANT_MARK_DELAY_MS``, 50 ms) because leases around short calls
are released before it is due: their release ends the ``PENDING`` holder as it is
(:meth:`PendingClaim.drop`), and the mark — a seventh of a contended grant's store commands
— is never sent. A lease held longer is marked with the rest of the window to spare. The
price: until the mark, a process that dies while using the slot is ended as a ticket
that never held (repair, after the window), without the type's handler — the delay bounds
that stretch (0 marks at once, as before), and half the window bounds the delay.

Every other call on the lease that asks the store (check, payload) first has the mark sent
now if it is not yet, and waits for it (:meth:`PendingClaim.wait`). A mark that comes too
late — the process stalled past the window, the slot went on and the holder was ended
without a handler, as it was never ``HELD`` — makes the lease lost (``LeaseExpired``, reason
``unclaimed``); its entry, if still booked, is given back. A mark the store failed is tried
once more by that call.

Only the blocking API claims this way (``leases.acquire``): an HTTP poll, a kept ticket and
the async executor answer their callers a holder already ``HELD``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta

import pymongo.errors

from ..conf import lease_settings
from ..errors import LeaseExpired, LeaseUnavailable
from ..queue import grants, presence, waiting, wakeups
from ..store import client as store, entries, holder_commands as commands
from . import holders
from .funnel import Attempt, _Vanished
from .lease import Lease
from .pausepoints import pause_point
from .per_process import PerProcess
from .step import store_bound

log = logging.getLogger(__name__)

# Claims are one short command each; two threads keep one slow store reply from delaying
# the next grant's claim in the same process.
WORKERS = 2
#: The most of the claim window a mark may wait: the rest is the margin of a process that
#: pauses (past it, the lease is lost, never the cap).
MAX_DELAY_SHARE = 0.5

# This process's claim threads (fork-aware: a forked child starts its own).
_pool = PerProcess(lambda: ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="leases-claim"))


class _Timer:
    """One daemon thread per process that sends each claim's mark when it is due."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, PendingClaim]] = []
        self._order = itertools.count()  # equal due times keep their order (claims never compare)
        self._ready = threading.Condition()
        threading.Thread(target=self._run, name="leases-claim-timer", daemon=True).start()

    def at(self, due: float, claim: "PendingClaim") -> None:
        """Send ``claim``'s mark at ``due`` (``time.monotonic()``) unless it was sent or released."""
        with self._ready:
            heapq.heappush(self._due, (due, next(self._order), claim))
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._ready.wait(None if not self._due else self._due[0][0] - time.monotonic())
                claim = heapq.heappop(self._due)[2]
            claim.send()


# This process's claim timer (fork-aware: a forked child starts its own).
_timer = PerProcess(_Timer)


def mark_delay_ms() -> int:
    """How long after its answer a granted lease's mark is sent (``LEASES_GRANT_MARK_DELAY_MS``,
    never past :data:`MAX_DELAY_SHARE` of the claim window)."""
    return max(0, min(int(lease_settings.GRANT_MARK_DELAY_MS), int(grants.claim_ms() * MAX_DELAY_SHARE)))


def sure_until(at: datetime, ttl_seconds: int) -> datetime:
    """The deadline a granted, not yet claimed lease has for sure: the grant's time plus the
    claim window, never past its TTL."""
    return at + min(timedelta(milliseconds=grants.claim_ms()), timedelta(seconds=ttl_seconds))


class PendingClaim:
    """The mark of a granted holder ``HELD``, sent from a background thread."""

    def __init__(self, attempt: Attempt, lease: Lease, booking: str, fence: str | None, at: datetime):
        self.attempt, self.lease, self.booking, self.fence, self.at = attempt, lease, booking, fence, at
        self.answered = time.monotonic()  # when the lease was answered (a duration, never a deadline)
        self._state = threading.Lock()
        self.future: Future[None] | None = None  # None: not sent yet
        self.released = False  # its release has begun: no mark is sent, the entry is its to return
        # Until the mark is settled the process beats as if it had a waiter: repair leaves a
        # grant past its claim window to a process whose heartbeat looks alive
        # (leases.queue.grants.may_still_claim), and a mark slowed by a busy process or store
        # is not a dead waiter's.
        # Its first beat is due at once if the mark is not settled within half the claim
        # window (a process whose waits were short may never have beaten).
        self._present: int | None = presence.enter(wakeups.process_id(), first_beat_s=grants.claim_ms() / 2000.0)
        delay_ms = mark_delay_ms()
        if delay_ms:
            _timer.get().at(self.answered + delay_ms / 1000.0, self)
        else:
            self.send()

    def send(self) -> None:
        """The timer's turn: hand the mark to a claim thread unless it was sent or its release
        began."""
        with self._state:
            if self.future is None and not self.released:
                try:
                    self.future = _pool.get().submit(self._mark, True)
                except RuntimeError:  # the interpreter is exiting: the window gives the slot back
                    pass

    def drop(self) -> None:
        """Before a release: a mark not sent yet never is — the release ends the holder as it
        is, by its token, and returns the entry the gate books. A mark under way that finds
        the holder gone after the release gives nothing back."""
        with self._state:
            self.released = True
        self._settled()

    def _settled(self) -> None:
        """The mark was sent (whatever came of it) or will never be: the process need not beat
        for it any more (once)."""
        with self._state:
            present, self._present = self._present, None
        if present is not None:
            presence.leave(present)

    def _mark(self, background: bool) -> None:
        """Mark the holder ``HELD`` (one command) and tell the lease its deadline.

        Raises:
            LeaseExpired: the claim came too late (reason ``unclaimed``); the entry was given back.
            LeaseUnavailable: the store failed; whether the mark landed is not known.
        """
        try:
            self._send_mark(background)
        finally:
            self._settled()

    def _send_mark(self, background: bool) -> None:
        if background:
            pause_point("claim")  # crash-window tests stop here: granted, returned, not yet claimed
            if self.released:  # its release began after the timer handed it over: not needed
                return
        try:
            with store_bound():
                try:
                    claimed = self.attempt.claim(self.booking, self.fence, self.at)
                except _Vanished:
                    if not self.released:
                        self._give_back()
                    raise self._lost() from None
        except pymongo.errors.PyMongoError as exc:
            raise LeaseUnavailable(store.unreachable("lease store", exc, " while claiming a grant")) from None
        self.lease.expires_at, self.lease.last_seen_at = claimed.expires_at, claimed.last_seen_at

    def _lost(self) -> LeaseExpired:
        """Why the mark found no holder: the tombstone's reason when the holder was ended as
        a lease (an operator revoked it: :func:`take_up`), else the claim came too late.

        Raises:
            pymongo.errors.PyMongoError: the store failed.
        """
        token = self.attempt.token
        ended = holders.ended(token, holders.scope(self.attempt.request.tenant_id, self.attempt.request.project_id))
        if isinstance(ended, LeaseExpired):
            return ended
        late_ms = (time.monotonic() - self.answered) * 1000
        return LeaseExpired(f"lease {token} was granted, but its claim came {late_ms:.0f} ms after its answer, "
                            "past the claim window: the slot went on", reason="unclaimed")

    def _give_back(self) -> None:
        """Best effort: an entry left booked for a holder that is gone is repair's to pull."""
        try:
            waiting.give_back(list(self.attempt.keys), self.booking)
        except pymongo.errors.PyMongoError as exc:
            log.info("give-back of the unclaimed %s failed (%s); repair returns it", self.booking, exc)

    def wait(self) -> None:
        """Wait for the mark (one store bound, plus the claim window), sending it from
        this thread if it is not due yet; a mark the store failed is sent once more.

        Raises:
            LeaseExpired: the claim came too late; the lease is lost.
            LeaseUnavailable: the store failed again, or the mark did not answer in bound
                (the next call waits again).
        """
        done: Future[None] = Future()
        with self._state:
            sent = self.future
            if sent is None:
                self.future = done  # not due yet: this thread sends it, the timer never will
        if sent is not None:
            bound = (int(lease_settings.MONGO_TIMEOUT_MS) + grants.claim_ms()) / 1000.0
            try:
                sent.result(timeout=bound)
                return
            except TimeoutError:
                raise LeaseUnavailable(f"the claim of lease {self.attempt.token} did not answer within "
                                       f"{bound:.1f} s") from None
            except LeaseUnavailable:
                pass  # the background try failed: a second one, here
        try:
            self._mark(False)
        except LeaseExpired as exc:
            done.set_exception(exc)  # lost for good: every later call says so
            with self._state:
                self.future = done
            raise
        except LeaseUnavailable as exc:
            done.set_exception(exc)  # the next call tries once more
            raise
        done.set_result(None)
        with self._state:
            self.future = done


def claim_later(attempt: Attempt, booking: str, fence: str | None, at: datetime | None) -> Lease | None:
    """The lease of a grant the wake-up told of, answered now; its holder is marked ``HELD``
    from the background once :func:`mark_delay_ms` has passed, unless its
    release comes first (:class:`PendingClaim`).

    Returns:
        None when it cannot be answered now and the caller claims first: the wake-up gave no
        grant time, the attempt lacks its own write time or interval
        (:meth:`Attempt.held_fields`), or the entry names an earlier attempt of the waiter
        (its holder was written again since and its ticket queued again: the claim would
        find nobody, and the caller gives the entry back and queues on), or the waiting
        holder's deadline as last written (:meth:`Attempt.holder_until`) ends within the
        claim window of the grant (the idle sweep may reap it before the mark).
    """
    known = attempt.held_fields(at, fence)
    if known is None or at is None or entries.attempt_of(booking) != attempt.attempt_id:
        return None
    until = attempt.holder_until()
    if until is None or until <= at + timedelta(milliseconds=grants.claim_ms()):
        # The idle sweep may take the waiting holder before the mark lands (its waiter
        # stalled past the TTL, or the refresh failed): an answer now could be a lease
        # that is already dead. The caller claims first, and queues again if it is gone.
        return None
    lease = attempt.lease_of({**known, "expiresAt": sure_until(at, attempt.definition.ttl_seconds)})
    lease.pending_claim = PendingClaim(attempt, lease, booking, fence, at)
    return lease


def take_up(token: str, bound: holders.Scope | None = None) -> bool:
    """Mark ``token``'s holder ``HELD`` on its waiter's behalf when a release granted it a
    slot and its mark is not in yet (its lease may be in use: answered at once, marked
    later or, released first, never), as its waiter would from the gate. An operator's
    revoke does this first, so that it ends a lease — tombstone, handler — rather than a
    ticket that never held.

    Returns:
        True when a holder was marked; False when ``token`` is no such grant (held already,
        still waiting, or gone).

    Raises:
        pymongo.errors.PyMongoError: the store failed.
    """
    doc = store.holders().find_one({**holders.scoped(token, bound), "state": "PENDING"},
                                   {"keys": 1, "attemptId": 1, "ttlSeconds": 1})
    keys = list((doc or {}).get("keys") or ())
    if doc is None or not keys or not isinstance(doc.get("ttlSeconds"), int):
        return False
    grant = grants.grant_on(store.counters().find_one({"_id": keys[-1]}), token, keys[:-1])
    if grant is None or not grant.complete or entries.attempt_of(grant.booking) != doc.get("attemptId"):
        return False
    mark = commands.mark_held(token, keys=keys, ttl_seconds=doc["ttlSeconds"], attempt_id=doc.get("attemptId"),
                              fence=grant.fence)
    return bool(store.holders().update_one(*mark).matched_count)
