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


def spawn(name, tenant, seconds, start_at, hold_ms):
    return subprocess.Popen([PYTHON, "-m", "tests.workers.alternator", name, tenant, str(seconds), str(start_at),
                             str(hold_ms)], cwd=REPO,
                            # A generous operation timeout: a loaded 2-core machine can stall
                            # the embedded server; this test is about turns, not timeouts.
                            env=child_env(LEASES_MONGO_TIMEOUT_MS="30000"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


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


def repeats(names):
    return [i for i in range(1, len(names)) if names[i] == names[i - 1]]


def holding(user):
    doc = store.counters().find_one({"_id": GATE}) or {}
    return any(entries.parts_of(e)[2] == user for e in doc.get("holders") or ())


def waiting(user):
    doc = store.counters().find_one({"_id": GATE}) or {}
    return any(t.get("u") == user for t in doc.get("queue") or ())


def test_given_two_processes_of_one_tenant_on_a_tenant_cap_of_one_then_grants_alternate_strictly_also_after_a_pause():
    # Given: two processes of one tenant on {global: 2, tenant: 1}; each asks again as soon as
    # it releases (hold 50 ms), so one always waits at the tenant level for the other.
    config.put_document("_vance", "_tenant", document_path("alt"),
                        "levels: {global: 2, tenant: 1}\nttlSeconds: 2\nwaitMs: 15000")
    seconds, start_at = 15.0, time.time() + 3.0
    procs = [spawn("a1", "acme", seconds, start_at, 50), spawn("a2", "acme", seconds, start_at, 50)]
    try:
        time.sleep(max(0.0, start_at - time.time()) + 3.0)
        # Both in the game for a while (on a loaded machine a worker's set-up may outlast the
        # common start): each has held the slot, then 2 s more of turns.
        assert wait_for(lambda: holding("a1"), 30, 0.002) and wait_for(lambda: holding("a2"), 30, 0.002)
        time.sleep(2.0)
        # When: a2 is paused while it waits, longer than the ticket TTL (its ticket is
        # pruned meanwhile, as a stopped process's must be), and continued.
        assert wait_for(lambda: waiting("a2"), 10, 0.002)
        stopped_at = time.time()
        os.kill(procs[1].pid, signal.SIGSTOP)
        time.sleep(3.6)
        resumed_at = time.time()
        os.kill(procs[1].pid, signal.SIGCONT)
        results = results_of(procs, seconds + 60)
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
    # Then: no live waiter timed out, and the grants alternate strictly before the pause
    # and again from one second after it (time for a2 to queue again) to the end.
    assert [r["busy"] for r in results.values()] == [[], []]
    # (From one second after the start: the first asks also create the counters; and only
    # while both ask.)
    assert all(r["grants"] for r in results.values()), results
    first, last = both_asking(results)
    before = sequence(results, since=max(start_at, first) + 1.0, until=stopped_at)
    after = sequence(results, since=resumed_at + 1.0, until=last)
    assert len(before) > 10 and repeats(before) == [], before
    assert len(after) > 10 and repeats(after) == [], after
