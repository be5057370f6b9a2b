"""The history checker on hand-made histories: each rule flags a violating one, passes a clean one.

The real-process run (faults injected, the checker deciding) is tests/test_checker_run.py.
"""

from __future__ import annotations

import json
import os

from tests.checker import faults, proxy, rules, slots
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


# --- no loss without a cause -----------------------------------------------------------------


def test_given_a_lease_lost_right_after_its_grant_with_nothing_to_explain_it_then_it_is_a_loss():
    h = history(acquire("a", 1, 0.0, 1.0, "tokA"), check("a", 2, 1.1, 1.2, "tokA", outcome="lost"),
                acquire("b", 1, 0.0, 0.5, "tokB"), check("b", 2, 0.6, 0.7, "tokB"),
                check("b", 3, 1.0, 1.1, "tokB", outcome="lost"))
    found = verdict(h).losses
    assert [(v.process, v.token, v.since) for v in found] == [("a", "tokA", 1.0), ("b", "tokB", 0.6)]
    assert "loss of a:tokA without a cause" in str(found[0])
    assert str(found[0]) in verdict(h).violations


def test_given_a_loss_after_a_ttl_without_renewal_a_store_fault_or_the_holder_stopped_then_it_is_explained():
    h = history(acquire("a", 1, 0.0, 1.0, "tokA"), check("a", 2, 3.5, 3.6, "tokA", outcome="lost"),  # TTL passed
                acquire("b", 1, 0.0, 1.0, "tokB"), check("b", 2, 1.2, 1.3, "tokB", outcome="lost"),  # store stopped
                acquire("c", 1, 0.0, 1.0, "tokC"), check("c", 2, 1.1, 1.2, "tokC", outcome="lost"),  # stopped waiting
                acquire("d", 1, 0.0, 1.0, "tokD"), check("d", 2, 1.1, 1.2, "tokD", outcome="lost"),  # replies lost
                faults=[Fault("store-stop", "store", 1.1, 1.25), Fault("waiter-stop", "c", 0.2, 0.9),
                        Fault("reply-lost", "store", 0.9, 1.05)])
    assert [v.process for v in verdict(h).losses] == []


def test_given_a_redis_stopped_for_minutes_then_it_is_not_in_the_busy_bound():
    faults = [Fault("redis-stop", "redis", 0.0, 120.0), Fault("holder-stop", "b", 1.0, 4.0)]
    assert rules.longest_fault(faults) == 3.0
    assert rules.longest_fault([Fault("redis-restart", "redis", 0.0, 1.5)]) == 1.5


# --- every slot comes back (the store's side) -------------------------------------------------


def test_given_counter_documents_then_over_cap_drift_and_one_entry_on_two_fence_slots_are_problems():
    good = {"_id": "r|project|t/p", "cap": 2, "count": 1, "holders": ["e1"],
            "fence": {"s0": {"e": "e0", "g": 5}, "s1": {"e": "e1", "g": 7}}}  # s0's entry ended: free
    assert slots.counter_problems(good, 1.0) == []
    doubled = {**good, "fence": {"s0": {"e": "e1", "g": 5}, "s1": {"e": "e1", "g": 7}}}
    (problem,) = slots.counter_problems(doubled, 1.0)
    assert problem.kind == "double-slot" and "['s0', 's1']" in str(problem)
    over = {"_id": "r|global|*", "cap": 1, "count": 1, "holders": ["e1", "e2"]}
    assert [p.kind for p in slots.counter_problems(over, 1.0)] == ["over-cap", "count"]


def test_given_http_clients_that_vanished_then_a_slot_booked_past_their_deadline_is_a_problem(tmp_path):
    def log(name, *lines):
        (tmp_path / f"{name}.log").write_text("".join(json.dumps(line) + "\n" for line in lines))

    log("h0.before", {"at": 10.0, "what": "post", "status": 202, "ticket": "T0"},
        {"at": 10.5, "what": "poll", "status": 200, "ticket": "T0"}, {"at": 10.5, "what": "vanish", "ticket": "T0"})
    log("h1.granted", {"at": 11.0, "what": "post", "status": 201, "token": "T1"},
        {"at": 11.0, "what": "vanish", "ticket": "T1", "token": "T1"})
    log("h2.hold", {"at": 12.0, "what": "post", "status": 201, "token": "T2"})  # no vanish: not judged
    booked = {"T0": 15.5, "T1": 19.0, "T2": 99.0}  # T0: 2 s past 10.5 + 3 (slack 1 s); T1 within its TTL 8 s
    found = slots.kept_past_deadline(str(tmp_path), booked, keep_s=3.0, ttl_s=8.0)
    assert [(p.kind, p.key) for p in found] == [("kept-past-deadline", "h0.before")]
    assert "past its poll deadline" in str(found[0])
    assert slots.kept_past_deadline(str(tmp_path), {"T0": 14.4}, keep_s=3.0, ttl_s=8.0) == []


# --- the reply-dropping proxy ----------------------------------------------------------------


def test_given_op_msg_bytes_then_the_proxy_reads_the_command_name_and_body():
    import bson

    body = bson.encode({"findAndModify": "c", "query": {}, "$db": "d"})
    message = proxy.HEADER.pack(16 + 4 + 1 + len(body), 7, 0, proxy.OP_MSG) + b"\x00\x00\x00\x00" + b"\x00" + body
    assert proxy.command_of(message) == "findAndModify" and proxy.command_of(message) in proxy.WRITE_COMMANDS
    assert proxy.body_of(message)["$db"] == "d"
    legacy = proxy.HEADER.pack(16 + 5, 7, 0, 2004) + b"\x00" * 5  # OP_QUERY: not parsed
    assert proxy.command_of(legacy) is None
