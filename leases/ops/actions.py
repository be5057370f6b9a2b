"""Operator actions on leases: revoke one holder, or every holder of a pod.

Each action takes its actor as the keyword-only ``acting_user`` and writes one audit entry
per revoked holder through :func:`leases.revocation.audit.record`. A revocation is a reap, not a
release: the holder's levels return, a tombstone and ``reap{reason=revoke}`` are recorded,
and the type's handler is dispatched through the installed revocation listener, the same
path as the sweeps. Tenant binding lives in the delete filter.
"""

from __future__ import annotations

import getpass
import logging
import socket
from typing import Any

from ..engine import claims, holders
from ..errors import HolderNotFound
from ..ids import validation
from ..revocation import audit, listener
from ..revocation.handlers import RevokedHolder
from ..store import client as store
from ..upkeep import reaper

log = logging.getLogger(__name__)

POD_REVOKE_BATCH = 200


def cli_actor() -> str:
    """The audit actor of an operator command run from a shell: ``cli:<login>@<host>``."""
    try:
        who = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in some containers
        who = "unknown"
    return f"cli:{who}@{socket.gethostname()}"


def _record(action: str, holder: RevokedHolder, actor: str, reason: str, dispatched: bool) -> None:
    audit.record(action, actor=actor, token=holder.token, tenantId=holder.tenant_id, projectId=holder.project_id,
                 userId=holder.user_id, resource=holder.resource, type=holder.type, pod=holder.pod, reason=reason,
                 handlerDispatched=dispatched)


def revoke_holder(token: str, *, tenant_id: str | None = None, acting_user: Any, reason: str = "revoke",
                  dispatch: bool = True) -> RevokedHolder:
    """Revoke one holder by operator decision: a reap, not a release.

    The holder document is deleted (bound to ``tenant_id`` in the delete filter when
    given), its levels are returned, a tombstone and ``reap{reason=revoke}`` are recorded,
    then the type's handler is dispatched through the installed revocation listener — the
    same path as the sweeps. ``dispatch=False`` is the CLI's ``--force``: no handler runs.
    A lease a release granted a moment ago, whose holder is not marked ``HELD`` yet, is
    marked first (:func:`leases.engine.claims.take_up`) and revoked as one. An audit record
    names who, when, which holder and tenant. The holder's next ``check()`` raises
    ``LeaseLost``.

    Raises:
        InvalidLeaseRequest: malformed token, tenant id, reason or missing ``acting_user``.
        HolderNotFound: no such holder (in that tenant); nothing was changed.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    validation.token(token)
    if tenant_id is not None:
        validation.entity_id(tenant_id, "tenant id")
    actor = audit.actor_name(acting_user)
    note = validation.reason(reason)
    bound = None if tenant_id is None else holders.scope(tenant_id)
    claims.take_up(token, bound)  # a lease granted a moment ago, its mark not in yet, is one
    holder = reaper.reap_holder(holders.scoped(token, bound), "revoke")
    if holder is None:
        raise HolderNotFound(f"no holder {token}")
    if dispatch:
        listener.notify([holder])
    _record("revoke", holder, actor, note, dispatch)
    log.info("lease %s of tenant %s revoked by %s (handler %s)", token, holder.tenant_id, actor,
             "dispatched" if dispatch else "not run")
    return holder


def revoke_pod(pod: str, *, acting_user: Any, reason: str = "revoke-pod", dispatch: bool = True) -> list[RevokedHolder]:
    """Revoke every holder of ``pod`` (all tenants): one reap per holder, handlers dispatched.

    Raises:
        InvalidLeaseRequest: malformed pod id or reason, or missing ``acting_user``.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    validation.pod_id(pod)
    actor = audit.actor_name(acting_user)
    note = validation.reason(reason)
    revoked: list[RevokedHolder] = []
    while True:
        batch = [d["_id"] for d in store.holders().find({"pod": pod}, {"_id": 1}).limit(POD_REVOKE_BATCH)]
        reaped = []
        for token in batch:
            claims.take_up(token)
            holder = reaper.reap_holder({"_id": token, "pod": pod}, "revoke")
            if holder is not None:
                reaped.append(holder)
        if dispatch:
            listener.notify(reaped)
        for holder in reaped:
            _record("revoke-pod", holder, actor, note, dispatch)
        revoked.extend(reaped)
        # A short batch is the last one; a batch that reaped nothing means others are
        # reaping the same holders, and looping on would only race them.
        if len(batch) < POD_REVOKE_BATCH or not reaped:
            break
    log.info("pod %s: %d holders revoked by %s", pod, len(revoked), actor)
    return revoked
