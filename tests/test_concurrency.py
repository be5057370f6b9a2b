"""Concurrency safety with real OS processes against one MongoDB-compatible server."""

from __future__ import annotations

import json
import subprocess
import time

from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.store import client as store, entries
from tests.helpers import PYTHON, REPO, child_env

WORKERS = 8
# Cycles per worker: 8 x 40 contended cycles over four stacked levels cross every level's
# cap many times; the suite's 10-minute budget sets the number. Longer runs are
# bench/bench_chaos.py's and the history checker's (bench/bench_pauses.py).
CYCLES = 40


def spawn(args):
    return subprocess.Popen([PYTHON, "-m", "tests.workers.cycler", *map(str, args)], cwd=REPO,
                            # A generous operation timeout: this test is about caps, and a
                            # loaded 2-core CI machine can stall the embedded server.
                            env=child_env(LEASES_MONGO_TIMEOUT_MS="30000"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def booked_per_key():
    """Per counter key, the booking entries of the HELD holders that list the key in
    ``levels`` (only set on HELD; a waiter's PENDING document books nothing)."""
    booked: dict[str, list[str]] = {}
    for doc in store.holders().find({"state": "HELD"}, {"levels": 1, "tenantId": 1, "projectId": 1, "userId": 1,
                                                       "attemptId": 1}):
        for key in doc.get("levels") or []:
            booked.setdefault(key, []).append(entries.holder_entry(doc))
    return booked


def test_given_eight_processes_when_cycling_then_no_level_exceeds_its_cap_and_counters_match_holders():
    caps = {"global": 5, "tenant": 3, "project": 2, "user": 1}
    config.put_document("_vance", "_tenant", document_path("shared"),
                        "levels: {global: 5, tenant: 3, project: 2, user: 1}\nttlSeconds: 60\nwaitMs: 2000")
    start_at = time.time() + 3.0
    procs = [spawn([i, CYCLES, start_at, "hold"]) for i in range(WORKERS)]
    samples, violations = 0, []
    try:
        while any(p.poll() is None for p in procs):
            # Each counter document is read atomically and lists one entry per booked slot
            # (a holder takes a slot only with its entry, and gives it back only by pulling
            # it), so count <= cap at every sample means no level ever held more than its
            # cap. (A scan of the holders is no snapshot and could see a released and its
            # successor holder at once.)
            for doc in store.counters().find({}):
                samples += 1
                if doc["count"] > caps[doc["level"]] or doc["count"] < 0:
                    violations.append(doc)
            time.sleep(0.05)
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert samples > 100
    assert violations == []
    assert sum(r["ok"] for r in results) + sum(r["busy"] for r in results) == WORKERS * CYCLES
    assert sum(r["ok"] for r in results) > WORKERS * CYCLES // 2
    # At the end some holders stay held; every counter books exactly the held holders that
    # list it: the same entries (no slot of a gone holder, none missing), count = their number.
    booked = booked_per_key()
    assert sum(r.get("held", 0) for r in results) >= 1
    counters = list(store.counters().find({}))
    for doc in counters:
        entries = doc.get("holders")
        assert isinstance(entries, list), doc
        assert doc["count"] == len(entries) == len(booked.get(doc["_id"], [])), doc
        assert sorted(entries) == sorted(booked.get(doc["_id"], [])), (doc, booked.get(doc["_id"]))
    assert set(booked) <= {doc["_id"] for doc in counters}, booked  # no held booking without its counter
    assert store.holders().count_documents({"state": {"$ne": "HELD"}}) == 0


def test_given_many_processes_creating_the_same_counter_at_once_then_none_is_falsely_busy():
    config.put_document("_vance", "_tenant", document_path("shared"),
                        "levels: {global: 100, tenant: 100, project: 100, user: 100}\nwaitMs: 0")
    start_at = time.time() + 3.0
    procs = [spawn([i, 3, start_at]) for i in range(WORKERS)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["busy"] for r in results) == 0
    assert sum(r["ok"] for r in results) == WORKERS * 3
    assert all(doc["count"] == 0 for doc in store.counters().find({}))
