"""Lease engine benchmark: MongoDB commands per operation, throughput, overhead vs raw pymongo.

Prints markdown tables. Run: ``python bench/bench_engine.py`` (embedded server unless
MONGODB_URI is set). Not a test: it asserts nothing, it measures.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _setup import CommandCounter, register_bench_handler, setup  # noqa: E402

LEVEL_SETS = [
    ["project"],
    ["project", "user"],
    ["tenant", "project", "user"],
    ["global", "tenant", "project", "user"],
]



def _define(name, levels, cap=1000):
    from leases import config
    from leases.definitions import document_path

    body = ", ".join(f"{level}: {cap}" for level in levels)
    config.put_document("_vance", "_tenant", document_path(name), f"levels: {{{body}}}\nttlSeconds: 60\nwaitMs: 5000")


def command_counts():
    import pymongo
    from django.conf import settings

    import leases
    from leases import invalidation, store

    listener = CommandCounter()
    client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[listener])
    store.set_client(client)
    invalidation.wait_listening()
    rows = []
    for levels in LEVEL_SETS:
        name = f"cmd{len(levels)}"
        _define(name, levels)
        request = leases.LeaseRequest(type="bench", lease=name, tenant_id="acme", project_id="p1", user_id="u1")
        leases.acquire(request).release()  # counters exist, definition cached
        listener.names.clear()
        lease = leases.acquire(request)
        acquire = len(listener.names)
        listener.names.clear()
        lease.check()
        check = len(listener.names)
        listener.names.clear()
        lease.release()
        release = len(listener.names)
        rows.append((len(levels), acquire, 2 * len(levels) + 2, check, release))
    store.set_client(None)
    client.close()
    print("### MongoDB commands per operation (uncontended, command monitoring)\n")
    print("| levels | acquire | target ≤ 2L+2 | check | release |")
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        print("| {} | {} | {} | {} | {} |".format(*row))
    print()


def _raw_cycle(db, levels, i):
    """The same commands the engine issues, back to back with pymongo, no engine logic."""
    from pymongo import ReturnDocument, UpdateOne

    token = f"raw-{os.getpid()}-{i}"
    h, c = db.resource_lease_holders, db.resource_lease_counters
    h.find_one_and_update({"_id": token}, [{"$set": {"resource": "raw", "levels": [], "acquiredAt": "$$NOW",
                                                           "expiresAt": {"$add": ["$$NOW", 60000]}}}],
                                upsert=True, projection={"acquiredAt": 1}, return_document=ReturnDocument.AFTER)
    keys = [f"raw|{level}|x" for level in levels]
    for n, key in enumerate(keys):
        c.update_one({"_id": key, "count": {"$lt": 10**9}}, {"$inc": {"count": 1}, "$currentDate": {"updatedAt": True}})
        update = {"$push": {"levels": key}}
        if n == len(keys) - 1:
            update["$set"] = {"state": "HELD"}
        h.update_one({"_id": token}, update)
    h.update_one({"_id": token}, [{"$set": {"lastSeenAt": "$$NOW", "expiresAt": {"$add": ["$$NOW", 60000]}}}])
    h.find_one_and_delete({"_id": token}, projection={"levels": 1})
    c.bulk_write([UpdateOne({"_id": k, "count": {"$gt": 0}}, {"$inc": {"count": -1}}) for k in keys], ordered=False)


def overhead(cycles=300):
    import leases
    from leases import store

    db = store.db()
    for key in ("raw|project|x", "raw|user|x", "raw|tenant|x", "raw|global|x"):
        db.resource_lease_counters.update_one({"_id": key}, {"$setOnInsert": {"count": 0}}, upsert=True)
    print("### Client-side overhead: engine vs the same commands raw (acquire+check+release)\n")
    print("| levels | engine ms/cycle | raw floor ms/cycle | ratio | target |")
    print("|---:|---:|---:|---:|---|")
    for levels in LEVEL_SETS:
        name = f"cmd{len(levels)}"
        request = leases.LeaseRequest(type="bench", lease=name, tenant_id="acme", project_id="p1", user_id="u1")
        engine_runs, raw_runs = [], []
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(cycles // 3):
                with leases.acquire(request) as lease:
                    lease.check()
            engine_runs.append((time.perf_counter() - t) / (cycles // 3))
            t = time.perf_counter()
            for i in range(cycles // 3):
                _raw_cycle(db, levels, i)
            raw_runs.append((time.perf_counter() - t) / (cycles // 3))
        e, r = statistics.median(engine_runs) * 1000, statistics.median(raw_runs) * 1000
        print(f"| {len(levels)} | {e:.2f} | {r:.2f} | {e / r:.2f}× | ≤ 1.3× |")
    print()


def _throughput_worker(args):
    seconds, start_at = args
    import django

    django.setup()
    import leases

    register_bench_handler()
    time.sleep(max(0, start_at - time.time()))
    done = busy = 0
    end = time.time() + seconds
    i = 0
    while time.time() < end:
        i += 1
        request = leases.LeaseRequest(type="bench", lease="tput", tenant_id="acme", project_id="p1",
                                      user_id=f"u{os.getpid()}-{i % 7}")
        try:
            with leases.acquire(request) as lease:
                lease.check()
            done += 1
        except leases.LeaseBusy:
            busy += 1
    return done, busy


def throughput(seconds=6.0, cap=2):
    from leases import config
    from leases.definitions import document_path

    config.put_document("_vance", "_tenant", document_path("tput"), f"levels: {{global: {cap}}}\nttlSeconds: 60\nwaitMs: 5000")
    print(f"### Acquisitions per second, N processes on one cap-{cap} resource (acquire+check+release)\n")
    print("| processes | acquisitions/s | busy (after 5 s wait) |")
    print("|---:|---:|---:|")
    ctx = multiprocessing.get_context("spawn")
    for n in (1, 2, 4, 8):
        with ctx.Pool(n) as pool:
            start_at = time.time() + 2.0
            results = pool.map(_throughput_worker, [(seconds, start_at)] * n)
        done = sum(r[0] for r in results)
        print(f"| {n} | {done / seconds:.0f} | {sum(r[1] for r in results)} |")
    print()


def main():
    setup("bench_engine")
    from leases import store

    store.client().drop_database(store.database_name())
    register_bench_handler()
    command_counts()
    overhead()
    throughput()


if __name__ == "__main__":
    main()
