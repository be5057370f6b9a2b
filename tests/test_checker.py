"""The history checker on hand-made histories: each rule flags a violating one, passes a clean one.

The real-process run (faults injected, the checker deciding) is tests/test_checker_run.py.
"""

from __future__ import annotations

import json
import os

from tests.checker import faults, rules
from tests.checker.history import Call, Fault, History, Recorder, load

CAPS = {"global": 2, "tenant": 1}
TTL_S, SLACK_S, W_S = 2.0, 5.0, 10.0


def acquire(process, seq, invoked, completed, token, outcome="ok", tenant="t1", project="p1", user="u1",
            wait_ms=15000, level=None):
    return Call(process, seq, "acquire", invoked, completed, outcome, token if outcome == "ok" else None,
                tenant, project, user, wait_ms, level)


def check(process, seq, invoked, completed, token, outcome="ok"):
    return Call(process, seq, "check", invoked, completed, outcome, token)


def history(*calls, faults=(), ended=None):
    starts = {}
    for call in calls:
        starts[call.process] = min(starts.get(call.process, call.invoked), call.invoked)
    return History(calls=list(calls), starts=starts, faults=list(faults), ended=ended)


def verdict(h, caps=CAPS):
    return rules.check(h, caps, ttl_s=TTL_S, slack_s=SLACK_S, window_s=W_S)


# --- proven overlap <= cap -----------------------------------------------------------------


def test_given_two_grants_of_one_tenant_proven_held_at_once_then_the_tenant_overlap_is_flagged_with_the_instant():
    h = history(acquire("a", 1, 0.0, 1.0, "tokA"), check("a", 2, 3.0, 3.1, "tokA"),
                acquire("b", 1, 0.5, 2.0, "tokB"), check("b", 2, 2.5, 2.6, "tokB"))
    found = verdict(h).overlaps
    assert [(o.level, o.scope, o.cap, o.count, o.at) for o in found] == [("tenant", "t1", 1, 2, 2.0)]
    assert {g.token for g in found[0].grants} == {"tokA", "tokB"}
    assert "overlap 2 > cap 1 at tenant 't1' at t=2.000" in str(found[0])


def test_given_a_hand_over_between_last_check_and_next_grant_then_no_overlap():
    # a's last successful check was invoked at 2.0 (completed later): proven held until 2.0 only
    h = history(acquire("a", 1, 0.0, 1.0, "tokA"), check("a", 2, 2.0, 2.5, "tokA"),
                acquire("b", 1, 0.5, 2.2, "tokB"), check("b", 2, 3.0, 3.1, "tokB"))
    v = verdict(h)
    assert v.overlaps == [] and v.max_overlap["tenant"] == (1, "t1")


def test_given_three_tenants_proven_held_at_once_then_the_global_cap_of_two_is_flagged():
    h = history(*(c for i, t in enumerate(("t1", "t2", "t3")) for c in (
        acquire(t, 1, 0.0, 1.0 + i / 10, f"tok{t}", tenant=t), check(t, 2, 5.0, 5.1, f"tok{t}"))))
    found = verdict(h).overlaps
    assert [(o.level, o.scope, o.count) for o in found] == [("global", "*", 3)]
    assert verdict(h).max_overlap == {"global": (3, "*"), "tenant": (1, "t3")}


def test_given_indeterminate_or_unchecked_grants_then_they_are_never_proven_held():
    h = history(acquire("a", 1, 0.0, 1.0, "tokA"), check("a", 2, 3.0, 3.1, "tokA"),
                Call("b", 1, "acquire", 0.5, None, None, None, "t1"),  # kill -9 in flight: no completion
                check("b", 2, 2.5, 2.6, "tokB"),  # the token of an unknown grant proves nothing
                acquire("c", 1, 0.5, 1.5, "tokC"),  # granted, but never checked: no proof
                acquire("d", 1, 0.5, 1.5, "tokD"), check("d", 2, 2.0, None, "tokD"),  # check in flight
                acquire("e", 1, 0.5, 1.5, "tokE", outcome="unavailable"))
    v = verdict(h)
    assert [g.token for g in v.grants] == ["tokA"] and v.overlaps == []


def test_given_one_user_in_two_projects_then_the_user_scope_crosses_projects():
    h = history(acquire("a", 1, 0.0, 1.0, "tokA", project="p1"), check("a", 2, 3.0, 3.1, "tokA"),
                acquire("b", 1, 0.0, 2.0, "tokB", project="p2"), check("b", 2, 2.5, 2.6, "tokB"))
    assert [(o.level, o.scope) for o in verdict(h, {"user": 1}).overlaps] == [("user", "t1/u1")]
    assert verdict(h, {"project": 1}).overlaps == []


# --- no revival ------------------------------------------------------------------------------


def test_given_a_successful_check_after_lease_lost_then_it_is_a_revival():
    h = history(acquire("a", 1, 0.0, 1.0, "tokA"), check("a", 2, 1.5, 1.6, "tokA"),
                check("a", 3, 5.0, 5.1, "tokA", outcome="lost"), check("a", 4, 5.2, 5.3, "tokA"))
    (found,) = verdict(h).revivals
    assert (found.token, found.lost_at, found.revived.seq) == ("tokA", 5.1, 4)
    assert "revival of a:tokA" in str(found)


def test_given_lost_stays_lost_then_no_revival():
    h = history(acquire("a", 1, 0.0, 1.0, "tokA"), check("a", 2, 1.5, 1.6, "tokA"),
                check("a", 3, 5.0, 5.1, "tokA", outcome="lost"), check("a", 4, 5.2, 5.3, "tokA", outcome="lost"),
                acquire("a", 5, 5.4, 5.5, "tokA2"), check("a", 6, 5.6, 5.7, "tokA2"))
    assert verdict(h).revivals == []


# --- liveness --------------------------------------------------------------------------------


def test_given_a_live_waiter_told_busy_within_a_covering_wait_then_it_is_a_liveness_violation():
    faults = [Fault("holder-stop", "b", 1.0, 4.0)]  # longest fault 3 s: bound 3 + 2 + 5 = 10 s
    h = history(acquire("a", 1, 0.0, 15.0, None, outcome="busy", level="tenant", wait_ms=15000),
                acquire("a", 2, 15.1, 15.2, "tokA"), acquire("b", 1, 0.0, 0.1, "tokB"), faults=faults, ended=16.0)
    live = verdict(h).liveness
    assert live.wait_bound_ms == 10000 and live.busy_to_live == 1
    busy = [v for v in live.violations if v.kind == "busy"]
    assert [v.process for v in busy] == ["a"] and "LeaseBusy at level tenant" in str(busy[0])


def test_given_busy_for_a_stopped_waiter_or_a_short_wait_then_liveness_holds():
    faults = [Fault("waiter-stop", "a", 2.0, 8.0)]  # bound 6 + 2 + 5 = 13 s: a 15 s wait covers it
    h = history(acquire("a", 1, 0.0, 15.0, None, outcome="busy", wait_ms=15000),  # stopped meanwhile
                acquire("a", 2, 15.1, 15.2, "tokA"),
                acquire("b", 1, 0.0, 3.0, None, outcome="busy", wait_ms=3000),  # its wait covers no fault
                acquire("b", 2, 3.1, 3.2, "tokB"), acquire("b", 3, 12.0, 12.1, "tokB3"), faults=faults, ended=16.0)
    live = verdict(h).liveness
    assert live.violations == [] and live.busy_to_live == 0
    assert live.longest_live_wait_s == 3.0  # a's 15 s wait was not a live one


def test_given_a_waiter_stopped_early_in_its_wait_then_busy_after_a_covering_live_wait_is_a_violation():
    faults = [Fault("waiter-stop", "a", 1.0, 4.0)]  # bound 3 + 2 + 5 = 10 s; 12 s of the wait were live
    h = history(acquire("a", 1, 0.0, 15.0, None, outcome="busy", level="global", wait_ms=15000),
                acquire("a", 2, 15.1, 15.2, "tokA"), faults=faults, ended=16.0)
    live = verdict(h).liveness
    busy = [v for v in live.violations if v.kind == "busy"]
    assert [v.process for v in busy] == ["a"] and "(12.00s of it live)" in busy[0].detail


def test_given_a_live_process_not_granted_for_longer_than_w_then_it_is_starved():
    h = history(acquire("a", 1, 0.0, 1.0, "tokA1"), acquire("a", 2, 1.1, 14.0, "tokA2"),
                *(acquire("b", i, i, i + 0.1, f"tokB{i}") for i in range(1, 13)), ended=15.0)
    (found,) = verdict(h).liveness.violations
    assert (found.process, found.kind, found.start, found.end) == ("a", "starved", 1.0, 14.0)
    assert "no grant for 13.00s" in found.detail and "granted 12 times" in found.detail


def test_given_the_gap_is_the_process_own_stop_or_after_its_kill_then_it_is_not_starved():
    faults = [Fault("holder-stop", "a", 2.0, 8.0), Fault("kill", "b", 3.0, None)]
    h = history(acquire("a", 1, 0.0, 1.0, "tokA1"), acquire("a", 2, 1.1, 12.0, "tokA2"),  # 11 s - 6 s stopped
                acquire("b", 1, 0.0, 1.0, "tokB"), faults=faults, ended=20.0)  # b: nothing after its kill
    live = verdict(h).liveness
    assert live.violations == [] and live.grants == {"a": 2, "b": 1}
    assert live.longest_live_gap_s == 8.0  # a: from its last grant at 12 s to the end at 20 s
    # the same history running on to 30 s: a's 18 s without a grant is starvation
    h.ended = 30.0
    assert [(v.process, v.start, v.end) for v in verdict(h).liveness.violations] == [("a", 12.0, 30.0)]


# --- the recorder ----------------------------------------------------------------------------


def test_given_a_recorded_file_cut_mid_call_then_the_call_is_indeterminate(tmp_path):
    recorder = Recorder(str(tmp_path), "t1-a.0")
    call = recorder.invoke("acquire", tenant="t1", project="p1", user="u1", waitMs=100)
    recorder.complete(call, "ok", token="tokA")
    recorder.invoke("check", token="tokA")  # kill -9 here: no completion
    recorder.close()
    with open(tmp_path / "t1-a.0.history.jsonl", "a") as handle:
        handle.write('{"p": "t1-a.0", "n": 2, "ev": "compl')  # a line cut by the kill
    with open(tmp_path / "faults.jsonl", "w") as handle:
        handle.write(json.dumps({"kind": "kill", "target": "t1-a.0", "start": 1.0, "end": None}) + "\n")
    h = load(str(tmp_path), ended=5.0)
    acquired, checked = h.of("t1-a.0")
    assert (acquired.outcome, acquired.token, acquired.wait_ms, acquired.tenant) == ("ok", "tokA", 100, "t1")
    assert (checked.op, checked.completed, checked.outcome, checked.token) == ("check", None, None, "tokA")
    assert h.faults == [Fault("kill", "t1-a.0", 1.0, None)] and "t1-a.0" in h.starts
    assert os.path.exists(tmp_path / "t1-a.0.history.jsonl")


def test_given_a_client_file_the_injector_reads_whether_it_holds_or_waits(tmp_path):
    recorder = Recorder(str(tmp_path), "c")
    state = faults.refresh(str(tmp_path), "c", faults.ClientState())
    assert (state.holding, state.waiting_since) == (False, None)
    call = recorder.invoke("acquire", tenant="t1", project="p1", user="u1", waitMs=100)
    state = faults.refresh(str(tmp_path), "c", state)
    assert state.waiting_since is not None and not state.holding
    recorder.complete(call, "ok", token="tok")
    assert faults.refresh(str(tmp_path), "c", state).holding and state.waiting_since is None
    lost = recorder.invoke("check", token="tok")
    recorder.complete(lost, "lost", detail="LeaseExpired")
    assert not faults.refresh(str(tmp_path), "c", state).holding
    recorder.close()
