"""The one definition of "pod alive", shared by the sweepers, the dispatcher and the views.

A pod is alive while its pod lease (:mod:`leases.pods.leases`) is: registered, not stopped,
``expiryDeadline`` later than MongoDB's now. Every judgement uses the store's clock, so a pod
with a skewed clock is judged like any other.

Liveness and reachability are separate questions. A pod without an endpoint (a script, a
``manage.py shell``, an ASGI server behind a Unix socket) renews its pod lease like any other
and is alive for reaping: its leases are reaped only once its process is gone. It cannot be
reached for revocation dispatch, which then takes the matrix's "unreachable" row
(:mod:`leases.revocation.dispatch`); :meth:`LeasePodLiveness.endpoint` answers ``""`` for it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..store import client as store
from ..store.documents import PodDoc
from .identity import self_pod_id


class LeasePodLiveness:
    """The one definition of "pod alive", shared by sweepers, the dispatcher and the views.

    Alive = registered, not stopped, ``expiryDeadline`` later than MongoDB's now; whether it
    has an endpoint is reachability, not liveness. The own pod is always alive: it is obviously doing the check, and a missing or
    late own registration must neither make its leases reap targets nor fail its handlers.
    """

    def __init__(self, self_pod: str | None = None):
        self._self_pod = self_pod

    @property
    def self_pod(self) -> str:
        return self._self_pod or self_pod_id()

    @staticmethod
    def doc_alive(doc: PodDoc | None, now: datetime) -> bool:
        """The criterion applied to one ``lease_pods`` document at server time ``now``."""
        return bool(
            doc is not None
            and not doc.get("stopped")
            and doc.get("expiryDeadline") is not None
            and doc["expiryDeadline"] > now
        )

    def endpoint(self, pod_id: str, *, now: datetime | None = None) -> str | None:
        """The endpoint of ``pod_id`` if it is alive and foreign, else None.

        An alive pod that registered no endpoint answers ``""``: alive, but unreachable. For
        the own pod this returns its registered endpoint (or ``""``): callers treat the own
        pod as alive and never POST to themselves.

        Raises:
            pymongo.errors.PyMongoError: the store is unreachable.
        """
        if not pod_id:
            return None
        doc = store.pods().find_one({"_id": pod_id})
        if pod_id == self.self_pod:
            return (doc or {}).get("endpoint") or ""
        now = now if now is not None else store.server_now()
        return (doc.get("endpoint") or "") if doc is not None and self.doc_alive(doc, now) else None

    def is_alive(self, pod_id: str, *, now: datetime | None = None) -> bool:
        """Whether ``pod_id`` is alive (the own pod always is; detached ``""`` never is).

        Raises:
            pymongo.errors.PyMongoError: the store is unreachable.
        """
        if not pod_id:
            return False
        if pod_id == self.self_pod:
            return True
        return self.endpoint(pod_id, now=now) is not None

    def alive_pods(self, *, now: datetime | None = None) -> set[str]:
        """Ids of all alive pods (plus the own pod).

        Raises:
            pymongo.errors.PyMongoError: the store is unreachable.
        """
        now = now if now is not None else store.server_now()
        alive = {self.self_pod}
        for doc in store.pods().find({"stopped": False, "expiryDeadline": {"$gt": now}},
                                     {"stopped": 1, "expiryDeadline": 1}):
            if self.doc_alive(doc, now):
                alive.add(doc["_id"])
        return alive

    def dead_holder_pods(self, *, now: datetime | None = None) -> list[str]:
        """Pods that hold leases but are not alive (never registered counts as dead).

        Raises:
            pymongo.errors.PyMongoError: the store is unreachable.
        """
        now = now if now is not None else store.server_now()
        alive = self.alive_pods(now=now)
        # distinct on the indexed ``pod`` field: cost grows with the number of pods.
        return sorted(p for p in store.holders().distinct("pod") if p and p not in alive)


liveness = LeasePodLiveness()


def pod_view(*, now: datetime | None = None) -> list[dict[str, Any]]:
    """Every registered pod with its liveness, for the operator views.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    now = now if now is not None else store.server_now()
    me = liveness.self_pod
    rows = []
    for doc in store.pods().find({}).sort("_id", 1):
        rows.append({**doc, "podId": doc["_id"], "alive": doc["_id"] == me or LeasePodLiveness.doc_alive(doc, now),
                     "self": doc["_id"] == me})
    return rows


def foreign_endpoints(*, now: datetime | None = None) -> list[tuple[str, str]]:
    """``(pod_id, endpoint)`` of every alive pod but this one, for calls to its internal API.

    Raises:
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    return [(row["podId"], row["endpoint"]) for row in pod_view(now=now)
            if row["alive"] and not row["self"] and row.get("endpoint")]
