"""This process's pod: the thread that keeps its pod lease renewed, started once per process.

Each process (a web process on its first request, a Celery worker process at start, see
:mod:`leases.pods.process`) owns one :class:`PodRenewer`. The singleton remembers the pid that started it: a forked child
does not inherit its parent's renewer (the thread did not survive the fork) and starts its
own under its own pod id.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import threading
from collections.abc import Callable

import pymongo.errors

from leases.conf import lease_settings

from ..errors import LeaseError
from .identity import self_pod_id
from .leases import PodLease, clamp_interval, register, renew, stop

log = logging.getLogger(__name__)


class PodRenewer:
    """Keeps this process's pod lease alive from a daemon thread (renews while idle).

    Registers on start, renews at the server-issued interval, re-registers after
    ``STALE_LEASE``/``EXPIRED``, and after a failed attempt retries within the interval
    with bounded jitter (so one lost round trip never costs the deadline).
    """

    def __init__(self, pod_id: str, endpoint: str | None, *, proposed_interval: int | None = None,
                 on_state: Callable[[PodLease], None] | None = None):
        self.pod_id = pod_id
        self.endpoint = endpoint or ""
        self.proposed_interval = proposed_interval
        self.lease: PodLease | None = None
        self._on_state = on_state
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0

    def step(self) -> float:
        """One registration/renewal attempt; returns seconds until the next one."""
        try:
            if self.lease is None or not self.lease.ok:
                answer = register(self.pod_id, self.endpoint, proposed_interval=self.proposed_interval)
            else:
                answer = renew(self.pod_id, self.lease.lease_id or "")
                if not answer.ok:
                    log.warning("pod %s lease answered %s; re-registering", self.pod_id, answer.outcome.value)
                    answer = register(self.pod_id, self.endpoint, proposed_interval=self.proposed_interval)
        except (pymongo.errors.PyMongoError, OSError) as exc:
            self.failures += 1
            interval = (self.lease.interval_seconds if self.lease and self.lease.interval_seconds else clamp_interval(None))
            delay = interval * 0.5 + random.uniform(0, interval * 0.25)
            log.warning("pod %s lease renewal failed (%s); retrying in %.1fs", self.pod_id, exc.__class__.__name__, delay)
            return delay
        self.lease = answer
        self.failures = 0
        if self._on_state is not None:
            self._on_state(answer)
        return float(answer.interval_seconds or clamp_interval(None))

    def _run(self) -> None:
        while not self._stop.is_set():
            delay = self.step()
            self._stop.wait(delay)

    def start(self) -> "PodRenewer":
        self._thread = threading.Thread(target=self._run, name=f"pod-lease-{self.pod_id}", daemon=True)
        self._thread.start()
        return self

    def shutdown(self, *, mark_stopped: bool = True) -> None:
        """Stop renewing and (gracefully) mark the pod stopped."""
        self._stop.set()
        if mark_stopped:
            try:
                stop(self.pod_id, self.lease.lease_id if self.lease and self.lease.ok else None)
            except (pymongo.errors.PyMongoError, OSError, LeaseError) as exc:
                log.warning("pod %s could not mark itself stopped (%s); it dies at its deadline", self.pod_id, exc)


_start_lock = threading.Lock()
_renewer: PodRenewer | None = None
_renewer_pid: int | None = None


def current_renewer() -> PodRenewer | None:
    """This process's renewer, if started (and not inherited through ``fork``)."""
    return _renewer if _renewer_pid == os.getpid() else None


def start_pod(endpoint: str | None = None) -> PodRenewer:
    """Start this process's pod lease renewal once per process (idempotent, fork-aware).

    ``endpoint`` defaults to ``LEASES_POD_ENDPOINT``. The first registration happens
    synchronously when possible, so the pod is alive before it serves or acquires.
    """
    global _renewer, _renewer_pid
    with _start_lock:
        if _renewer is not None and _renewer_pid == os.getpid():
            return _renewer
        chosen = endpoint if endpoint is not None else (lease_settings.POD_ENDPOINT or "")
        renewer = PodRenewer(self_pod_id(), chosen, proposed_interval=int(lease_settings.POD_INTERVAL_SECONDS))
        _renewer, _renewer_pid = renewer, os.getpid()
    delay = renewer.step()

    def _loop() -> None:
        if not renewer._stop.wait(delay):
            renewer._run()

    renewer._thread = threading.Thread(target=_loop, name=f"pod-lease-{renewer.pod_id}", daemon=True)
    renewer._thread.start()
    atexit.register(renewer.shutdown)
    return renewer


def stop_pod() -> None:
    """Graceful shutdown of this process's pod (marks it stopped)."""
    renewer = current_renewer()
    if renewer is not None:
        renewer.shutdown()
