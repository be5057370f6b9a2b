"""Poll-loop job tracker (the tex2pdf pattern): type ``tex``, pod-bound.

Acquire before submit, send the lease's fence with the submission (the compile service
admits it with a :class:`leases.fencing.FenceGuard` and refuses a holder whose slot was
granted again), ``update_payload({"jobId": ...})`` once the job id is known, ``check()`` in
every poll iteration, release on the result. The poll loop registers in the
process's :data:`tracker` and unregisters when it ends; the handler marks a running loop
aborted (it wakes at once and raises :class:`JobAborted`). A revocation after the loop
ended finds nothing and leaves nothing behind. The remote job itself has no cancel
endpoint: it expires on the remote side.

Usage::

    result = run_job(submit=lambda fence: service.submit(source, fence=fence), poll=service.result,
                     tenant_id="acme", project_id="docs", user_id="alice")
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

import leases
from leases.errors import InvalidLeaseRequest, JobAborted, JobTimeout
from leases.revocation.handlers import LeaseHandler, RevokedHolder

JOB_TYPE = "tex"


class _Loop:
    def __init__(self) -> None:
        self.aborted = threading.Event()


class JobTracker:
    """Running poll loops of this process by lease token."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loops: dict[str, _Loop] = {}

    def register(self, token: str) -> _Loop:
        loop = _Loop()
        with self._lock:
            self._loops[token] = loop
        return loop

    def unregister(self, token: str) -> None:
        with self._lock:
            self._loops.pop(token, None)

    def abort(self, token: str) -> bool:
        """Mark the loop of ``token`` aborted; False (nothing done) if no loop runs for it."""
        with self._lock:
            loop = self._loops.get(token)
        if loop is None:
            return False
        loop.aborted.set()
        return True

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._loops)


tracker = JobTracker()


class JobHandler(LeaseHandler):
    """``tex`` handler: abort the running poll loop of the revoked lease, if any."""

    type = JOB_TYPE

    def __init__(self, job_tracker: JobTracker | None = None):
        self.tracker = job_tracker or tracker

    def on_revoked(self, holder: RevokedHolder) -> None:
        self.tracker.abort(holder.token)


def run_job(*, submit: Callable[..., str], poll: Callable[[str], Any | None], tenant_id: str,
            project_id: str, user_id: str, lease: str = "tex", holder_ref: str = "",
            poll_interval: float = 0.5, timeout: float = 300.0,
            job_tracker: JobTracker | None = None) -> Any:
    """Run one remote job under a ``tex`` lease and return its result.

    ``submit(fence)`` starts the job and returns its id, sending ``fence`` (the lease's,
    ``None`` for an uncapped lease) with the submission; a ``submit()`` without a parameter
    is called so too (it sends none). ``poll(job_id)`` returns the result or ``None`` while
    it is still running.

    Raises:
        InvalidLeaseRequest: bad ids or a non-positive interval/timeout (nothing acquired).
        LeaseBusy: no slot within the definition's ``waitMs`` (overload shows as busy).
        LeaseUnavailable: the store failed (during acquire or ``check()``).
        LeaseLost: the lease was reaped and the loop noticed at its ``check()``.
        JobAborted: the handler aborted the loop (revocation while polling).
        JobTimeout: no result within ``timeout`` seconds.
        StaleFence: the compile service refused the submission's fence (raised by ``submit``).
    """
    if not (poll_interval > 0 and timeout > 0):
        raise InvalidLeaseRequest("poll_interval and timeout must be positive")
    loops = job_tracker or tracker
    held = leases.acquire(leases.LeaseRequest(
        type=JOB_TYPE, lease=lease, tenant_id=tenant_id, project_id=project_id, user_id=user_id,
        holder_ref=holder_ref, pod_bound=True,
    ))
    token = held.token
    loop = loops.register(token) if token else _Loop()
    try:
        job_id = _submit(submit, getattr(held, "fence", None))
        held.update_payload({"jobId": str(job_id)})
        deadline = time.monotonic() + timeout
        while True:
            if loop.aborted.is_set():
                raise JobAborted(f"job {job_id} aborted: lease {token} was revoked")
            held.check()
            result = poll(job_id)
            if result is not None:
                return result
            if time.monotonic() >= deadline:
                raise JobTimeout(f"job {job_id} gave no result within {timeout}s")
            loop.aborted.wait(poll_interval)  # wakes early when the handler aborts
    finally:
        if token:
            loops.unregister(token)
        held.release()


def _submit(submit: Callable[..., str], fence: str | None) -> str:
    """Call ``submit`` with the fence when it takes one (``submit(fence)``), else bare."""
    try:
        inspect.signature(submit).bind(fence)
    except TypeError:
        return submit()
    except ValueError:  # no signature to read (a builtin): the documented form
        return submit(fence)
    return submit(fence)
