"""The engine: one acquire request from ``LeaseRequest`` to ``Lease``, and the holder
protocol every path to a lease goes through.

The acquire path, in the order it runs: ``request`` (what a consumer asks) → ``prepare``
(validate, resolve the definition) → ``funnel`` (the attempt: holder PENDING, one booking
entry per level narrow → wide, HELD) → on a full level ``fail_fast`` (repair once, else
Busy) or ``waiter`` (the gate's queue) → ``lease`` (check, renew, release). ``step``
bounds every store step and rolls back; ``busy`` builds the Busy answer; ``outcome``
counts it; ``ticket`` and ``kept`` keep a place for HTTP callers that poll. ``aio_*`` is
the same protocol on the async client.
``leases.service`` and ``leases.aio`` re-export the public names.

The holder protocol: ``holders`` (renewal, payload, ending a holder, tenant scope),
``intervals`` (the renewal interval a grant issues) and ``pausepoints`` (named
pauses for the crash tests).

Every command sent is built in the store layer, one module per document kind, each builder
stating the invariant it keeps (:mod:`leases.store.holder_commands`,
:mod:`leases.store.counter_commands`, :mod:`leases.store.ticket_commands`,
:mod:`leases.store.tombstones`): the safety argument below, command by command.

Safety: no transactions. The holder document is written before any slot is booked, and
each booking entry names the holder's token and ``attemptId``, so whatever a crash leaves
on a counter belongs to a known holder and is pulled by value exactly once (by rollback,
release, reap or repair). A level is taken only by a conditional push that keeps
``count <= cap``; at the gate, only the ticket the order rule picks may take a slot while
others queue (no barging). Every step ends within one store timeout; what it could not
undo is found by entry and returned by repair, reap and reconcile.

Imports the queue, revocation seam, telemetry, definitions and store below it; the upkeep,
operator and edge layers above import it.
"""
