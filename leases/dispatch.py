"""``LeaseRevocationDispatcher``: runs revocation handlers through the §6 matrix.

=====================================  =============================================
Holder pod                             Behaviour
=====================================  =============================================
alive, this pod                        handler runs here
alive, foreign                         ``POST {endpoint}/internal/lease/revoked`` with
                                       ``X-Lease-Secret``; a failed POST counts as
                                       unreachable and falls to the rows below
dead (or detached ``""``), pod_bound   release only: the resource died with the pod
dead (or detached ``""``), not bound   handler runs here with the stored payload
=====================================  =============================================

Dispatch is asynchronous (a small thread pool): the reaping or acquiring thread waits
neither for a handler nor for an HTTP call. A handler runs at most once per revocation,
cluster-wide: before running it, a pod claims the token's tombstone (``handledBy``), so a
POST that timed out after the foreign pod accepted it cannot lead to a second run here.
A lost notification is still covered by ``check()``: the holder gets ``LEASE_LOST``.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import pymongo.errors

from . import handlers, store
from .errors import LeaseError
from .handlers import RevokedHolder
from .pods import LeasePodLiveness, liveness as default_liveness

log = logging.getLogger(__name__)

REVOKED_PATH = "/internal/lease/revoked"
SECRET_HEADER = "X-Lease-Secret"
POST_TIMEOUT_SECONDS = 3.0


def _secret() -> str:
    from django.conf import settings

    return settings.LEASES_INTERNAL_SECRET


def claim(token: str) -> bool:
    """Claim the right to run the handler of revocation ``token``; True exactly once.

    The tombstone written by the reaper carries the claim; if it is missing (tombstone
    write failed) the claim creates it.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    from .identity import self_pod_id

    try:
        result = store.tombstones().update_one(
            {"_id": token, "handledBy": {"$exists": False}},
            # Pipeline: keep the reap time ``at`` (the TTL index ages the tombstone from it).
            [{"$set": {"handledBy": {"$literal": self_pod_id()}, "handledAt": "$$NOW",
                       "at": {"$ifNull": ["$at", "$$NOW"]}}}],
            upsert=True,
        )
    except pymongo.errors.DuplicateKeyError:
        return False  # the tombstone exists and is already claimed
    return result.matched_count == 1 or result.upserted_id is not None


class LeaseRevocationDispatcher:
    """Implements :class:`leases.listener.LeaseRevocationListener` with the §6 matrix."""

    def __init__(self, *, max_workers: int = 4, liveness: LeasePodLiveness | None = None,
                 post: Callable[[str, RevokedHolder], bool] | None = None):
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="lease-dispatch")
        self._liveness = liveness or default_liveness
        self._post = post or self.post_revoked
        self._pending: set[Future] = set()
        self._lock = threading.Lock()

    # --- listener interface ---------------------------------------------------------

    def on_revoked(self, holders: list[RevokedHolder]) -> None:
        """Schedule each holder's dispatch; returns at once."""
        for holder in holders:
            self._submit(self.dispatch, holder)

    def run_local_async(self, holder: RevokedHolder) -> None:
        """Run the local handler of ``holder`` in the pool (the internal POST endpoint)."""
        self._submit(self.run_local, holder)

    def _submit(self, fn: Callable[[RevokedHolder], object], holder: RevokedHolder) -> None:
        future = self._pool.submit(self._guarded, fn, holder)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future) -> None:
        with self._lock:
            self._pending.discard(future)

    @staticmethod
    def _guarded(fn: Callable[[RevokedHolder], object], holder: RevokedHolder) -> object:
        try:
            return fn(holder)
        except Exception:  # a failing handler must not kill the pool thread
            log.exception("revocation dispatch of %s (%s) failed", holder.token, holder.type)
            return None

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every scheduled dispatch has finished (tests, shutdown).

        Returns True when nothing is pending any more.
        """
        import concurrent.futures

        with self._lock:
            pending = list(self._pending)
        if not pending:
            return True
        _, not_done = concurrent.futures.wait(pending, timeout=timeout)
        return not not_done

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    # --- the matrix -------------------------------------------------------------------

    def dispatch(self, holder: RevokedHolder) -> str:
        """Apply the matrix to one holder; returns the path taken (for logs and tests)."""
        me = self._liveness.self_pod
        if holder.pod and holder.pod == me:
            return "local" if self.run_local(holder) else "already-handled"
        if holder.pod:
            endpoint = self._safe_endpoint(holder.pod)
            if endpoint:
                if self._post(endpoint, holder):
                    return "forwarded"
                log.warning("revocation POST for %s to pod %s (%s) failed; treating it as unreachable",
                            holder.token, holder.pod, endpoint)
        if holder.pod_bound and holder.pod:
            log.info("lease %s (%s) of dead pod %s is pod-bound: release only", holder.token, holder.type, holder.pod)
            return "release-only"
        return "local-payload" if self.run_local(holder) else "already-handled"

    def _safe_endpoint(self, pod: str) -> str | None:
        try:
            return self._liveness.endpoint(pod)
        except pymongo.errors.PyMongoError as exc:
            log.warning("pod liveness of %s unknown (%s); treating it as dead", pod, exc.__class__.__name__)
            return None

    def run_local(self, holder: RevokedHolder) -> bool:
        """Run the registered handler of ``holder.type`` here, once per revocation.

        Returns True if the handler ran.
        """
        try:
            handler = handlers.get_handler(holder.type)
        except LeaseError:
            log.error("revoked lease %s has type %r without a handler here", holder.token, holder.type)
            return False
        try:
            if not claim(holder.token):
                log.info("revocation of %s was already handled elsewhere", holder.token)
                return False
        except pymongo.errors.PyMongoError as exc:
            # Unclaimable: running risks a second run, skipping risks a leaked resource.
            # Cleanup handlers are idempotent by contract (close/DELETE), so run.
            log.warning("could not claim revocation %s (%s); running the handler anyway", holder.token, exc)
        handler.on_revoked(holder)
        return True

    @staticmethod
    def post_revoked(endpoint: str, holder: RevokedHolder) -> bool:
        """POST the revocation to a foreign pod; True on a 2xx answer."""
        body = json.dumps(holder.to_wire()).encode()
        request = urllib.request.Request(
            endpoint.rstrip("/") + REVOKED_PATH, data=body, method="POST",
            headers={"Content-Type": "application/json", SECRET_HEADER: _secret()},
        )
        try:
            with urllib.request.urlopen(request, timeout=POST_TIMEOUT_SECONDS) as response:
                return 200 <= response.status < 300
        except (urllib.error.URLError, OSError, ValueError) as exc:
            log.info("revocation POST to %s failed: %s", endpoint, exc)
            return False


_dispatcher: LeaseRevocationDispatcher | None = None
_dispatcher_lock = threading.Lock()


def get_dispatcher() -> LeaseRevocationDispatcher:
    """This process's dispatcher (created on first use)."""
    global _dispatcher
    with _dispatcher_lock:
        if _dispatcher is None:
            _dispatcher = LeaseRevocationDispatcher()
        return _dispatcher


def install() -> LeaseRevocationDispatcher:
    """Install the dispatcher as the process's revocation listener (``AppConfig.ready``)."""
    from . import listener

    dispatcher = get_dispatcher()
    listener.set_listener(dispatcher)
    return dispatcher


def accept_remote(data: dict) -> RevokedHolder:
    """Accept a revocation POSTed by another pod and schedule its local handler.

    Raises:
        InvalidLeaseRequest: malformed body, bad token, or a type without a handler here.
        LeaseStillHeld: the token is still a live holder (not revoked; nothing runs).
    """
    from . import validation
    from .errors import InvalidLeaseRequest

    if not isinstance(data, dict):
        raise InvalidLeaseRequest("revocation body must be a JSON object")
    validation.token(data.get("token"))
    handlers.get_handler(data.get("type"))
    payload = data.get("payload") or {}
    validation.payload(payload)
    for key in ("resource", "leaseName", "tenantId", "projectId", "userId", "holderRef", "pod", "reason"):
        if key in data and not isinstance(data[key], str):
            raise InvalidLeaseRequest(f"revocation field {key} must be a string")
    if not isinstance(data.get("podBound", False), bool) or not isinstance(data.get("levels", []), list):
        raise InvalidLeaseRequest("revocation fields podBound/levels have the wrong type")
    try:
        holder = RevokedHolder.from_wire(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidLeaseRequest(f"malformed revocation: {exc}") from None
    if store.holders().find_one({"_id": holder.token}, {"_id": 1}) is not None:
        raise LeaseStillHeld(f"lease {holder.token} is still held; refusing to run its handler")
    get_dispatcher().run_local_async(holder)
    return holder


class LeaseStillHeld(LeaseError):
    """A revocation was posted for a token that is still a live holder."""

    code = "LEASE_STILL_HELD"
