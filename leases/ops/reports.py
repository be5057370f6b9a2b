"""The ``lease`` CLI's texts: one function per report, from the read models to plain text.

Pure formatting over :mod:`leases.ops.tables`: every value comes in as an argument (a read
model, a pod's JSON answer, the server time), nothing is read here. The CLI's ``--json``
output is the read models' own ``to_dict()``; these are the human form of the same data.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .. import ids
from ..definitions.undefined import UndefinedName
from ..definitions.view import DefinitionView
from .history import History, MinuteRow
from .reads import CounterView, HolderPage, HolderView, WaiterList, WaiterView
from .tables import seconds, table, when


def holders(page: HolderPage) -> str:
    """A page of holders."""
    if not page.items:
        return "No holders." if page.total == 0 else f"No holders on page {page.page} (of {page.pages})."
    rows = [(h.token, h.tenant_id, h.project_id, h.user_id, h.resource, h.type, h.pod or "(detached)",
             h.pod_state, "yes" if h.pod_bound else "no", when(h.acquired_at), seconds(h.ttl_remaining_seconds))
            for h in page.items]
    body = table(["TOKEN", "TENANT", "PROJECT", "USER", "RESOURCE", "TYPE", "POD", "POD-STATE", "BOUND",
                  "ACQUIRED", "TTL-LEFT"], rows, numeric=["TTL-LEFT"])
    return f"{body}\n\n{page.total} holder(s), page {page.page} of {page.pages}."


HOLDER_FIELDS = ("token", "state", "tenant_id", "project_id", "user_id", "resource", "lease_name", "type",
                 "holder_ref", "pod", "pod_state", "pod_bound", "ttl_seconds", "acquired_at", "last_seen_at",
                 "expires_at")


def holder(view: HolderView) -> str:
    """One holder in full, one field a line."""
    data = view.to_dict()
    lines = []
    for key in HOLDER_FIELDS:
        value = data[key]
        lines.append(f"{key:<16} {when(value) if isinstance(value, datetime) else value}")
    lines.append(f"{'ttl_left':<16} {seconds(view.ttl_remaining_seconds)}")
    lines.append(f"{'fence':<16} {view.fence or '-'}" + (f"  ({view.fence_summary})" if view.fence else ""))
    lines.append(f"{'levels':<16} {', '.join(ids.readable_key(k) for k in view.levels) or '-'}")
    lines.append(f"{'payload':<16} {json.dumps(view.payload, sort_keys=True, default=str)}")
    return "\n".join(lines)


def counters(rows: Sequence[CounterView], *, drift_only: bool) -> str:
    """Counters with BOOKED and a drift marker."""
    if not rows:
        return "No counters." if not drift_only else "No drift."
    body = table(["RESOURCE", "LEVEL", "SCOPE", "COUNT", "CAP", "BOOKED", "DRIFT"],
                 [(r.resource, r.level, r.readable_scope, r.count, r.cap, r.booked,
                   f"DRIFT {r.count - r.booked:+d}" if r.drift else "") for r in rows],
                 numeric=["COUNT", "CAP", "BOOKED"])
    drifted = sum(1 for r in rows if r.drift)
    tail = f"{len(rows)} counter(s), {drifted} drifted"
    if drifted:
        tail += " (BOOKED is what `lease reconcile` corrects to)"
    return f"{body}\n\n{tail}."


def _blocked(w: WaiterView) -> str:
    if w.blocked_cap is None:
        return w.level
    return f"{w.level} {w.blocked_count}/{w.blocked_cap}"


def _estimate(w: WaiterView, now: datetime) -> str:
    if w.estimated_grant_at is None:
        return "-"
    return f"{max(0.0, (w.estimated_grant_at - now).total_seconds()):.1f}s"


def waiters(result: WaiterList) -> str:
    """Waiting tickets with place, class, estimate and blocking level."""
    if not result.items:
        return "No waiting tickets."
    now = result.server_now
    rows = [(w.resource, w.tenant_id, w.project_id, w.user_id,
             "-" if w.position is None else w.position,
             when(w.waiting_since),
             "-" if w.waiting_since is None else f"{int((now - w.waiting_since).total_seconds())}s",
             w.priority or "-", _estimate(w, now),
             _blocked(w), "STALE" if w.stale else "", w.ticket_id) for w in result.items]
    body = table(["RESOURCE", "TENANT", "PROJECT", "USER", "POS", "WAITING-SINCE", "WAITED", "CLASS",
                  "EST-GRANT-IN", "BLOCKED-AT", "STALE", "TICKET"], rows,
                 numeric=["POS", "WAITED", "EST-GRANT-IN"])
    stale = sum(1 for w in result.items if w.stale)
    tail = f"{len(result.items)} waiting ticket(s), {stale} stale"
    if stale:
        tail += " (waiter gone: no keep-alive within its TTL; the next reader of the queue prunes it)"
    return f"{body}\n\n{tail}. Server time {when(now)}."


def weights(rows: Sequence[dict[str, Any]]) -> str:
    """Tenant weights per lease (``leases.queue.shares.tenant_weights`` rows)."""
    if not rows:
        return "No tenant weights set: every tenant weighs 1."
    body = table(["LEASE", "TENANT", "WEIGHT"], [(r["lease"], r["tenant"], f"{r['weight']:g}") for r in rows],
                 numeric=["WEIGHT"])
    return f"{body}\n\n{len(rows)} weight(s); tenants not listed weigh 1."


def weight_set(name: str, tenant: str, weight: float | None) -> str:
    """The answer to ``set-weight``."""
    shown = "1 (default)" if weight is None else f"{weight:g}"
    return f"Tenant {tenant} now weighs {shown} on lease {name} (System layer; audited)."


def undefined(rows: Sequence[UndefinedName], mode: str) -> str:
    """Undefined lease names acquired recently, and what such acquisitions get under ``mode``."""
    if not rows:
        return "No undefined lease names acquired in the last hour."
    body = table(["NAME", "TENANT", "PROJECT", "LAST-ACQUIRED", "FIRST-SEEN"],
                 [(r.name, r.tenant_id, r.project_id, when(r.last_at), when(r.first_at)) for r in rows])
    then = "acquired NOOP (unlimited)" if mode == "noop" else "refused (UNKNOWN_LEASE)"
    return (f"{body}\n\n{len(rows)} undefined name(s) in the last hour, {then}: define them "
            f"(lease_config put) or fix the caller's spelling.")


def definition(view: DefinitionView, *, defined: bool) -> str:
    """A merged definition, each field with its layer."""
    head = f"lease {view.name} as seen from {view.tenant_id}/{view.project_id}"
    if not defined:
        head += f"  (lease {view.name!r} is not defined in any layer: acquisitions are NOOP)"
    elif view.noop:
        head += "  (NOOP: no level has a cap)"
    body = table(["FIELD", "VALUE", "LAYER"],
                 [(f.field, "no cap" if f.value is None else f.value, f.layer) for f in view.fields])
    return f"{head}\n\n{body}"


def revoked_table(revoked: Sequence[dict[str, Any]]) -> str:
    """Revoked holders in their wire form (``RevokedHolder.to_wire()`` or a pod's answer)."""
    rows = [(h["token"], h["tenantId"], h["resource"], h["type"], h["pod"] or "(detached)",
             "yes" if h["podBound"] else "no") for h in revoked]
    return table(["TOKEN", "TENANT", "RESOURCE", "TYPE", "POD", "BOUND"], rows)


def revoked(revoked: Sequence[dict[str, Any]], via: str, settled: bool | None) -> str:
    """A revocation done by a pod, whose handlers it dispatched."""
    if not revoked:
        return f"Nothing to revoke (via {via})."
    state = "handlers dispatched" + ("" if settled is None else (" and finished" if settled else " (still running)"))
    return f"{revoked_table(revoked)}\n\nRevoked {len(revoked)} holder(s) via {via}; {state}."


def forced_revoke(wire: Sequence[dict[str, Any]], note: str) -> str:
    """A revocation done in the store with no handler: the holders, then what was left behind."""
    return f"{revoked_table(wire)}\n\n{note}" if wire else note


def sweep(answer: dict[str, Any], via: str) -> str:
    """A pod's sweep report: the reaped holders, where each handler ran, and which ran nowhere."""
    reaped = answer.get("holders") or []
    lines = []
    if reaped:
        rows = [(h["token"], h["tenantId"], h["type"], h["pod"] or "(detached)", "yes" if h["podBound"] else "no",
                 h["reason"], h["outcome"], h.get("ranOn") or "-") for h in reaped]
        lines += [table(["TOKEN", "TENANT", "TYPE", "POD", "BOUND", "REASON", "OUTCOME", "RAN-ON"], rows), ""]
    lines.append(f"Sweep via {via}: {answer['done']} holder(s) reaped or counter(s) corrected in "
                 f"{answer['rounds']} round(s){'; more remain' if answer['hasMore'] else ''}.")
    ran = [h for h in reaped if h.get("handlerRan")]
    if ran:
        lines.append(f"Handlers ran (or were accepted by the holder's pod) for {len(ran)} holder(s).")
    released = [h for h in reaped if h["outcome"] == "release-only"]
    if released:
        lines.append(f"{len(released)} pod-bound holder(s) of dead pods: release only, their resources died with the pod.")
    for h in reaped:
        if h["outcome"] not in ("no-handler", "failed"):
            continue
        why = ("no live pod has a handler for this type" if h["outcome"] == "no-handler"
               else "its handler raised (see the pod's log)")
        lines.append(f"NO handler ran for {h['token']} ({h['type']}): {why}; payload "
                     f"{json.dumps(h.get('payload') or {}, sort_keys=True)}")
    pending = [h for h in reaped if h["outcome"] == "pending"]
    if pending:
        lines.append(f"{len(pending)} handler(s) still running on {via}.")
    return "\n".join(lines)


def reconciled(result: dict[str, Any]) -> str:
    """The answer to ``reconcile`` (:func:`leases.upkeep.rounds.reconcile_until_done`)."""
    return (f"Reconcile: {result['corrected']} counter(s) corrected or removed"
            f"{'; more remain' if result['hasMore'] else ''}.")


def stats(data: History, resource: str, tenant_id: str | None) -> str:
    """A resource's per-minute history with a TOTAL row."""
    who = f"tenant {tenant_id}" if tenant_id else "all tenants (peak = sum of the tenants' peaks)"
    head = f"{resource}, {who}, {when(data.since)} .. {when(data.until)} UTC"
    if not data.rows:
        return f"{head}\n\nNo minutes recorded."
    reasons = sorted(data.totals.reaps)

    def row(r: MinuteRow, label: str) -> list[Any]:
        return [label, r.grants, r.busy, r.waits, r.wait_p50_ms, r.wait_p95_ms, r.peak,
                *[r.reaps.get(x, 0) for x in reasons]]

    numbers = ["GRANTS", "BUSY", "WAITS", "P50-MS", "P95-MS", "PEAK", *[f"REAP-{x.upper()}" for x in reasons]]
    body = table(["MINUTE", *numbers],
                 [row(r, r.minute.strftime("%Y-%m-%d %H:%M")) for r in data.rows] + [row(data.totals, "TOTAL")],
                 numeric=numbers)
    return f"{head}\n\n{body}"
