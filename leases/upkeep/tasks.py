"""Celery tasks and worker wiring: the scheduled sweep, and every worker is a pod.

``leases.tasks.sweep`` runs from the beat entry ``lease-sweep`` (every
``LEASES_REAP_INTERVAL`` seconds, see ``CELERY_BEAT_SCHEDULE``). Any number of workers may
run it at once; delete idempotence and reconcile's compare-and-set keep it correct.

Worker processes register as pods: the main process after setup when its pool runs tasks
there (``solo``, ``threads``), otherwise every prefork child on ``worker_process_init``
and never the prefork parent (threads do not survive the fork). Each serves the internal
endpoint from a daemon thread so other pods can forward revocations to it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_process_init, worker_process_shutdown, worker_shutdown

log = logging.getLogger(__name__)

# The worker's main process loads this module (Django setup) before its pool forks, so a
# process with another pid is a forked pool child. The solo pool sends
# worker_process_init too, but in the main process itself.
_LOADED_IN_PID = os.getpid()

SWEEP_BUDGET_SECONDS = 10.0
SWEEP_MAX_ROUNDS = 20


@shared_task(name="leases.tasks.sweep", ignore_result=True)
def sweep() -> dict[str, Any]:
    """Run bounded sweep rounds until nothing is left or the time budget is spent."""
    from . import sweeps

    started = time.monotonic()
    total, rounds, has_more = 0, 0, True
    while has_more and rounds < SWEEP_MAX_ROUNDS and time.monotonic() - started < SWEEP_BUDGET_SECONDS:
        done, has_more = sweeps.sweep(reconcile_counters=rounds == 0)
        total += done
        rounds += 1
    return {"done": total, "rounds": rounds, "hasMore": has_more}


def _forks_children(worker: Any) -> bool:
    """Whether ``worker``'s pool runs tasks in forked children (prefork) instead of itself."""
    from celery.concurrency.prefork import TaskPool as PreforkPool

    pool_cls = getattr(worker, "pool_cls", None)
    return isinstance(pool_cls, type) and issubclass(pool_cls, PreforkPool)


def start_worker_pod(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """``celeryd_after_setup``: a worker whose pool runs tasks in this process becomes a pod.

    A prefork parent starts nothing: it forks its children after this signal (and again
    whenever it replaces one), and a child would inherit threads that no longer run. Each
    child starts its own machinery in :func:`start_pool_child`.
    """
    if instance is not None and _forks_children(instance):
        return
    _start()


def start_pool_child(**_: Any) -> None:
    """``worker_process_init``: a prefork child becomes a pod of its own, with its own endpoint.

    Its own pod id too (``POD_ID`` gets the child's pid appended): a holder acquired here is
    revoked through this child's endpoint and reaped when this child dies, because only
    this process holds what the lease guards. In the main process (the solo pool sends
    this signal too) it is the same start as :func:`start_worker_pod` (idempotent).
    """
    from ..pods import identity
    from ..telemetry import multiprocess as multiprocess_metrics

    if os.getpid() != _LOADED_IN_PID:
        identity.mark_pool_child()
        # This child may replace one that was killed (no shutdown hook ran there): its
        # live gauges must leave the host's scrape.
        multiprocess_metrics.forget_dead_processes()
    _start()


def _start() -> None:
    from ..pods import process

    try:
        process.start_worker()
    except Exception:  # the worker still sweeps; its own leases stay safe (own pod is alive)
        log.exception("could not register this worker process as a pod")


def stop_worker_pod(**_: Any) -> None:
    """``worker_shutdown`` / ``worker_process_shutdown``: mark this process's pod stopped and
    hand back its live gauges in the host's metrics directory (multiprocess mode)."""
    from ..pods import process
    from ..telemetry import multiprocess as multiprocess_metrics

    try:
        process.stop()
    finally:
        multiprocess_metrics.mark_dead(os.getpid())


celeryd_after_setup.connect(start_worker_pod, weak=False)
worker_process_init.connect(start_pool_child, weak=False)
worker_shutdown.connect(stop_worker_pod, weak=False)
worker_process_shutdown.connect(stop_worker_pod, weak=False)
