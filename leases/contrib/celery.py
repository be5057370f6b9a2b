"""Celery tasks that run under a lease: ``@leased`` acquires, hands over, releases, retries.

Usage (a bound task; the decorator goes *under* the task decorator)::

    from celery import shared_task
    from leases.contrib.celery import leased

    @shared_task(bind=True)
    @leased("tex", lease="tex", tenant="tenant_id", project="project_id", user="user_id")
    def render(self, tenant_id, project_id, user_id, source, *, lease):
        lease.update_payload({"source": source})
        ...
        lease.check()

The ids come from the task's own arguments: a string names an argument, a callable gets
the task's ``(*args, **kwargs)`` and returns the id. The body receives the held lease as
the keyword argument ``lease`` and the lease is released when the body returns or raises
(also when the body calls ``self.retry``).

A busy resource never blocks the worker: the task is retried with ``self.retry`` after the
server's suggested delay. For a named lease the request keeps its place in the resource's
fair queue across retries: the first attempt leaves a kept ticket (as the HTTP ``202``
flow does) and each retry polls it, which keeps it alive and books the slot on its turn.
That is only safe while the retry comes back within the ticket's keep window, which a
Celery countdown cannot promise (a busy or dead worker runs the retry late or never): the
countdown is the server's estimate of the ticket's grant, between half a second and one
poll interval, the keep window three poll intervals, and a retry that comes back late
finds its ticket dropped and queues again at the back. A dead worker's ticket therefore
holds its place for one keep window at most, like a client that stopped polling. Every
poll is a retry: after ``max_retries`` the task fails with
:class:`~leases.errors.LeaseRetriesExhausted` and its ticket is given up.

This module is an optional integration (Celery is the only thing it adds), which is why it
lives in ``leases.contrib`` and not beside the engine; it also keeps ``leases.celery`` free,
the module name Celery's ``-A`` looks up as an application.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import random
from collections.abc import Callable
from typing import Any

import pymongo.errors

from leases import service
from leases.engine import holders
from leases.errors import (
    InvalidLeaseRequest,
    LeaseBusy,
    LeaseExpired,
    LeaseLost,
    LeaseRetriesExhausted,
    LeaseUnavailable,
    StaleLease,
)
from leases.pods.identity import self_pod_id
from leases.store import client as store, holder_commands as commands

log = logging.getLogger(__name__)

TICKET_KWARG = "_leases_ticket"
DEFAULT_MAX_RETRIES = 30
MIN_TICKET_DELAY_S = 0.5  # an estimate of "now" must not spend the retries in a busy loop
IdSource = str | Callable[..., str]


def poll_seconds() -> float:
    """The countdown of a retry that polls a kept ticket (``LEASES_TICKET_POLL_SECONDS``,
    the interval the HTTP ticket flow issues as well)."""
    from leases.conf import lease_settings

    return float(lease_settings.TICKET_POLL_SECONDS)


def keep_ms() -> int:
    """How long a kept ticket survives without a poll: three poll intervals, so one late
    retry does not cost the place."""
    return int(3 * poll_seconds() * 1000)


def leased(type: str, *, lease: str | None = None, inline: dict[str, Any] | None = None,
           tenant: IdSource, project: IdSource, user: IdSource, holder_ref: IdSource | None = None,
           pod_bound: bool = False, max_retries: int = DEFAULT_MAX_RETRIES,
           countdown: float | None = None, keep_place: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a bound Celery task's function so that it runs holding a lease.

    Args:
        type: the lease type (a registered handler).
        lease: the lease name (or ``inline`` for an inline definition; one of them).
        tenant, project, user: where the ids come from: an argument name of the task, or
            a callable taking the task's ``(*args, **kwargs)``.
        holder_ref: the holder reference shown to operators (same forms), optional.
        pod_bound: the holder's ``pod_bound`` flag.
        max_retries: how many retries a busy resource may cost before the task fails.
        countdown: seconds before a retry; None: the server's suggestion (the busy error's
            ``retry_after``, else the ticket poll interval).
        keep_place: keep the request's place in the queue across retries (named leases).

    Raises:
        TypeError: a string id source that is not an argument of the function, a function
            without a ``lease`` parameter or ``**kwargs``, or a bad ``max_retries``.
    """
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise TypeError("max_retries must be a non-negative int")
    if countdown is not None and (isinstance(countdown, bool) or not isinstance(countdown, (int, float)) or countdown < 0):
        raise TypeError("countdown must be a non-negative number of seconds")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)
        params = signature.parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        if "lease" not in params and not takes_any:
            raise TypeError(f"{fn.__qualname__} must accept the keyword argument 'lease'")
        sources = {"tenant": tenant, "project": project, "user": user}
        if holder_ref is not None:
            sources["holder_ref"] = holder_ref
        for what, source in sources.items():
            if isinstance(source, str):
                if source not in params:
                    raise TypeError(f"{fn.__qualname__} has no argument {source!r} for the {what} id")
            elif not callable(source):
                raise TypeError(f"{what} must name an argument or be a callable")

        def resolve(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            bound = signature.bind_partial(None, *args, **kwargs)  # None stands in for the task
            bound.apply_defaults()
            out = {}
            for what, source in sources.items():
                value = bound.arguments.get(source) if isinstance(source, str) else source(*args, **kwargs)
                out[what] = value
            return out

        @functools.wraps(fn)
        def run(task: Any, *args: Any, **kwargs: Any) -> Any:
            if not hasattr(task, "retry") or not hasattr(task, "request"):
                raise TypeError(f"{fn.__qualname__}: @leased needs a bound task (bind=True)")
            ticket_id = kwargs.pop(TICKET_KWARG, None)
            ids = resolve(args, kwargs)
            request = service.LeaseRequest(
                type=type, lease=lease, inline=inline, tenant_id=ids["tenant"], project_id=ids["project"],
                user_id=ids["user"], holder_ref=ids.get("holder_ref") or "", pod_bound=pod_bound, wait_ms=0)
            held = _acquire(request, ticket_id, keep_place=keep_place and inline is None)
            if isinstance(held, service.Ticket) or isinstance(held, LeaseBusy):
                _retry(task, request, held, args, kwargs, max_retries=max_retries, countdown=countdown)
            with held:
                return fn(task, *args, lease=held, **kwargs)

        run.leased = {"type": type, "lease": lease}  # type: ignore[attr-defined]  # for introspection (admin, docs)
        return run

    return decorate


def _acquire(request: service.LeaseRequest, ticket_id: str | None, *, keep_place: bool) -> Any:
    """A lease, a kept ticket (our place in the queue) or the busy diagnosis.

    Raises:
        InvalidLeaseRequest, LeaseUnavailable: as :func:`leases.acquire`.
    """
    scope = holders.scope(request.tenant_id, request.project_id)
    if ticket_id is not None:
        if not isinstance(ticket_id, str):
            raise InvalidLeaseRequest("the kept ticket must be a ticket id")
        try:
            resumed = service.resume(ticket_id, scope=scope, keep_ms=keep_ms())
            return _adopt(resumed) if isinstance(resumed, service.Lease) else resumed
        except (LeaseExpired, StaleLease) as exc:
            # The retry came back after the keep window (a busy or restarted worker): the
            # place is gone, queue again from the back.
            log.info("kept ticket %s ended (%s); queueing again", ticket_id, exc.code)
    try:
        if keep_place:
            return service.acquire_or_ticket(request, keep_ms=keep_ms())
        return service.acquire(request)
    except LeaseBusy as busy:
        return busy


def _adopt(lease: service.Lease) -> service.Lease:
    """Move a lease granted to a resumed ticket onto this process's pod: the retry may run
    in another worker than the one that queued it, and the pod reap must follow the process
    that holds the lease, not the one that once asked for it.

    Raises:
        LeaseLost: the lease was reaped in the meantime.
        LeaseUnavailable: the store failed (the lease is released, best effort).
    """
    pod = self_pod_id()
    if lease.request.pod in ("", pod):
        return lease
    try:
        with service._bound():
            moved = store.holders().update_one(*commands.adopt(lease.token, pod=pod))
    except pymongo.errors.PyMongoError as exc:
        try:
            lease.release()
        except LeaseUnavailable:
            log.warning("release of %s failed; reap and repair return it", lease.token)
        raise LeaseUnavailable(store.unreachable("lease store", exc)) from None
    if not moved.matched_count:
        raise LeaseLost(f"lease {lease.token} on {lease.resource} was lost (reaped or revoked)")
    lease.request = dataclasses.replace(lease.request, pod=pod)
    return lease


def _retry(task: Any, request: service.LeaseRequest, outcome: Any, args: tuple[Any, ...],
           kwargs: dict[str, Any], *, max_retries: int, countdown: float | None) -> None:
    """Retry the task later (never returns): with the ticket when one is kept.

    Raises:
        celery.exceptions.Retry: the retry was scheduled (Celery's way out of the task).
        LeaseRetriesExhausted: the retries are spent; the kept ticket was given up.
    """
    retries = int(getattr(task.request, "retries", 0) or 0)
    ticket = outcome if isinstance(outcome, service.Ticket) else None
    if retries >= max_retries:
        if ticket is not None:
            try:
                service.abandon(ticket.id, scope=holders.scope(request.tenant_id, request.project_id))
            except Exception:  # the ticket goes stale within its keep window anyway
                log.info("could not give up ticket %s", ticket.id, exc_info=True)
        raise LeaseRetriesExhausted(retries=retries, resource=_resource(outcome), level=_level(outcome),
                                    position=getattr(outcome, "position", None))
    if countdown is not None:
        delay = float(countdown)
    elif ticket is not None:
        delay = ticket_delay(ticket)
    else:
        suggested = getattr(outcome, "retry_after", None)
        delay = float(suggested) if suggested else poll_seconds() * random.uniform(1.0, 1.5)
    if ticket is not None:
        # Past the keep window the place is lost anyway: never wait longer than a third of it.
        delay = min(delay, keep_ms() / 3000.0)
        kwargs = {**kwargs, TICKET_KWARG: ticket.id}
    raise task.retry(args=args, kwargs=kwargs, countdown=delay, max_retries=max_retries)


def ticket_delay(ticket: service.Ticket) -> float:
    """When to poll a kept ticket: at the server's estimate of its grant when that comes
    sooner than the poll interval (a slot free for us idles until we poll), else after one
    poll interval (the ticket must be polled within its keep window whatever the estimate)."""
    poll = poll_seconds()
    if ticket.estimated_grant_at is None:
        return poll
    until = (ticket.estimated_grant_at - ticket.server_time).total_seconds()
    return max(MIN_TICKET_DELAY_S, min(until, poll))


def _resource(outcome: Any) -> str:
    return str(getattr(outcome, "resource", "") or "")


def _level(outcome: Any) -> str:
    return str(getattr(outcome, "level", "") or "")
