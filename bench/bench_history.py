"""History benchmark: what recording costs an acquisition, what a flush costs, and what the
History page's read costs for a full day of minutes.

Prints markdown tables. Run: ``python bench/bench_history.py`` (embedded server unless
MONGODB_URI is set). Not a test: it measures, it asserts nothing. Commands are counted with
pymongo command monitoring on the engine's own client.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _setup import CommandCounter, register_bench_handler, setup  # noqa: E402


def main() -> None:
    os.environ["LEASES_HISTORY_FLUSH_SECONDS"] = "0"  # flushes are timed explicitly below
    setup("bench_history")
    import pymongo
    from django.conf import settings

    import leases
    from leases.definitions import layers as config
    from leases.definitions.model import TENANT_PROJECT, document_path
    from leases.ops import history as history_query
    from leases.store import client as store
    from leases.telemetry import history

    register_bench_handler()
    counter = CommandCounter()
    client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[counter], tz_aware=False)
    store.set_client(client)
    store.db()[history.COLLECTION].delete_many({})
    config.put_document("_vance", TENANT_PROJECT, document_path("hbench"), "levels: {tenant: 1000}\nttlSeconds: 60")

    # 1. The hook itself: an in-memory update under a lock.
    agg = history.Aggregator()
    n = 200_000
    started = time.perf_counter()
    for _ in range(n):
        agg.grant("hbench", "t1")
    hook_us = (time.perf_counter() - started) / n * 1e6

    # 2. Commands of an uncontended acquire+release with the hooks in place.
    def cycle(user):
        leases.acquire(leases.LeaseRequest(type="bench", lease="hbench", tenant_id="t1", project_id="p1",
                                           user_id=user, pod="")).release()

    cycle("warm")
    history.flush()
    counter.names.clear()
    cycles = 200
    for i in range(cycles):
        cycle(f"u{i % 20}")
    per_cycle = len(counter.names) / cycles
    counter.names.clear()
    started = time.perf_counter()
    history.flush()
    flush_after_cycles_ms = (time.perf_counter() - started) * 1000
    flush_commands = len(counter.names)

    # 3. Flushes of many cells (tenants x resources in one period).
    rows = []
    for cells in (10, 100, 1000):
        for c in range(cells):
            history.recorder.aggregator.grant(f"r{c % 10}", f"t{c}")
        counter.names.clear()
        started = time.perf_counter()
        history.flush()
        rows.append((cells, len(counter.names), (time.perf_counter() - started) * 1000))

    # 4. The page's read: one resource, one tenant, 24 h of minutes.
    now = store.server_now()
    coll = store.db()[history.COLLECTION]
    coll.delete_many({})
    coll.insert_many([{"_id": f"day-{m}", "resource": "day", "tenantId": "t1",
                       "minute": (now - timedelta(minutes=m)).replace(second=0, microsecond=0),
                       "grants": 5, "busy": 1, "waits": 2, "waitBuckets": {"3": 1, "6": 1}, "waitMaxMs": 420.0,
                       "peak": 3, "reaps": {"idle": 1}} for m in range(1440)])
    counter.names.clear()
    started = time.perf_counter()
    data = history_query.query("day", tenant_id="t1", since=timedelta(hours=24))
    read_ms = (time.perf_counter() - started) * 1000
    read_commands = len(counter.names)

    print("| measure | value |\n|---|---:|")
    print(f"| hook (Aggregator.grant), µs per call | {hook_us:.2f} |")
    print(f"| commands per uncontended acquire+release (hooks on) | {per_cycle:.2f} |")
    print(f"| flush after {cycles} cycles: commands / ms | {flush_commands} / {flush_after_cycles_ms:.1f} |")
    print(f"| read 24 h (1,440 minutes) of one tenant: commands / ms | {read_commands} / {read_ms:.1f} (rows {len(data.rows)}) |")
    print()
    print("| cells in one flush | commands | ms |\n|---:|---:|---:|")
    for cells, commands, ms in rows:
        print(f"| {cells} | {commands} | {ms:.1f} |")
    store.set_client(None)
    client.close()


if __name__ == "__main__":
    main()
