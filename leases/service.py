"""The consumer contract: ``acquire`` → ``Lease.update_payload`` / ``check`` → ``release``.

The engine lives in :mod:`leases.engine` (one module per idea, the safety argument in its
docstring); this module keeps the names every caller imports from here.
"""

from __future__ import annotations

from .engine.acquire import (
    acquire,
    acquire_or_ticket,
    acquire_request as _acquire_request,
    contended_steps,
    run as _acquire,
)
from .engine.busy import busy as _busy, retry_after_s as _retry_after_s
from .engine.fail_fast import fail_fast as _fail_fast
from .engine.funnel import (
    Attempt as _Attempt,
    _Blocked,
    _Vanished,
    first as _first,
    queued as _queued,
)
from .engine.kept import abandon, observe_ticket_wait as _observe_ticket_wait, resume
from .engine.lease import NOOP, Lease, NoopLease as _NoopLease, release_token
from .engine.outcome import outcome
from .engine.prepare import prepare, resolve_definition
from .engine.request import LeaseRequest
from .engine.step import step as _step, store_bound as _bound
from .engine.ticket import Ticket
from .engine.waiter import NARROW_RETRY_S, Waiter as _Waiter

__all__ = [
    "NARROW_RETRY_S", "NOOP", "Lease", "LeaseRequest", "Ticket", "abandon", "acquire", "acquire_or_ticket",
    "contended_steps", "outcome", "prepare", "release_token", "resolve_definition", "resume",
    "_Attempt", "_Blocked", "_NoopLease", "_Vanished", "_Waiter", "_acquire", "_acquire_request", "_bound",
    "_busy", "_fail_fast", "_first", "_observe_ticket_wait", "_queued", "_retry_after_s", "_step",
]
