"""Turns within a tenant, with real OS processes: a live waiter blocked at its own tenant
level is granted within one turnover after a slot there frees, in arrival order, however
fast the other process of its tenant asks again — also after the waiter was paused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.store import client as store, entries
from tests.helpers import PYTHON, REPO, child_env, wait_for

GATE = "alt|global|*"


def spawn(name, tenant, seconds, start_at, hold_ms, run_dir):
    return subprocess.Popen([PYTHON, "-m", "tests.workers.alternator", name, tenant, str(seconds), str(start_at),
                             str(hold_ms), run_dir], cwd=REPO,
                            # A generous operation timeout: a loaded 2-core machine can stall
                            # the embedded server; this test is about turns, not timeouts.
                            env=child_env(LEASES_MONGO_TIMEOUT_MS="30000"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def grants_so_far(run_dir, names):
    """The grants the workers reported so far (``[asked, granted]``, by name), from their progress files."""
    progress = {}
    for name in names:
        try:
            with open(os.path.join(run_dir, name + ".grants")) as lines:
                progress[name] = [[float(x) for x in line.split()] for line in lines if line.endswith("\n")]
        except FileNotFoundError:
            progress[name] = []
    return progress


def turns_since(run_dir, names, since):
    """How many grants went to the workers after ``since`` and after both asked (this host's
    epoch seconds), by their progress files."""
    progress = grants_so_far(run_dir, names)
    if not all(progress.values()):
        return 0
    first = max(g[0][0] for g in progress.values())  # the latest first ask: from then on both ask
    return sum(1 for g in progress.values() for asked, granted in g if granted > max(since, first + 1.0))


def results_of(procs, timeout):
    results = {}
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        results[result["name"]] = result
    return results


def sequence(results, since=0.0, until=float("inf")):
    """Who was granted, in grant order, between ``since`` and ``until`` (the workers run on
    this host, so their clocks are one clock; cap 1 at the tenant serialises the grants)."""
    return [name for at, name in sorted((g[1], r["name"]) for r in results.values() for g in r["grants"])
            if since < at < until]


def both_asking(results):
    """The stretch in which every worker was in the game (this host's epoch seconds): from
    the latest first ask to the earliest last grant. Outside it one worker runs alone — one
    that started late on a loaded machine (its Django set-up outlasted the common start),
    or the one still looping after the other's time was up — and is granted again and again,
    as it should be."""
    first = max(r["grants"][0][0] for r in results.values() if r["grants"])
    last = min(r["grants"][-1][1] for r in results.values() if r["grants"])
    return first, last


def back_after(grants, resumed_at):
    """When a worker paused until ``resumed_at`` was first granted after it (``[asked,
    granted]`` pairs; this host's epoch seconds), or 0.0 while it has not been."""
    return min((granted for _, granted in grants if granted > resumed_at), default=0.0)


def asking_again(grants, back):
    """From when, after a2 is ``back``, a1 asks too (``[asked, granted]`` pairs of a1): at once
    if it was waiting then, else at its next ask. Until then a2 may be granted twice in a row:
    nobody else asks (a1, slowed on a loaded machine, is between its release and its ask)."""
    if any(asked <= back < granted for asked, granted in grants):
        return back - 1e-6
    return min((asked for asked, _ in grants if asked > back), default=float("inf"))


def repeats(names):
    return [i for i in range(1, len(names)) if names[i] == names[i - 1]]


def holding(user):
    doc = store.counters().find_one({"_id": GATE}) or {}
    return any(entries.parts_of(e)[2] == user for e in doc.get("holders") or ())


def waiting(user):
    doc = store.counters().find_one({"_id": GATE}) or {}
    return any(t.get("u") == user for t in doc.get("queue") or ())


def test_given_two_processes_of_one_tenant_on_a_tenant_cap_of_one_then_grants_alternate_strictly_also_after_a_pause(
        tmp_path):
    # Given: two processes of one tenant on {global: 2, tenant: 1}; each asks again as soon as
    # it releases (hold 50 ms), so one always waits at the tenant level for the other.
    config.put_document("_vance", "_tenant", document_path("alt"),
                        "levels: {global: 2, tenant: 1}\nttlSeconds: 2\nwaitMs: 15000")
    # The workers run until the stop file (60 s at most): each stretch of turns lasts until it
    # holds TURNS grants, however fast or slow the machine is, instead of a fixed time (it was
    # 15 s in all, ~4 s before the pause and ~5 s after it: 40-80 grants each on an idle machine).
    # TURNS grants in a row with no repeat is the property; a process that re-took the slot
    # while the other waited at the tenant level would show up as a repeat within a few turns.
    seconds, start_at, turns = 60.0, time.time(), 40
    run_dir = str(tmp_path)
    names = ("a1", "a2")
    procs = [spawn(name, "acme", seconds, start_at, 50, run_dir) for name in names]
    try:
        # Both in the game (on a loaded machine a worker's set-up may take a while): each has
        # held the slot, then TURNS turns while both ask.
        assert wait_for(lambda: holding("a1"), 30, 0.002) and wait_for(lambda: holding("a2"), 30, 0.002)
        assert wait_for(lambda: turns_since(run_dir, names, start_at) >= turns, 45, 0.05), grants_so_far(run_dir,
                                                                                                          names)
        # When: a2 is paused while it waits, longer than the ticket TTL (its ticket is
        # pruned meanwhile, as a stopped process's must be), and continued.
        assert wait_for(lambda: waiting("a2"), 10, 0.002)
        stopped_at = time.time()
        os.kill(procs[1].pid, signal.SIGSTOP)
        time.sleep(3.6)
        resumed_at = time.time()
        os.kill(procs[1].pid, signal.SIGCONT)
        # Then TURNS turns again once a2 is back: from its first grant after the pause (it
        # finds its ticket pruned and queues again, which on a loaded machine may take over
        # a second; a1 alone is granted again and again meanwhile, as it should be).
        assert wait_for(lambda: back_after(grants_so_far(run_dir, ["a2"])["a2"], resumed_at), 30, 0.05)
        assert wait_for(lambda: turns_since(run_dir, names, back_after(grants_so_far(run_dir, ["a2"])["a2"],
                                                                       resumed_at)) >= turns, 45, 0.05), (
            grants_so_far(run_dir, names))
        open(os.path.join(run_dir, "stop"), "w").close()
        results = results_of(procs, 60)
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
    # Then: no live waiter timed out, and the grants alternate strictly before the pause
    # and again, once a2 is back, from when both ask to the end.
    assert [r["busy"] for r in results.values()] == [[], []]
    # (From one second after the start: the first asks also create the counters; and only
    # while both ask.)
    assert all(r["grants"] for r in results.values()), results
    first, last = both_asking(results)
    before = sequence(results, since=max(start_at, first) + 1.0, until=stopped_at)
    back = back_after(results["a2"]["grants"], resumed_at)
    # a2 queues again within a few seconds of its resume (not starved by a1 asking again).
    assert back - resumed_at < 10.0, (back, resumed_at)
    after = sequence(results, since=asking_again(results["a1"]["grants"], back), until=last)
    print(f"\nturns: {len(before)} grants before the pause, {len(after)} after it")
    assert len(before) > 10 and repeats(before) == [], before
    assert len(after) > 10 and repeats(after) == [], after
