"""leases.revocation.explain: the operator's words follow the dispatch matrix's own rule."""

from __future__ import annotations

import pytest

from leases.revocation import dispatch, explain
from leases.revocation.handlers import RevokedHolder


def holder(pod: str, pod_bound: bool, payload: dict | None = None, reason: str = "revoke") -> RevokedHolder:
    return RevokedHolder(token="T" * 32, type="tex", resource="texres", lease_name="tex", tenant_id="acme",
                         project_id="docs", user_id="alice", holder_ref="", pod=pod, pod_bound=pod_bound,
                         payload=payload or {}, reason=reason)


@pytest.mark.parametrize("pod, pod_bound, expected", [
    ("", True, "the client learns of the end on its next renewal (410)"),
    ("", False, "is left to its own expiration"),
    ("pod-a", True, "lives in pod pod-a; it keeps running there until it next checks its lease"),
    ("pod-a", False, "lives outside the pod (e.g. a remote session); it is left to its own expiration"),
])
def test_given_a_forced_revoke_then_each_kind_of_holder_is_told_what_was_left_running(pod, pod_bound, expected):
    assert expected in explain.unhandled_revoke(holder(pod, pod_bound))


def test_given_forced_revokes_then_the_note_lists_each_holder_with_its_payload():
    note = explain.forced_revoke_note([holder("pod-a", True, {"jobId": "j-1"}), holder("", False)])

    lines = note.splitlines()
    assert lines[0] == "--force: revoked directly in MongoDB. NO handler ran."
    assert lines[3] == (f"  - {'T' * 32} (tex on texres, tenant acme): lives in pod pod-a; it keeps running there "
                        'until it next checks its lease; payload {"jobId": "j-1"}')
    assert lines[4].endswith("; payload {}") and len(lines) == 5
    assert explain.forced_revoke_note([]) == "--force: nothing to revoke."


@pytest.mark.parametrize("pod, pod_bound", [("pod-a", True), ("pod-a", False), ("", True), ("", False)])
def test_given_a_sweep_without_handlers_then_only_the_matrix_release_only_row_says_nothing_to_stop(pod, pod_bound):
    text = explain.unhandled_reap(holder(pod, pod_bound, reason="pod"))

    # the same rule the dispatcher applies to a holder whose pod is gone
    if dispatch.releases_only(pod, pod_bound, pod_alive=False):
        assert text == f"pod-bound to dead pod {pod}: the resource died with it, nothing to stop"
    else:
        assert text == "its resource was NOT stopped and is left to its own expiration"


def test_given_a_forced_sweep_then_the_note_has_the_tally_and_one_line_per_reaped_holder():
    note = explain.forced_sweep_note({"done": 3, "rounds": 2, "hasMore": True}, [holder("", False, reason="idle")])

    assert note.splitlines() == [
        "--force: swept directly in MongoDB: 3 holder(s) reaped or counter(s) corrected in 2 round(s); "
        "more remain. NO handler ran.",
        f"  - {'T' * 32} (tex on texres, tenant acme, reason idle): its resource was NOT stopped and is left "
        "to its own expiration; payload {}",
    ]
