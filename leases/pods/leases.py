"""Pod leases: the server-issued registration lease every pod holds in ``lease_pods``.

Every web process and every Celery worker is a pod. On start it registers in
``lease_pods`` and receives a pod lease, decided by the server so no pod can keep
itself alive on its own clock:

* ``leaseId`` — identity of the agreement; renewals must present it.
* ``intervalSeconds`` — decided by the server: the pod's proposal clamped into
  ``LEASES_POD_INTERVAL_MIN`` … ``LEASES_POD_INTERVAL_MAX``.
* ``expiryDeadline`` — server receipt time + ``LEASES_POD_EXPIRY_FACTOR`` × interval.

Every time here is MongoDB's clock (``hello.localTime``), never the pod's: a pod with a
skewed clock renews exactly like one with a correct clock. Renewal is idempotent — the new
deadline is ``max(previous, receipt + factor × interval)`` (an atomic ``$max``), so a
duplicate, delayed or replayed renewal never moves it backwards nor beyond the last
receipt. An unknown ``leaseId`` is answered ``STALE_LEASE``, a renewal after the deadline
``EXPIRED``; both are terminal and refresh nothing. Registering with a blank ``leaseId``
attaches to the pod's current lease (deadline untouched) or, once it has expired or the
pod stopped, grants a fresh one: the only way back for an expired pod.

Unlike the in-memory reference, the leases live in MongoDB, so restarting any one process
invalidates nothing. What "alive" means is :mod:`leases.pods.liveness`; the thread that keeps
this process's lease renewed is :mod:`leases.pods.renewer`.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pymongo.errors

from leases.conf import lease_settings

from ..errors import InvalidLeaseRequest, PodLeaseError
from ..ids import validation
from ..store import client as store
from ..store.documents import PodDoc


class Outcome(str, enum.Enum):
    """Answer of :func:`register` / :func:`renew` (the seed's ``code`` field)."""

    GRANTED = "GRANTED"      # a fresh lease (first registration, or after expiry / stop)
    ATTACHED = "ATTACHED"    # blank-id re-registration joined the current, unexpired lease
    RENEWED = "RENEWED"
    STALE_LEASE = "STALE_LEASE"
    EXPIRED = "EXPIRED"


@dataclass(frozen=True)
class PodLease:
    """The server's answer; ``lease_id``/``deadline`` are None for terminal answers."""

    outcome: Outcome
    pod_id: str
    lease_id: str | None
    interval_seconds: int | None
    expiry_deadline: datetime | None
    received_at: datetime

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.GRANTED, Outcome.ATTACHED, Outcome.RENEWED)


def clamp_interval(proposed: Any) -> int:
    """The server-decided interval: ``proposed`` clamped into the configured bounds.

    ``None`` (or anything not a positive int) takes ``LEASES_POD_INTERVAL_SECONDS``.
    """
    s = lease_settings
    low = max(1, int(s.POD_INTERVAL_MIN))
    high = max(low, int(s.POD_INTERVAL_MAX))
    if isinstance(proposed, bool) or not isinstance(proposed, int) or proposed <= 0:
        proposed = int(s.POD_INTERVAL_SECONDS)
    return min(high, max(low, proposed))


def expiry_factor() -> int:
    """How many intervals a pod may miss before it is dead (at least 1)."""
    return max(1, int(lease_settings.POD_EXPIRY_FACTOR))


def _valid_pod(pod_id: Any) -> str:
    try:
        return validation.pod_id(pod_id)
    except InvalidLeaseRequest as exc:
        raise PodLeaseError(str(exc)) from None


def _deadline(received_at: datetime, interval: int) -> datetime:
    return received_at + timedelta(seconds=interval * expiry_factor())


def register(pod_id: str, endpoint: str | None, *, proposed_interval: int | None = None,
             lease_id: str | None = None) -> PodLease:
    """Register (or re-register) ``pod_id``; a non-blank ``lease_id`` is a renewal.

    A blank ``lease_id`` attaches to the pod's current lease without touching its deadline,
    or grants a fresh lease when there is none, it expired, or the pod stopped.

    Raises:
        PodLeaseError: a bad pod id or endpoint (nothing written).
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    pod_id = _valid_pod(pod_id)
    endpoint = validation.pod_endpoint(endpoint)
    if lease_id:
        return renew(pod_id, lease_id)
    pods = store.pods()
    for _ in range(5):
        now = store.server_now()
        current = pods.find_one({"_id": pod_id})
        if (current is not None and current.get("leaseId") and not current.get("stopped")
                and current.get("expiryDeadline") is not None and current["expiryDeadline"] > now):
            # Attach: same lease, same deadline; the endpoint may have moved (restart).
            if current.get("endpoint") != endpoint:
                pods.update_one({"_id": pod_id, "leaseId": current["leaseId"]}, {"$set": {"endpoint": endpoint}})
            return PodLease(Outcome.ATTACHED, pod_id, current["leaseId"], current.get("intervalSeconds"),
                            current["expiryDeadline"], now)
        interval = clamp_interval(proposed_interval)
        fresh: PodDoc = {
            "leaseId": secrets.token_urlsafe(18),
            "endpoint": endpoint,
            "intervalSeconds": interval,
            "expiryDeadline": _deadline(now, interval),
            "lastReceiptAt": now,
            "registeredAt": now,
            "stopped": False,
            "stoppedAt": None,
        }
        if current is None:
            try:
                pods.insert_one({"_id": pod_id, **fresh})
            except pymongo.errors.DuplicateKeyError:
                continue  # a twin process registered the same id at this moment: look again
        else:
            # Compare-and-set on the lease we judged expired, so a concurrent grant wins once.
            if not pods.update_one({"_id": pod_id, "leaseId": current.get("leaseId")}, {"$set": fresh}).matched_count:
                continue
        return PodLease(Outcome.GRANTED, pod_id, fresh["leaseId"], interval, fresh["expiryDeadline"], now)
    raise pymongo.errors.OperationFailure(f"pod {pod_id} registration kept racing; try again")


def renew(pod_id: str, lease_id: str) -> PodLease:
    """Renew the pod lease ``lease_id`` of ``pod_id`` on server time.

    Returns ``RENEWED`` with ``deadline = max(previous, receipt + factor × interval)``;
    ``STALE_LEASE`` for an unknown lease id or a stopped pod; ``EXPIRED`` when the deadline
    has passed. Terminal answers write nothing.

    Raises:
        PodLeaseError: a bad pod id or lease id (nothing written).
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    pod_id = _valid_pod(pod_id)
    if not isinstance(lease_id, str) or not lease_id or len(lease_id) > 64 or validation.TOKEN_RE.fullmatch(lease_id) is None:
        raise PodLeaseError("pod lease id must be a token string")
    pods = store.pods()
    now = store.server_now()
    current = pods.find_one({"_id": pod_id}, {"leaseId": 1, "intervalSeconds": 1, "stopped": 1, "expiryDeadline": 1})
    if current is None or current.get("leaseId") != lease_id or current.get("stopped"):
        return PodLease(Outcome.STALE_LEASE, pod_id, None, None, None, now)
    interval = int(current.get("intervalSeconds") or clamp_interval(None))
    candidate = _deadline(now, interval)
    # The filter re-checks lease id and "deadline not passed" at write time; $max keeps the
    # deadline monotonic under duplicate, delayed and replayed renewals.
    doc = pods.find_one_and_update(
        {"_id": pod_id, "leaseId": lease_id, "stopped": False, "expiryDeadline": {"$gt": now}},
        {"$max": {"expiryDeadline": candidate, "lastReceiptAt": now}},
        projection={"expiryDeadline": 1, "intervalSeconds": 1},
        return_document=pymongo.ReturnDocument.AFTER,
    )
    if doc is None:
        again = pods.find_one({"_id": pod_id}, {"leaseId": 1, "stopped": 1})
        if again is None or again.get("leaseId") != lease_id or again.get("stopped"):
            return PodLease(Outcome.STALE_LEASE, pod_id, None, None, None, now)
        return PodLease(Outcome.EXPIRED, pod_id, None, None, None, now)
    return PodLease(Outcome.RENEWED, pod_id, lease_id, interval, doc["expiryDeadline"], now)


def stop(pod_id: str, lease_id: str | None = None) -> bool:
    """Graceful shutdown: mark the pod stopped, so it is dead at once (not after its deadline).

    Returns True if a pod document was marked.

    Raises:
        PodLeaseError: a bad pod id.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    pod_id = _valid_pod(pod_id)
    query: dict[str, Any] = {"_id": pod_id}
    if lease_id:
        query["leaseId"] = lease_id  # a replaced lease (twin process) is not ours to stop
    result = store.pods().update_one(query, {"$set": {"stopped": True}, "$currentDate": {"stoppedAt": True}})
    return result.matched_count == 1
