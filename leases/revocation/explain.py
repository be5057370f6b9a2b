"""What a revocation does to the holder's resource, in words for operators.

One place for every explanation of the dispatch matrix (:mod:`leases.revocation.dispatch`):
what a revocation will do (Insights' confirm page and its answer), and what a revocation
or a sweep that ran NO handler (the CLI's ``--force``) leaves behind. Every branch follows
the matrix's own rule (:func:`leases.revocation.dispatch.releases_only`), so no text claims a
handler ran, or a resource died, where the matrix says otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .dispatch import releases_only
from .handlers import RevokedHolder


def dispatch_note(handler_type: str, pod: str, pod_bound: bool, pod_alive: bool) -> str:
    """What a revocation of this holder does, in words for operators ("…, and <note>").

    The same rows as :meth:`leases.revocation.dispatch.LeaseRevocationDispatcher.dispatch`,
    so the UI never claims a handler ran where the matrix only releases.
    """
    if pod and pod_alive:
        return f"the {handler_type} handler is dispatched to pod {pod}, where the holder runs"
    if releases_only(pod, pod_bound, pod_alive):
        return (f"no handler runs: the holder was pod-bound to the dead pod {pod}, "
                "so its resource died with it (release only)")
    if not pod:
        why = "a detached holder has no pod, so pod-bound does not apply" if pod_bound else "detached holder"
        return f"the {handler_type} handler is dispatched with the stored payload ({why})"
    return f"the {handler_type} handler is dispatched with the stored payload (pod {pod} is dead)"


def _payload(holder: RevokedHolder) -> str:
    return json.dumps(holder.payload, sort_keys=True, default=str) if holder.payload else "{}"


def unhandled_revoke(holder: RevokedHolder) -> str:
    """What an operator revoke that ran no handler (``--force``) leaves of ``holder``'s resource.

    The holder's pod may still be alive (a forced revoke does not ask), so a pod-bound
    resource keeps running there until its code next checks the lease.
    """
    if not holder.pod:
        what = "is detached (no pod, e.g. an HTTP client), so no pod runs its handler; "
        return what + ("the client learns of the end on its next renewal (410)" if holder.pod_bound else
                       "its resource lives outside any pod (e.g. a remote session) and is left to its own expiration")
    if holder.pod_bound:
        return f"lives in pod {holder.pod}; it keeps running there until it next checks its lease"
    return "lives outside the pod (e.g. a remote session); it is left to its own expiration"


def forced_revoke_note(holders: Sequence[RevokedHolder]) -> str:
    """The operator's note after revoking ``holders`` directly in the store, with no handler."""
    if not holders:
        return "--force: nothing to revoke."
    lines = ["--force: revoked directly in MongoDB. NO handler ran.",
             "  The slots are free and each holder gets LEASE_LOST on its next check(),",
             "  but nothing stopped the resources themselves:"]
    for h in holders:
        lines.append(f"  - {h.token} ({h.type} on {h.resource}, tenant {h.tenant_id}): {unhandled_revoke(h)}; "
                     f"payload {_payload(h)}")
    return "\n".join(lines)


def unhandled_reap(holder: RevokedHolder) -> str:
    """What a sweep that ran no handler leaves of ``holder``'s resource.

    Only the matrix's release-only row (pod-bound to a pod that is gone) needs no handler.
    """
    if releases_only(holder.pod, holder.pod_bound, pod_alive=False):
        return f"pod-bound to dead pod {holder.pod}: the resource died with it, nothing to stop"
    return "its resource was NOT stopped and is left to its own expiration"


def forced_sweep_note(result: dict[str, Any], reaped: Sequence[RevokedHolder]) -> str:
    """The operator's note after sweep rounds run directly in the store, with no handler.

    ``result`` is the rounds' tally (``done``, ``rounds``, ``hasMore``).
    """
    lines = [f"--force: swept directly in MongoDB: {result['done']} holder(s) reaped or counter(s) corrected in "
             f"{result['rounds']} round(s){'; more remain' if result['hasMore'] else ''}. NO handler ran."]
    for h in reaped:
        lines.append(f"  - {h.token} ({h.type} on {h.resource}, tenant {h.tenant_id}, reason {h.reason}): "
                     f"{unhandled_reap(h)}; payload {_payload(h)}")
    return "\n".join(lines)
