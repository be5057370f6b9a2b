"""Celery tasks and worker wiring: the scheduled sweep, and every worker is a pod.

``leases.tasks.sweep`` runs from the beat entry ``lease-sweep`` (every
``LEASES_REAP_INTERVAL`` seconds, see ``CELERY_BEAT_SCHEDULE``). Any number of workers may
run it at once; delete idempotence and reconcile's compare-and-set keep it correct.

Worker processes register as pods: the main process after setup (``solo``/``threads``
pools run tasks there) and every prefork child on ``worker_process_init``. Each serves
the internal endpoint from a daemon thread so other pods can forward revocations to it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_process_init, worker_process_shutdown, worker_shutdown

log = logging.getLogger(__name__)

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


def start_worker_pod(**_: Any) -> None:
    """Make this worker process a pod: internal endpoint + pod lease renewal."""
    from . import internal_server, pod_renewer

    try:
        endpoint = internal_server.serve_internal()
        renewer = pod_renewer.start_pod(endpoint)
        log.info("worker pod %s registered at %s", renewer.pod_id, endpoint)
    except Exception:  # the worker still sweeps; its own leases stay safe (own pod is alive)
        log.exception("could not register this worker as a pod")


def stop_worker_pod(**_: Any) -> None:
    from . import pod_renewer

    pod_renewer.stop_pod()


celeryd_after_setup.connect(start_worker_pod, weak=False)
worker_process_init.connect(start_worker_pod, weak=False)
worker_shutdown.connect(stop_worker_pod, weak=False)
worker_process_shutdown.connect(stop_worker_pod, weak=False)
