"""Lease engine benchmark: MongoDB commands per operation, throughput, overhead vs raw pymongo.

Prints markdown tables. Run: ``python bench/bench_engine.py [--cycles 300] [--seconds 6]
[--processes 1,2,4,8]`` (embedded server unless MONGODB_URI is set). Not a test: it
measures; it exits 1 only when the command counts differ from what the engine states or the
raw floor does not send the engine's commands (then the overhead ratio means nothing).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import ReturnDocument, UpdateOne, monitoring

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _setup import register_bench_handler, setup  # noqa: E402

LEVEL_SETS = [
    ["project"],
    ["project", "user"],
    ["tenant", "project", "user"],
    ["global", "tenant", "project", "user"],
]
RAW_CAP = 1000

def _define(name, levels, cap=1000):
    from leases.definitions import layers as config
    from leases.definitions.model import document_path

    body = ", ".join(f"{level}: {cap}" for level in levels)
    config.put_document("_vance", "_tenant", document_path(name), f"levels: {{{body}}}\nttlSeconds: 60\nwaitMs: 5000")


class CommandRecorder(monitoring.CommandListener):
    """Every command a client sends, as its name and its *shape* (see :func:`shape`)."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name != "endSessions":  # client clean-up, not work
            self.commands.append((event.command_name, shape(event.command_name, event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def take(self) -> list[tuple[str, Any]]:
        taken, self.commands = self.commands, []
        return taken


# What a command *does*; session ids, cluster time and the database name are transport.
_COMMAND_FIELDS = {
    "findAndModify": ("query", "update", "fields", "upsert", "new", "remove", "sort", "arrayFilters"),
    "update": ("updates", "ordered"),
}


def shape(name: str, command: Mapping[str, Any]) -> Any:
    """A command with every value replaced by its type, operators and field names kept.

    Two commands of the same shape send the same filter and the same update to the same
    collection (only ids, tokens and numbers differ), so the raw floor can be compared with
    the engine command by command.
    """
    fields = _COMMAND_FIELDS.get(name)
    body = dict(command) if fields is None else {f: command[f] for f in fields if f in command}
    body = {k: v for k, v in body.items() if k not in ("lsid", "$clusterTime", "$db", "txnNumber")}
    return command.get(name), _normalise(body)


def _normalise(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _normalise(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_normalise(v) for v in value)
    if isinstance(value, str):
        return value if value.startswith("$") or value in ("PENDING", "HELD") else "<str>"
    if isinstance(value, bool):
        return value
    return f"<{type(value).__name__}>"


def expected_counts(levels: int) -> dict[str, int]:
    """What the engine states an uncontended cycle costs with ``levels`` capped levels.

    Acquire: the holder (PENDING, upsert), every level's conditional push in one ordered
    bulk, the holder HELD.
    Check: one renewal (``findAndModify``: it decides on the deadline it replaced). Release:
    the holder's delete, one bulk for the narrower levels (only when there are any), the
    gate's update (which returns the queue for the hand-off), the tombstone.
    """
    return {"acquire": 3, "check": 1, "release": 3 if levels == 1 else 4}


# Release: at most 2 for the holder and its slots plus the tombstone the protocol needs
# (a later renewal of the token answers EXPIRED, not STALE_LEASE).
BUDGET = {"acquire": lambda n: 2 * n + 1, "check": lambda n: 1, "release": lambda n: 4}


def command_counts() -> bool:
    """Print the commands per operation, measured with command monitoring, against what the
    engine states and its budget, and check the raw floor sends the same commands.

    Returns:
        True when every count is as stated and the raw floor replicates the engine.
    """
    import pymongo
    from django.conf import settings

    import leases
    from leases.definitions import invalidation
    from leases.store import client as store

    recorder = CommandRecorder()
    client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[recorder])
    store.set_client(client)
    invalidation.wait_listening()
    db = client[store.database_name()]
    _create_raw_counters(db)
    rows, all_ok = [], True
    for levels in LEVEL_SETS:
        n = len(levels)
        name = f"cmd{n}"
        _define(name, levels)
        request = leases.LeaseRequest(type="bench", lease=name, tenant_id="acme", project_id="p1", user_id="u1")
        leases.acquire(request).release()  # counters exist, definition cached
        recorder.take()
        engine: dict[str, list] = {}
        lease = leases.acquire(request)
        engine["acquire"] = recorder.take()
        lease.check()
        engine["check"] = recorder.take()
        lease.release()
        engine["release"] = recorder.take()
        raw = _raw_cycle(db, levels, 0, recorder=recorder)
        expected = expected_counts(n)
        as_stated = all(len(engine[op]) == expected[op] <= BUDGET[op](n) for op in expected)
        same = all(engine[op] == raw[op] for op in expected)
        for op in expected:
            diff = next(((i, e, r) for i, (e, r) in enumerate(zip(engine[op], raw[op])) if e != r), None)
            if diff is None and len(engine[op]) != len(raw[op]):
                diff = (min(len(engine[op]), len(raw[op])), engine[op][len(raw[op]):], raw[op][len(engine[op]):])
            if diff is not None:
                print(f"raw floor differs from the engine ({n} levels, {op}, command #{diff[0] + 1}):\n"
                      f"  engine {diff[1]}\n  raw    {diff[2]}", file=sys.stderr)
        all_ok = all_ok and as_stated and same
        rows.append((n, len(engine["acquire"]), expected["acquire"], BUDGET["acquire"](n), len(engine["check"]),
                     expected["check"], len(engine["release"]), expected["release"], BUDGET["release"](n),
                     "yes" if same else "**NO**", "yes" if as_stated else "**NO**"))
    store.set_client(None)
    client.close()
    print("### MongoDB commands per operation (uncontended, command monitoring)\n")
    print("Measured on the engine's own client; *stated* is what the engine documents (acquire 3,")
    print("check 1, release 3 for one level else 4 with the tombstone), *budget* the ceiling")
    print("(acquire ≤ 2L+1, release ≤ 4).")
    print("*raw = engine*: the raw floor below sends the same commands (same collection, filter and")
    print("update shape, in the same order).\n")
    print("| levels | acquire | stated | budget ≤ | check | stated | release | stated | budget ≤ "
          "| raw = engine | as stated |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print()
    return all_ok


def _raw_keys(levels: Sequence[str]) -> list[str]:
    from leases.definitions.model import CHECK_ORDER

    return [f"raw|{level}|x" for level in CHECK_ORDER if level in levels]  # narrow → wide, as the engine


def _create_raw_counters(db) -> None:
    for level in ("project", "user", "tenant", "global"):
        db.resource_lease_counters.update_one(
            {"_id": f"raw|{level}|x"},
            {"$setOnInsert": {"count": 0, "holders": [], "resource": "raw", "level": level, "scope": "x",
                              "tenantId": None, "cap": RAW_CAP}},
            upsert=True)


def _raw_cycle(db, levels: Sequence[str], i: int, *, recorder: CommandRecorder | None = None):
    """The engine's commands for acquire, check and release, back to back with pymongo and
    no engine logic: the same filters and updates as ``slots.take``, the holder's PENDING
    and HELD ``findAndModify``, and the release's delete, narrow-level bulk and gate update.

    Returns:
        With ``recorder``: the commands of each operation, ``{"acquire": [...], ...}``.

    Raises:
        RuntimeError: a command did not match (the floor would not be doing the work).
    """
    token = f"raw-{os.getpid()}-{i}"
    booking = f"acme/p1/u1/{token}"
    keys = _raw_keys(levels)
    ttl_ms = 60 * 1000
    h, c = db.resource_lease_holders, db.resource_lease_counters
    from leases.queue.estimates import HOLDS_KEPT

    out: dict[str, list] = {}
    started = time.monotonic()
    # acquire: the holder first (PENDING, with the keys it sets out to book) ...
    h.find_one_and_update(
        {"_id": token},
        [{"$set": {
            "state": "PENDING", "resource": {"$literal": "raw"}, "leaseName": {"$literal": "raw"},
            "type": {"$literal": "bench"}, "tenantId": {"$literal": "acme"}, "projectId": {"$literal": "p1"},
            "userId": {"$literal": "u1"}, "holderRef": {"$literal": "raw"}, "priority": {"$literal": None},
            "pod": {"$literal": "bench"}, "podBound": {"$literal": False}, "ttlSeconds": {"$literal": 60},
            "intervalSeconds": {"$literal": 20}, "keys": {"$literal": keys},
            "levels": {"$literal": []}, "payload": {"$literal": {}}, "acquiredAt": "$$NOW",
            "lastSeenAt": "$$NOW", "expiresAt": {"$add": ["$$NOW", ttl_ms]},
        }}],
        upsert=True, projection={"acquiredAt": 1}, return_document=ReturnDocument.AFTER)
    # ... every level's conditional push, narrow → wide, in one ordered bulk of upserts (the
    # gate: only while nobody queues) ...
    # (Each push also fits under the lease's cap stamp unless its view is newer; then each
    # level's cap is set by that view, leases.definitions.caps.)
    ops = []
    newer_than = datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=61)
    stamp = f"capStamps.cmd{len(keys)}"  # the stamp field of the engine's lease of as many levels
    fresh = {f"{stamp}.at": {"$not": {"$gte": newer_than}}}
    # The gate's push also proposes and records the grant's fence (leases.queue.fences): slot 0 is
    # free (the floor is alone), its generation above the last one (microseconds).
    generation = time.time_ns() // 1000
    for n, key in enumerate(keys):
        query: dict[str, Any] = {"_id": key, "count": {"$lt": RAW_CAP}, "holders": {"$ne": booking, "$exists": True}}
        if n == len(keys) - 1:
            query["queue.0"] = {"$exists": False}
        query["$and"] = [{"$or": [fresh, {"$expr": {"$lt": ["$count", f"${stamp}.cap"]}}]}]
        update: dict[str, Any] = {"$push": {"holders": booking}, "$inc": {"count": 1},
                                  "$currentDate": {"updatedAt": True},
                                  "$setOnInsert": {"resource": "raw", "level": key.split("|")[1], "scope": "x",
                                                   "tenantId": None if key.startswith("raw|global")
                                                   else "acme", "cap": RAW_CAP}}
        if n == len(keys) - 1:
            query["$and"].append({"$expr": {"$and": [
                {"$not": [{"$in": [{"$ifNull": ["$fence.s0.e", None]}, {"$ifNull": ["$holders", []]}]}]},
                {"$lt": [{"$ifNull": ["$fence.s0.g", 0]}, generation]}]}})
            update["$set"] = {"fence.s0": {"e": booking, "g": generation}}
        ops.append(UpdateOne(query, update, upsert=True))
    ops.extend(UpdateOne({"_id": key, "cap": {"$ne": RAW_CAP}, **fresh}, {"$set": {"cap": RAW_CAP}}) for key in keys)
    result = c.bulk_write(ops, ordered=True)
    if result.matched_count + result.upserted_count != len(keys):
        raise RuntimeError("raw floor: a level was not booked")
    # ... then HELD.
    held = h.find_one_and_update(
        {"_id": token},
        [{"$set": {"state": "HELD", "levels": {"$literal": keys}, "lastSeenAt": "$$NOW", "heldAt": "$$NOW",
                   "expiresAt": {"$add": ["$$NOW", ttl_ms]}, "fence": {"$literal": f"1.raw.0.{generation}"}}}],
        projection={"expiresAt": 1, "acquiredAt": 1, "lastSeenAt": 1, "intervalSeconds": 1, "fence": 1},
        return_document=ReturnDocument.AFTER)
    if held is None:
        raise RuntimeError("raw floor: holder vanished")
    if recorder is not None:
        out["acquire"] = recorder.take()
    # check: the renewal writes now + ttl and keeps the deadline it replaced, in one command
    # returning the document (the engine decides on those two server times).
    ttl_expr = {"$multiply": [{"$ifNull": ["$ttlSeconds", 0]}, 1000]}
    renewed = h.find_one_and_update(
        {"_id": token, "tenantId": "acme", "projectId": "p1", "state": "HELD"},
        [{"$set": {"priorExpiresAt": "$expiresAt", "lastSeenAt": "$$NOW", "expiresAt": {"$add": ["$$NOW", ttl_expr]}}}],
        projection={"resource": 1, "leaseName": 1, "type": 1, "ttlSeconds": 1, "expiresAt": 1, "lastSeenAt": 1,
                    "intervalSeconds": 1, "priorExpiresAt": 1, "fence": 1},
        return_document=ReturnDocument.AFTER)
    if renewed is None:
        raise RuntimeError("raw floor: check missed")
    if recorder is not None:
        out["check"] = recorder.take()
    # release: pull the entry from the narrower levels in one bulk, then from the gate with
    # findAndModify (the engine hands the slot on from what it returns), then delete the
    # holder (a plain delete: the owner knows what the release needs of the document).
    pull = {"$pull": {"holders": booking}, "$inc": {"count": -1}, "$currentDate": {"updatedAt": True, "clock": True}}
    *narrow, gate = keys
    if narrow:
        c.bulk_write([UpdateOne({"_id": key, "holders": booking}, pull) for key in narrow], ordered=False)
    # The gate also records the hold's duration (wait estimates) in the same update.
    hold = {"$push": {"holds": {"$each": [round((time.monotonic() - started) * 1000, 1)], "$slice": -HOLDS_KEPT}}}
    if c.find_one_and_update({"_id": gate, "holders": booking}, {**pull, **hold},
                             return_document=ReturnDocument.AFTER) is None:
        raise RuntimeError("raw floor: gate entry missing")
    if not h.delete_one({"_id": token, "tenantId": "acme", "projectId": "p1"}).deleted_count:
        raise RuntimeError("raw floor: holder missing at release")
    # ... and the tombstone: a later renewal of the token answers EXPIRED (release).
    db.lease_tombstones.update_one(
        {"_id": token}, [{"$set": {"tenantId": {"$literal": "acme"}, "projectId": {"$literal": "p1"},
                                   "reason": {"$literal": "release"}, "resource": {"$literal": "raw"}, "at": "$$NOW"}}],
        upsert=True)
    if recorder is not None:
        out["release"] = recorder.take()
    return out


def overhead(cycles=300):
    import leases
    from leases.store import client as store

    db = store.db()
    _create_raw_counters(db)
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


def throughput(seconds=6.0, cap=2, processes=(1, 2, 4, 8)):
    from leases.definitions import layers as config
    from leases.definitions.model import document_path

    config.put_document("_vance", "_tenant", document_path("tput"), f"levels: {{global: {cap}}}\nttlSeconds: 60\nwaitMs: 5000")
    print(f"### Acquisitions per second, N processes on one cap-{cap} resource (acquire+check+release)\n")
    print("| processes | acquisitions/s | busy (after 5 s wait) |")
    print("|---:|---:|---:|")
    ctx = multiprocessing.get_context("spawn")
    for n in processes:
        with ctx.Pool(n) as pool:
            start_at = time.time() + 2.0
            results = pool.map(_throughput_worker, [(seconds, start_at)] * n)
        done = sum(r[0] for r in results)
        print(f"| {n} | {done / seconds:.0f} | {sum(r[1] for r in results)} |")
    print()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300, help="cycles per level set for the overhead table")
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds per throughput row")
    parser.add_argument("--processes", default="1,2,4,8", help="throughput rows (comma-separated); empty: none")
    args = parser.parse_args(argv)
    setup("bench_engine")
    from leases.store import client as store

    store.client().drop_database(store.database_name())
    register_bench_handler()
    ok = command_counts()
    overhead(cycles=max(3, args.cycles))
    processes = tuple(int(n) for n in args.processes.split(",") if n.strip())
    if processes:
        throughput(seconds=args.seconds, processes=processes)
    if not ok:
        print("command counts differ from what the engine states, or the raw floor does not send the "
              "engine's commands (details on stderr): the overhead ratio above is not comparable", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
