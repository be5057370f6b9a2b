"""Wait estimates under priority classes: pure functions over a gate document, as the order
rule's own tests (no store). The turnover walk's clock moves on with each release, so a
low class reaches its starvation promotion inside the walk; the walk stays within its
budget; a re-asking holder is never taken for the top class by default."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from leases.queue import estimates, order

NOW = datetime(2026, 1, 1, 12, 0, 0)
HOLD_MS = 200.0
BOUND_MS = 5000


def ticket(tid, tenant, pc, project="p", at=NOW, **extra):
    return {"id": tid, "t": tenant, "p": project, "u": tid, "at": at, "seen": at, "ttl": 30_000, "pc": pc, **extra}


def flood(cap=2, interactive=2, batch=4, bound_ms=BOUND_MS, batch_extra=None):
    """``cap`` slots held by tenant ``ti``, whose interactive tickets (class 0) queue beside
    ``batch`` tickets of ``tb`` (class 1); a typical hold of 200 ms on record."""
    bound = {} if bound_ms is None else {"ms": bound_ms}
    queue = [ticket(f"i{n}", "ti", 0, **bound) for n in range(interactive)]
    queue += [ticket(f"b{n}", "tb", 1, **bound, **(batch_extra(n) if batch_extra else {})) for n in range(batch)]
    return {"_id": "r|global|*", "cap": cap, "holders": [f"ti/p/h/h{n}" for n in range(cap)],
            "holds": [HOLD_MS] * 16, "queue": queue}


class Spy:
    """Counts the order rule's picks and the tickets each one ranks (the real rule runs)."""

    def __init__(self, monkeypatch):
        self.picks = self.ranked = 0
        real = order.pick

        def pick(tickets, *args, **kwargs):
            self.picks += 1
            self.ranked += len(tickets)
            return real(tickets, *args, **kwargs)

        monkeypatch.setattr(order, "pick", pick)


def test_given_an_interactive_flood_then_every_batch_ticket_is_estimated_within_its_bound_plus_two_holds():
    gate = flood()

    waits = {f"b{n}": estimates.raw_wait_ms(gate, f"b{n}", NOW) for n in range(4)}

    # Interactive holders ask again at once and always outrank batch, so batch is granted
    # only once promoted (one hold before the bound), two per hold with cap 2.
    assert None not in waits.values(), waits
    assert all(BOUND_MS - 2 * HOLD_MS <= ms <= BOUND_MS + 2 * HOLD_MS for ms in waits.values()), waits
    assert estimates.raw_wait_ms(gate, "i1", NOW) < min(waits.values())


@pytest.mark.parametrize("cap,interactive,batch", [(1, 2, 2), (2, 3, 4), (3, 4, 4), (4, 6, 3)])
def test_given_an_interactive_flood_then_the_batch_estimate_is_within_one_hold_of_the_grant(cap, interactive, batch):
    # A gate run tick by tick (10 ms): each hold lasts exactly HOLD_MS, the interactive
    # holders queue again at once; batch arrives after 1 s of flood and is estimated then.
    gate = {"cap": cap, "holders": [], "holds": [HOLD_MS] * 16,
            "queue": [ticket(f"i{n}", "ti", 0, ms=BOUND_MS) for n in range(interactive)]}
    ends: list[tuple[datetime, str]] = []
    guessed: dict[str, float | None] = {}
    granted: dict[str, float] = {}
    arrival = NOW + timedelta(seconds=1)
    for tick in range(2000):
        now = NOW + timedelta(milliseconds=10 * tick)
        for end, entry in [e for e in ends if e[0] <= now]:
            ends.remove((end, entry))
            gate["holders"].remove(entry)
        for queued in gate["queue"]:
            queued["seen"] = now
        if now == arrival:
            gate["queue"] += [ticket(f"b{n}", "tb", 1, at=now, ms=BOUND_MS) for n in range(batch)]
            guessed = {f"b{n}": estimates.raw_wait_ms(gate, f"b{n}", now) for n in range(batch)}
        for tid in order.next_grants(gate, now):
            chosen = next(q for q in gate["queue"] if q["id"] == tid)
            apply(gate, order.charge(gate, tid))
            gate["queue"].remove(chosen)
            entry = f"{chosen['t']}/p/x/{tid}"
            gate["holders"].append(entry)
            ends.append((now + timedelta(milliseconds=HOLD_MS), entry))
            if chosen["t"] == "tb":
                granted[tid] = (now - arrival).total_seconds() * 1000
            else:
                gate["queue"].append({**chosen, "id": f"{tid.split('.')[0]}.{tick}", "at": now, "seen": now})
        if len(granted) == batch:
            break
    assert len(granted) == batch
    assert all(g is not None and abs(g - granted[tid]) <= HOLD_MS for tid, g in guessed.items()), (guessed, granted)


def apply(gate, ops):
    """Apply the ``$inc``/``$max`` operators of :func:`order.charge` as MongoDB would."""
    for path, value in (ops.get("$inc") or {}).items():
        vt = gate.setdefault("vt", {})
        vt[path.split(".", 1)[1]] = vt.get(path.split(".", 1)[1], 0) + value
    for path, value in (ops.get("$max") or {}).items():
        if path.startswith("vt."):
            vt = gate.setdefault("vt", {})
            vt[path.split(".", 1)[1]] = max(vt.get(path.split(".", 1)[1], 0), value)
        else:
            gate[path] = max(gate.get(path, 0), value)


def test_given_a_starvation_bound_beyond_the_walk_then_the_estimate_comes_from_the_bound():
    hour = 3_600_000
    gate = flood(bound_ms=hour)  # 36,000 releases away: far past the walk's 500

    waits = {f"b{n}": estimates.raw_wait_ms(gate, f"b{n}", NOW) for n in range(4)}

    assert None not in waits.values(), waits
    assert all(hour - 2 * HOLD_MS <= ms <= hour + 2 * HOLD_MS for ms in waits.values()), waits
    assert sorted(waits.values()) == [waits[f"b{n}"] for n in range(4)]  # one per release, oldest first


def test_given_a_flood_when_listing_then_each_estimate_equals_the_single_ticket_estimate():
    for gate in (flood(), flood(bound_ms=3_600_000)):
        listed = estimates.grant_times(gate, NOW)
        assert listed == {q["id"]: estimates.grant_at(gate, q["id"], NOW) for q in gate["queue"]}


def test_given_batch_without_a_bound_under_a_flood_then_the_walk_gives_up_within_its_step_budget(monkeypatch):
    gate = flood(bound_ms=None)
    spy = Spy(monkeypatch)

    assert estimates.raw_wait_ms(gate, "b0", NOW) is None  # never reached: unknown, not a guess

    # About one pick per release: the walk stops after 500 releases (it walked 2,000).
    assert spy.picks <= 500 + gate["cap"], spy.picks


def test_given_a_long_queue_of_distinct_waiters_then_the_walk_ranks_at_most_its_budget(monkeypatch):
    # 199 batch waiters each capped per user (so no two are alike) behind an interactive
    # flood: every pick would rank them all, 2,000 times over without a budget.
    gate = flood(interactive=1, batch=199, bound_ms=None, batch_extra=lambda n: {"caps": {"user": 1}})
    spy = Spy(monkeypatch)

    assert estimates.grant_times(gate, NOW) == {"i0": NOW + timedelta(milliseconds=HOLD_MS / 4)}

    assert spy.ranked <= 10_000 + 200, spy.ranked


def test_given_a_holder_with_no_ticket_queued_when_it_asks_again_then_it_is_not_taken_for_the_top_class():
    # Tenant x holds both slots and queues nothing: its class is unknown, so its re-asking
    # holders pass nobody on class alone and tb, holding nothing, takes the first release.
    gate = {"cap": 2, "holders": ["x/p/u/h1", "x/p/u/h2"], "holds": [HOLD_MS] * 16,
            "queue": [ticket("b0", "tb", 1)]}

    assert estimates.releases_until(gate, "b0", NOW) == 1
    assert estimates.raw_wait_ms(gate, "b0", NOW) == HOLD_MS / 4


def test_given_a_holder_whose_tenant_queues_interactive_work_when_it_asks_again_then_it_keeps_that_class():
    # x's holders work in project p1, its queued ticket is in p2: the tenant's class stands
    # in for theirs, so the unbounded batch ticket is never reached.
    gate = {"cap": 2, "holders": ["x/p1/u/h1", "x/p1/u/h2"], "holds": [HOLD_MS] * 16,
            "queue": [ticket("x0", "x", 0, project="p2"), ticket("b0", "tb", 1)]}

    assert estimates.releases_until(gate, "x0", NOW) == 1
    assert estimates.releases_until(gate, "b0", NOW) is None
