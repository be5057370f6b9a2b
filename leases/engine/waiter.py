"""The waiter: a request in the gate's queue until granted, out of time, or kept.

Its state machine: enqueue a ticket (the gate is created on first use) → decide on the
gate as read: prune stale tickets, take its turn when the order rule picks it (booking
with the gate privilege), wake whoever's turn it is, or repair a gate whose entries block
everyone → sleep until woken (or its watcher falls silent) → decide again. A turn that
finds a narrower level full retries once, then sits out and passes the turn on. At the
wait bound it leaves the queue with a Busy answer, or keeps its ticket (``keep_ms``).

:meth:`Waiter.steps` is the same machine as a generator, so the async executor drives it
with its sleeps on the event loop.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Generator
from datetime import datetime
from functools import partial

import pymongo.errors

from ..errors import LeaseBusy
from ..queue import backlog, estimates, fences, grants, order, presence, shares, slots, waiting, wakeups, watch
from ..store import entries
from ..store.documents import CounterDoc, TicketDoc
from ..store.shapes import ticket_in
from ..telemetry import history, metrics
from . import claims
from .busy import busy
from .funnel import Attempt, _Blocked, _Vanished, first
from .lease import Lease
from .pausepoints import pause_point
from .step import Bypass, step, store_bound
from .ticket import Ticket

log = logging.getLogger(__name__)

# A waiter whose turn it is but whose narrower level is full tries once more after this
# long: a newcomer of its tenant that booked that level on its way to the queue gives it
# back with its next command.
NARROW_RETRY_S = 0.02
#: How many of the watcher's periods a waiter lets pass without a look at its gate before
#: it looks itself (the watcher thread stuck or dead: the waiter still finds its turn).
WATCH_SILENT_POLLS = 3


class Waiter:
    """A request waiting in the gate's queue until granted or out of time."""

    def __init__(self, attempt: Attempt, deadline: float, started: float, keep_ms: int | None = None):
        self.keep_ms = keep_ms  # on timeout keep the ticket (HTTP clients poll it) this long
        self.attempt = attempt
        self.deadline = deadline
        self.started = started
        self.gate_key = attempt.gate.key
        self.blocked: _Blocked | None = None
        self.gate: CounterDoc | None = None
        self.tag = metrics.resource_tag(attempt.definition.resource)
        self.estimate_s: float | None = None
        self.raw_estimate_ms: float | None = None  # uncalibrated, for the gate's record
        self.queued_at = 0.0  # monotonic
        self.sat_out = False  # our last turn found a narrower level full (see order.sits_out)
        # Claim a grant the wake-up told of in the background (leases.engine.claims): the
        # blocking and async APIs; an HTTP ticket answers a holder already HELD.
        self.claim_later = False
        # Whether the waiting holder's deadline covers the wait (leases.store.holder_commands.cover_wait).
        self.covered = attempt.wait_covered

    def _ticket(self) -> TicketDoc:
        # Arrived when the request first asked (its place among its tenant's tickets), but
        # alive as of the holder document's last write (MongoDB's clock): a ticket queued
        # again after a stall past the ticket TTL must not be born stale, or the next reader
        # (the waiter itself) prunes it at once, again and again — the waiter would never
        # be seen in the queue while the others take every slot.
        return self.attempt.ticket(self.blocked.spec.level if self.blocked else self.attempt.gate.level,
                                   self.attempt.acquired_at, waker=wakeups.process_id(),
                                   seen=self.attempt.written_at)

    def wait(self, blocked: _Blocked) -> "Lease | Ticket":
        """Wait in the queue until granted, out of time (Busy) or kept as a ticket.

        Raises:
            LeaseBusy, LeaseUnavailable: as :func:`acquire`.
        """
        self.claim_later = self.keep_ms is None
        steps = self.steps(blocked)
        woken: bool | None = None
        try:
            while True:
                try:
                    event, timeout = steps.send(woken)
                except StopIteration as done:
                    return done.value
                woken = event.wait(timeout)
        finally:
            steps.close()

    def steps(self, blocked: _Blocked, event: threading.Event | None = None) -> Generator[
            "tuple[threading.Event, float]", "bool | None", "Lease | Ticket"]:
        """The waiting as steps: each ``yield (event, timeout)`` asks the driver to sleep until
        the wake-up ``event`` is set or ``timeout`` passes, and to send back whether it was
        woken. The store work between two yields is blocking; the async executor runs it in
        a thread and sleeps on the event loop. Closed at a yield (the caller went away), it
        leaves the queue and drops its holder document.
        """
        counter = blocked.counter
        if blocked.spec is not self.attempt.gate and counter is not None and waiting.is_full(counter) and step(
                self.attempt, lambda: waiting.repair(counter, counter["clock"])):
            # A slot nobody booked came back: try again before queueing.
            lease = step(self.attempt, lambda: first(self.attempt, allow_queue=True, wait_ms=self._wait_left_ms()))
            if isinstance(lease, Lease):
                return lease
            blocked = lease
            self.covered = self.attempt.wait_covered
        self.blocked = blocked
        event = wakeups.register(self.attempt.token, event)
        # Its ticket is alive by its own ``seen`` (the holder's write, after the attempt began)
        # for a beat period from then: the process's first beat for it is due by that time.
        present = presence.enter(wakeups.process_id(), first_beat_s=max(
            0.0, self.attempt.created_at + presence.beat_period_s() - time.monotonic()))
        metrics.WAITING.labels(resource=self.tag).inc()
        outcome = "error"
        # Watched before it is queued: the watcher takes a ticket of this process that no
        # waiter here waits on for an orphan (leases.queue.watch).
        watch.add(self.gate_key, self.attempt.token)
        try:
            # A ticket bound for the backlog waits its turn in the backlog's batch of this
            # process (leases.queue.backlog.add), not among the acquire steps: a burst of
            # newcomers then shares its commands instead of queueing two at a time.
            deep = Bypass(lambda: waiting.backlog_likely(self.gate_key))
            self.gate = step(self.attempt, lambda: self._enqueue(backlog=deep.chosen), bypass=deep)
            watch.note(self.gate)
            self.queued_at = time.monotonic()
            if self.gate is not None:
                self.raw_estimate_ms = estimates.raw_wait_ms(self.gate, self.attempt.token, self.gate["clock"])
                if self.raw_estimate_ms is not None:
                    self.estimate_s = self.raw_estimate_ms * estimates.calibration(self.gate) / 1000.0
            # Decide on the gate once queued; after that only on a fresh look at it (ours, on a
            # nudge or our own timer, or after a wake-up), never on our own timer's gate again:
            # that would be a decision per waiter per tick on a gate a moment old.
            lease = self._decide()
            while True:
                if lease is not None:
                    outcome = "granted"
                    return lease
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    granted = wakeups.take_grant(self.attempt.token)
                    left = False
                    if granted:
                        lease = self._claim(*granted)
                    elif self.keep_ms is None:
                        lease, left = step(self.attempt, self._at_deadline), True
                    else:
                        lease = None  # a kept ticket granted now is claimed by its next poll
                    if lease is not None:  # granted at the last moment: take it
                        outcome = "granted"
                        return lease
                    if self.keep_ms is not None:
                        kept = self._keep_ticket()
                        outcome = "granted" if isinstance(kept, Lease) else "ticket"
                        return kept
                    outcome = "timeout"
                    raise self._give_up(left=left)
                # Woken by a release or by this process's watcher (leases.queue.watch), which
                # reads the gate for all the waiters here; on its own a waiter only looks
                # itself should the watcher fall silent, and moves its holder's deadline once
                # to cover its wait, when half its TTL is gone (a wait that ends sooner sends
                # nothing for it).
                period = waiting.poll_ms() / 1000.0 * WATCH_SILENT_POLLS * random.uniform(1.0, 1.25)
                if not self.covered:
                    period = max(0.0, min(period, self._cover_due() - time.monotonic()))
                look_soon = self.sat_out
                if self.sat_out:
                    # Sitting out passes the turn only for a moment (the younger tickets of
                    # our tenant wait behind us meanwhile): look again as soon as it ends.
                    period = min(period, order.BLOCKED_PAUSE.total_seconds() * random.uniform(1.05, 1.2))
                    self.sat_out = False
                try:
                    woken = yield event, min(remaining, period)
                except GeneratorExit:
                    outcome = "cancelled"
                    self._give_up()
                    raise
                event.clear()
                if woken:
                    granted = wakeups.take_grant(self.attempt.token)
                    if granted:
                        lease = self._claim(*granted)
                    elif wakeups.take_look(self.attempt.token):
                        lease = self._look()
                    else:
                        # Our turn, the waker says: book; if that did not make a lease, look.
                        lease = self._try(woken=True) or self._look(read=True)
                    continue
                if not self.covered and time.monotonic() >= self._cover_due():
                    self.gate = step(self.attempt, self._cover)
                lease = self._look() if look_soon or self._watcher_silent() else None
        except waiting._QueueFull as full:
            # Refused at once, before it waited: the gate stays bounded however many ask.
            outcome = "queue-full"
            self.gate = full.gate
            try:
                with store_bound():
                    self.attempt.discard()
            except pymongo.errors.PyMongoError as exc:
                log.info("clean-up of %s failed (%s); its holder expires by itself", self.attempt.token, exc)
            raise busy(self.attempt, _Blocked(self.attempt.gate, full.gate), gate=full.gate, placed=False,
                       queue_full=True) from None
        finally:
            if outcome == "error":
                # The store failed mid-wait (the attempt was rolled back): its ticket would stay
                # alive by this process's heartbeat with nobody waiting on it. Best effort; the
                # watcher drops what is left (an orphan of this process).
                waiting.safe_dequeue(self.gate_key, self.attempt.token)
            watch.remove(self.gate_key, self.attempt.token)
            backlog.forget(self.attempt.token)
            presence.leave(present)
            wakeups.unregister(self.attempt.token)
            metrics.WAITING.labels(resource=self.tag).dec()
            metrics.WAIT_SECONDS.labels(resource=self.tag).observe(time.monotonic() - self.started)
            if outcome != "ticket":
                # A kept ticket's wait has not ended: the poll that grants it records it
                # (resume), from its arrival to its grant.
                shares.observe_wait(self.attempt.definition, self.attempt.priority[1], time.monotonic() - self.started)
            history.waited(self, outcome, time.monotonic() - self.started)
            metrics.WAIT_OUTCOME.labels(resource=self.tag, outcome=outcome).inc()

    def _enqueue(self, *, backlog: bool = False) -> CounterDoc | None:
        """Queue our ticket (``backlog``: in the backlog, sharing the write with this
        process's other newcomers; the caller runs outside the admission of steps)."""
        gate = waiting.enqueue(self.gate_key, self._ticket(), to_backlog=backlog)
        if gate is None:  # first use of the gate: create it, then queue
            slots.create(self.attempt.gate, self.attempt.definition.resource)
            gate = waiting.enqueue(self.gate_key, self._ticket())
        return gate

    def _look(self, *, read: bool = False) -> Lease | None:
        """Look at the gate (the watcher's last read when fresh, else — or with ``read``,
        after a turn that did not make a lease — a read of our own) and decide on it: claim
        a grant whose wake-up was lost, queue again when our ticket was dropped, take our
        turn."""
        fresh = None if read else watch.latest(self.gate_key, waiting.poll_ms() / 1000.0)
        self.gate = step(self.attempt, lambda: self._refresh(fresh))
        return self._decide()

    def _wait_left_ms(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))

    def _cover_due(self) -> float:
        """When (monotonic) the waiting holder's deadline is to be moved to cover the wait:
        once half its TTL is gone."""
        return self.attempt.created_at + self.attempt.definition.ttl_seconds / 2

    def _rewrite_holder(self) -> None:
        """Write the holder document again, for a ticket about to queue: its deadline covers
        the rest of the wait."""
        self.attempt.create_holder(self._wait_left_ms())
        self.covered = True

    def _cover(self) -> CounterDoc | None:
        """Move the waiting holder's deadline to cover the rest of the wait (one command, once
        a wait). A wait longer than the TTL is ordinary, and the idle sweep takes a holder past
        its deadline: a grant to its ticket would then be a lease that is already dead.

        A holder reaped anyway (this process stalled past the TTL) is written again and the
        ticket queued again for it (its arrival kept); an entry a release granted it
        meanwhile is given back — it names the reaped holder, which nobody can claim.

        Returns:
            The gate as last seen (or as the queueing again returned it).

        Raises:
            pymongo.errors.PyMongoError: the store failed.
        """
        if self.attempt.cover_wait(self._wait_left_ms(), clock=(self.gate or {}).get("clock")):
            self.covered = True
            return self.gate
        waiting.leave_returning_grant(self.gate_key, self.attempt.token, list(self.attempt.keys))
        self._rewrite_holder()
        return self._enqueue()

    def _watcher_silent(self) -> bool:
        """Whether this process's watcher has not read our gate for several periods: then we
        look ourselves."""
        return watch.latest(self.gate_key, waiting.poll_ms() / 1000.0 * WATCH_SILENT_POLLS) is None

    def _refresh(self, gate: CounterDoc | None = None) -> CounterDoc | None:
        """The gate (``gate``, else read now) with our ticket on it: queued again if it was
        dropped (this process stalled past the ticket TTL)."""
        if not waiting.queued(gate, self.attempt.token):
            gate = waiting.read_gate(self.gate_key)  # none yet, or the watcher's look is a moment old
        if not waiting.queued(gate, self.attempt.token):
            # Granted by a release whose wake-up was lost? Then the gate books our entry
            # (the next decision claims it); else we were pruned.
            if gate is not None and grants.granted_entry(gate, self.attempt.token) is not None:
                return gate
            # Pruned as stale (this process stalled past the ticket TTL, and its holder
            # document went with it): write both again, at the back of the queue.
            self._rewrite_holder()
            gate = self._enqueue()
        return gate

    def _claim(self, booking: str, fence: str | None, at: datetime | None = None) -> Lease | None:
        """Our ticket was granted (the entry ``booking`` is on the gate; ``at``: when, on
        MongoDB's clock, if the wake-up said): mark the holder HELD, nothing else to book —
        with :attr:`claim_later` and ``at``, in the background, answering the lease at once
        (:mod:`leases.engine.claims`). If the claim window passed and the slot went on (or
        our holder was written again), give the entry back if still there and queue again; a
        grant to an earlier writing of our holder is given back, and we look at the gate."""
        attempt = self.attempt
        if entries.attempt_of(booking) != attempt.attempt_id:
            # A grant to an earlier writing of our holder (made while this process was stopped
            # past the TTL; its news read only now): that holder is gone, nobody can claim the
            # entry. Give it back — the slot goes on, maybe to our ticket as queued now — and
            # look. Writing our holder again here would end the very grant the give-back may
            # just have made us, again at each claim: a loop keeping the slot from everyone.
            step(attempt, lambda: waiting.give_back(list(attempt.keys), booking), admit=False)
            return self._look(read=True)

        def run() -> Lease | None:
            # The slot is ours until the claim window ends: answer now, mark HELD meanwhile.
            answered = claims.claim_later(attempt, booking, fence, at) if self.claim_later else None
            if answered is not None:
                return self._granted(answered)
            pause_point("claim")  # crash-window tests stop here: granted, not yet claimed
            try:
                lease = attempt.claim(booking, fence, at)
            except _Vanished:
                waiting.give_back(list(attempt.keys), booking)
                self._rewrite_holder()
                self.gate = self._enqueue()
                return None
            return self._granted(lease)

        return step(attempt, run, admit=False)

    def _granted(self, lease: Lease) -> Lease:
        """``lease``, told how its wait estimate came out."""
        lease.estimated_wait_s = self.estimate_s
        if self.queued_at:
            lease.grant_outcome = estimates.outcome_update(self.raw_estimate_ms,
                                                           (time.monotonic() - self.queued_at) * 1000)
        return lease

    def _keep_ticket(self) -> "Lease | Ticket":
        """Out of wait time, but the caller keeps its place: stretch the ticket's TTL to the
        poll bound and answer where it stands — or the lease, when a release granted the
        ticket just before (a grant is never answered as Busy).

        Raises:
            LeaseBusy: the ticket is gone (pruned) and was not granted.
            LeaseUnavailable: the store failed.
        """
        keep_ms = int(self.keep_ms or 0)
        for _ in range(2):  # a grant whose holder had been written again queues once more
            # The holder first: from now on its deadline is the poll deadline, also when a
            # release grants the ticket before (or while) it is kept — a client that never
            # polls gives the slot back then, not after the lease's TTL; and a grant computed
            # while the ticket still had its waker (a claim window of its own) that lands
            # after the switch is not ended by repair as unclaimed (leases.queue.slots.orphans).
            step(self.attempt, lambda: self.attempt.keep_for_polls(keep_ms))
            gate = step(self.attempt, lambda: waiting.keep_alive(self.gate_key, self.attempt.token, ttl_ms=keep_ms))
            if gate is not None:
                return Ticket.of(self.attempt.token, self.attempt.definition, gate, self.blocked)
            # Not queued any more: granted just now (then claim it, as a poll would), else pruned.
            current = step(self.attempt, lambda: waiting.read_gate(self.gate_key))
            grant = step(self.attempt, partial(grants.grant_on, current, self.attempt.token, self.attempt.keys[:-1]))
            if grant is None or current is None:
                break
            if not grant.complete:
                # Its narrower levels are being booked (or undone): the poll looks again.
                return Ticket.of(self.attempt.token, self.attempt.definition, current, self.blocked)
            lease = self._claim(grant.booking, grant.fence)
            if lease is not None:
                return lease
        # Its place is lost: the delay is a newcomer's, from the gate as last seen.
        raise busy(self.attempt, self.blocked or _Blocked(self.attempt.gate, None), gate=self.gate, placed=False)

    def _decide(self, *, again: bool = True) -> Lease | None:
        """Act on the gate as last seen: prune stale tickets, take our turn, wake whoever's
        turn it is, or repair a gate whose entries block everyone (then decide once more)."""
        gate = self.gate
        if gate is None:
            return None
        waiting.note_queue(gate)
        if not waiting.queued(gate, self.attempt.token):
            grant = step(self.attempt, lambda: grants.grant_on(gate, self.attempt.token, self.attempt.keys[:-1]))
            if grant is not None and grant.complete:
                # Granted, its wake-up lost or not yet read (and, with narrower levels, the
                # grant's bulk has booked them all: it is neither under way nor being undone).
                wakeups.take_grant(self.attempt.token)
                return self._claim(grant.booking, grant.fence)
        now = gate["clock"]
        if order.stale_ids(gate, now):
            gate = self.gate = step(self.attempt, lambda: waiting.prune(gate))
        picked = order.next_grants(gate, now)
        fences.expect(gate["_id"], fences.turns(gate, picked))  # which free slot each pick proposes
        if self.attempt.token in picked:
            waiting.wake(gate, [t for t in picked if t != self.attempt.token])
            lease = self._try(woken=False)
            if lease is None and self.gate is not None and again and not waiting.queued(self.gate, self.attempt.token):
                return self._decide(again=False)  # granted meanwhile, or pruned: decide on the gate now
            if lease is None:
                # We sat out (a narrower level was full): pass the turn on right away.
                waiting.hand_off(self.gate, skip=self.attempt.token)
            return lease
        if picked and waiting.first_look(gate):
            # Their waker may have died, or their process: wake again (dropping the dead).
            waiting.hand_off(gate, skip=self.attempt.token)
        if (not picked or grants.unclaimed(gate, now)) and step(self.attempt, lambda: waiting.repair(gate, now)):
            # Full, or free but nobody fits, or a grant not claimed in time: either way entries
            # decide, so make sure each has a live holder (throttled to one check per interval
            # for all processes).
            self.gate = step(self.attempt, lambda: waiting.read_gate(self.gate_key))
            if again:
                return self._decide(again=False)
        return None

    def _try(self, *, woken: bool) -> Lease | None:
        """Book with the gate privilege (our turn); a narrower level that is full sends us
        back to wait and passes the turn on."""
        attempt = self.attempt

        def run() -> Lease | None:
            for attempt_no in range(2):
                try:
                    charge = order.charge(self.gate, attempt.token)
                    if self.queued_at:
                        record = estimates.outcome_update(self.raw_estimate_ms,
                                                          (time.monotonic() - self.queued_at) * 1000)
                        charge = {**charge, **record}
                    lease = attempt.book(privileged=True, allow_queue=True, charge=charge)
                    lease.estimated_wait_s = self.estimate_s
                    return lease
                except _Vanished:
                    # Stalled past the ticket TTL: the ticket and its holder document were
                    # pruned. Return what we just booked and queue again, from the back.
                    attempt.give_back(attempt.keys)
                    self._rewrite_holder()
                    self.gate = self._enqueue()
                    return None
                except _Blocked as blocked:
                    self.blocked = blocked
                    if blocked.spec is attempt.gate:
                        # A release may have granted our ticket just now (the grant dequeues
                        # it, so our own take found it gone): the next decision claims it.
                        if blocked.counter is not None and grants.granted_entry(blocked.counter, attempt.token):
                            self.gate = blocked.counter
                        return None
                    # Our turn, but a narrower level is full. A slot nobody books any more
                    # comes back by repair; a newcomer's booking on its way to the queue
                    # lasts milliseconds: try once more. Else sit out and pass the turn.
                    if blocked.counter is not None and waiting.is_full(blocked.counter) and waiting.repair(
                            blocked.counter, blocked.counter["clock"]):
                        continue
                    if attempt_no == 0:
                        time.sleep(NARROW_RETRY_S)
                        continue
                    waiting.mark_blocked(self.gate_key, attempt.token, blocked.spec.level)
                    self.sat_out = True
                    return None
            return None

        lease = step(attempt, run)
        if lease is None and not woken:
            self.gate = step(attempt, lambda: waiting.read_gate(self.gate_key))
        return lease

    def _at_deadline(self) -> Lease | None:
        """Out of time: leave the queue, unless a release granted our ticket just now (its
        wake-up not read yet): then claim it — or, if its bulk has not booked every narrower
        level, give back what it booked — so no grant is left booked for nobody."""
        attempt = self.attempt
        before = waiting.leave(self.gate_key, attempt.token)
        if before is None or ticket_in(before, attempt.token) is not None:
            return None  # still queued until now: nobody can grant it any more
        grant = grants.grant_on(before, attempt.token, attempt.keys[:-1])
        if grant is None:
            return None
        if grant.complete:
            return self._claim(grant.booking, grant.fence)
        waiting.give_back(list(attempt.keys), grant.booking)
        return None

    def _give_up(self, *, left: bool = False) -> LeaseBusy:
        """Out of time: leave the queue (unless ``left`` already), drop the holder, and say
        where we stood."""
        gate = self.gate
        place = None if gate is None else order.position(gate, self.attempt.token, gate["clock"])
        blocked = self.blocked or _Blocked(self.attempt.gate, gate)
        if blocked.spec is self.attempt.gate:
            blocked = _Blocked(blocked.spec, gate)
        try:
            with store_bound():
                if not left:
                    waiting.dequeue(self.gate_key, self.attempt.token)
                self.attempt.discard()
        except pymongo.errors.PyMongoError as exc:
            log.info("timeout clean-up of %s failed (%s); the ticket goes stale by itself", self.attempt.token, exc)
        return busy(self.attempt, blocked, position=place, gate=gate)
