"""``LeaseRevocationDispatcher``: runs revocation handlers through the dispatch matrix.

=====================================  =============================================
Holder pod                             Behaviour
=====================================  =============================================
alive, this pod                        handler runs here
alive, foreign                         ``POST {endpoint}/internal/lease/revoked`` with
                                       ``X-Lease-Secret``; a failed POST, or an alive
                                       pod without an endpoint (a script, a shell),
                                       counts as unreachable and falls to the rows below
dead, pod_bound                        release only: the resource died with the pod
dead, not pod_bound                    handler runs here with the stored payload
detached ``""`` (HTTP clients)         handler runs here with the stored payload,
                                       whatever pod_bound says
=====================================  =============================================

A detached holder has no pod whose death could have taken its resource along, so
"release only" would leave that resource running with nobody to stop it; pod_bound
cannot apply to it and it takes the not-pod-bound row (:func:`releases_only`).

When the row says "runs here" but this process has no handler for the type (a type only
some pods' code registers), the revocation is offered to the other live pods over the
same POST; the first that has the handler runs it. If none has it, nothing runs and the
outcome says so (``no-handler``) instead of passing for done.

Dispatch is asynchronous (a small thread pool): the reaping or acquiring thread waits
neither for a handler nor for an HTTP call. A handler runs at most once per revocation,
cluster-wide: before running it, a pod claims the token's tombstone (``handledBy``), so a
POST that timed out after the foreign pod accepted it cannot lead to a second run here.
A lost notification is still covered by ``check()``: the holder gets ``LEASE_LOST``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import pymongo.errors

from .. import http_client
from ..errors import LeaseError, LeaseStillHeld
from ..pods.liveness import LeasePodLiveness, liveness as default_liveness
from ..store import client as store, tombstones
from ..store.documents import HolderDoc
from . import handlers
from .handlers import RevokedHolder

log = logging.getLogger(__name__)

REVOKED_PATH = "/internal/lease/revoked"
SECRET_HEADER = "X-Lease-Secret"


def _secret() -> str:
    from leases.conf import lease_settings

    return lease_settings.INTERNAL_SECRET


def claim(holder: RevokedHolder) -> bool:
    """Claim the right to run the handler of the revoked ``holder``; True exactly once.

    The tombstone written by the reaper carries the claim; if it is missing (tombstone
    write failed) the claim creates it whole, in the shape every tombstone has
    (:func:`leases.store.tombstones.tombstone_fields`), so a tenant-bound lookup of the token
    still answers EXPIRED with the reason, not STALE_LEASE.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    from ..pods.identity import self_pod_id

    ended: HolderDoc = {"_id": holder.token, "tenantId": holder.tenant_id, "projectId": holder.project_id,
                        "resource": holder.resource}
    try:
        result = store.tombstones().update_one(*tombstones.claim(ended, holder.reason, self_pod_id()), upsert=True)
    except pymongo.errors.DuplicateKeyError:
        return False  # the tombstone exists and is already claimed
    return result.matched_count == 1 or result.upserted_id is not None


# Outcomes of one dispatch (logs, tests, the operator's sweep report).
LOCAL = "local"                    # holder of this pod: its handler ran here
FORWARDED = "forwarded"            # holder of an alive foreign pod: it accepted the POST
RELEASE_ONLY = "release-only"      # dead holder pod and pod-bound: nothing to stop
LOCAL_PAYLOAD = "local-payload"    # no live holder pod: the handler ran here with the payload
PEER = "peer"                      # as local-payload, but on another live pod that has the handler
ALREADY_HANDLED = "already-handled"
NO_HANDLER = "no-handler"          # the handler should have run, but no reachable pod has it
FAILED = "failed"                  # the handler raised
PENDING = "pending"                # still running when the caller stopped waiting

# Peers asked, at most, when this process lacks a handler: bounds the time one dispatch
# spends (each POST is bounded by http_client.PEER_TIMEOUT_SECONDS).
MAX_PEER_OFFERS = 3


def releases_only(pod: str, pod_bound: bool, pod_alive: bool) -> bool:
    """Whether the matrix only releases a holder whose pod is not reachable: pod-bound with a
    pod. A detached holder (``pod == ""``) never qualifies: no pod's death can have taken its
    resource, so its handler must run.
    """
    return bool(pod) and pod_bound and not pod_alive


@dataclass(frozen=True)
class Outcome:
    """What one dispatch did: ``path`` (one of the constants above) and the pod that ran or
    accepted the handler (``None`` when none did)."""

    path: str
    ran_on: str | None = None

    @property
    def handler_ran(self) -> bool:
        """True when a handler ran (or a live pod accepted to run it)."""
        return self.path in (LOCAL, FORWARDED, LOCAL_PAYLOAD, PEER)


class LeaseRevocationDispatcher:
    """Implements :class:`leases.revocation.listener.LeaseRevocationListener` with the matrix above."""

    def __init__(self, *, max_workers: int = 4, liveness: LeasePodLiveness | None = None,
                 post: Callable[[str, RevokedHolder], bool] | None = None,
                 peers: Callable[[], list[tuple[str, str]]] | None = None):
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="lease-dispatch")
        self._liveness = liveness or default_liveness
        self._post = post or self.post_revoked
        self._peers = peers or self.live_peers
        self._pending: set[Future] = set()
        self._lock = threading.Lock()
        self._local = threading.local()

    # --- listener interface ---------------------------------------------------------

    def on_revoked(self, holders: list[RevokedHolder]) -> None:
        """Schedule each holder's dispatch; returns at once."""
        for holder in holders:
            future = self._submit(self._outcome, holder)
            collected = getattr(self._local, "collected", None)
            if collected is not None:
                collected.append((holder, future))

    def run_local_async(self, holder: RevokedHolder) -> None:
        """Run the local handler of ``holder`` in the pool (the internal POST endpoint)."""
        self._submit(self.run_local, holder)

    def _submit(self, fn: Callable[[RevokedHolder], object], holder: RevokedHolder) -> Future:
        future = self._pool.submit(self._guarded, fn, holder)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future) -> None:
        with self._lock:
            self._pending.discard(future)

    @staticmethod
    def _guarded(fn: Callable[[RevokedHolder], object], holder: RevokedHolder) -> object:
        try:
            return fn(holder)
        except Exception:  # a failing handler must not kill the pool thread
            log.exception("revocation dispatch of %s (%s) failed", holder.token, holder.type)
            return Outcome(FAILED)

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every scheduled dispatch has finished (tests, shutdown).

        Returns True when nothing is pending any more.
        """
        with self._lock:
            pending = list(self._pending)
        if not pending:
            return True
        _, not_done = concurrent.futures.wait(pending, timeout=timeout)
        return not not_done

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    # --- the operator's round ---------------------------------------------------------

    @contextmanager
    def collecting(self) -> Iterator[list[tuple[RevokedHolder, Future]]]:
        """Collect the dispatches this thread schedules inside the block (the operator's
        sweep), so their outcomes can be reported; other threads' dispatches are not mixed in.
        """
        previous = getattr(self._local, "collected", None)
        collected: list[tuple[RevokedHolder, Future]] = []
        self._local.collected = collected
        try:
            yield collected
        finally:
            self._local.collected = previous

    @staticmethod
    def settle(collected: list[tuple[RevokedHolder, Future]], timeout: float) -> list[tuple[RevokedHolder, Outcome]]:
        """Wait up to ``timeout`` seconds for ``collected``; each holder with its outcome
        (``pending`` for what is still running)."""
        if collected:
            concurrent.futures.wait([f for _, f in collected], timeout=timeout)
        results = []
        for holder, future in collected:
            outcome = future.result() if future.done() else None
            results.append((holder, outcome if isinstance(outcome, Outcome) else Outcome(PENDING)))
        return results

    # --- the matrix -------------------------------------------------------------------

    def dispatch(self, holder: RevokedHolder) -> str:
        """Apply the matrix to one holder; returns the path taken (for logs and tests)."""
        return self._outcome(holder).path

    def _outcome(self, holder: RevokedHolder) -> Outcome:
        me = self._liveness.self_pod
        if holder.pod and holder.pod == me:
            return self._here(holder, LOCAL)
        if holder.pod:
            endpoint = self._safe_endpoint(holder.pod)
            if endpoint:
                if self._post(endpoint, holder):
                    return Outcome(FORWARDED, holder.pod)
                log.warning("revocation POST for %s to pod %s (%s) failed; treating it as unreachable",
                            holder.token, holder.pod, endpoint)
            elif endpoint == "":
                # Alive (a script, a shell) but serving no endpoint: unreachable, like a failed POST.
                log.info("pod %s of %s is alive without an endpoint; treating it as unreachable", holder.pod,
                         holder.token)
        if releases_only(holder.pod, holder.pod_bound, pod_alive=False):
            log.info("lease %s (%s) of dead or unreachable pod %s is pod-bound: release only", holder.token, holder.type, holder.pod)
            return Outcome(RELEASE_ONLY)
        outcome = self._here(holder, LOCAL_PAYLOAD)
        if outcome.path != NO_HANDLER:
            return outcome
        return self._offer_to_peers(holder)

    def _here(self, holder: RevokedHolder, path: str) -> Outcome:
        result = self._run_here(holder)
        if result == "ran":
            return Outcome(path, self._liveness.self_pod)
        return Outcome(result, self._handled_by(holder.token) if result == ALREADY_HANDLED else None)

    @staticmethod
    def _handled_by(token: str) -> str | None:
        try:
            return (store.tombstones().find_one({"_id": token}, {"handledBy": 1}) or {}).get("handledBy")
        except pymongo.errors.PyMongoError:
            return None

    def _offer_to_peers(self, holder: RevokedHolder) -> Outcome:
        """No handler here: the first live peer that has one runs it (its endpoint refuses
        types it does not know)."""
        try:
            peers = [(pod, url) for pod, url in self._peers() if pod != holder.pod]
        except pymongo.errors.PyMongoError as exc:
            log.warning("no handler for %r here and the pod registry is unreadable (%s)", holder.type,
                        exc.__class__.__name__)
            peers = []
        for pod, endpoint in peers[:MAX_PEER_OFFERS]:
            if self._post(endpoint, holder):
                log.info("revocation of %s (%s) handed to pod %s, which has its handler", holder.token, holder.type, pod)
                return Outcome(PEER, pod)
        log.error("revoked lease %s has type %r without a handler on this pod or %d live peer(s): no handler ran",
                  holder.token, holder.type, len(peers[:MAX_PEER_OFFERS]))
        return Outcome(NO_HANDLER)

    def live_peers(self) -> list[tuple[str, str]]:
        """``(pod_id, endpoint)`` of every alive foreign pod.

        Raises:
            pymongo.errors.PyMongoError: the store is unreachable.
        """
        from ..pods.liveness import foreign_endpoints

        return foreign_endpoints()

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
        return self._run_here(holder) == "ran"

    def _run_here(self, holder: RevokedHolder) -> str:
        """``"ran"``, ``already-handled`` or ``no-handler``; a raising handler propagates."""
        try:
            handler = handlers.get_handler(holder.type)
        except LeaseError:
            log.warning("revoked lease %s has type %r without a handler here", holder.token, holder.type)
            return NO_HANDLER
        try:
            if not claim(holder):
                log.info("revocation of %s was already handled elsewhere", holder.token)
                return ALREADY_HANDLED
        except pymongo.errors.PyMongoError as exc:
            # Unclaimable: running risks a second run, skipping risks a leaked resource.
            # Cleanup handlers are idempotent by contract (close/DELETE), so run.
            log.warning("could not claim revocation %s (%s); running the handler anyway", holder.token, exc)
        handler.on_revoked(holder)
        return "ran"

    @staticmethod
    def post_revoked(endpoint: str, holder: RevokedHolder) -> bool:
        """POST the revocation to a foreign pod; True on a 2xx answer."""
        try:
            answer = http_client.call_json("POST", endpoint.rstrip("/") + REVOKED_PATH, body=holder.to_wire(),
                                           headers={SECRET_HEADER: _secret()}, timeout=http_client.PEER_TIMEOUT_SECONDS)
        except http_client.HttpCallFailed as exc:
            log.info("revocation POST to %s failed: %s", endpoint, exc.reason)
            return False
        if not answer.ok:
            log.info("revocation POST to %s answered HTTP %d", endpoint, answer.status)
        return answer.ok


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
    from ..errors import InvalidLeaseRequest
    from ..ids import validation

    if not isinstance(data, dict):
        raise InvalidLeaseRequest("revocation body must be a JSON object")
    validation.token(data.get("token"))
    handlers.get_handler(str(data.get("type") or ""))
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
