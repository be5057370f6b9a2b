"""Chaos benchmark: random ``kill -9`` under traffic, and the slots it leaves booked by nobody.

Ten OS processes in three tenants loop acquire → hold ~100 ms → release on one lease with
``levels: {global: 2, tenant: 1}``, ``waitMs: 20000``, ``ttlSeconds: 2``, while the bench
sends SIGKILL to a random one every 0.4–0.8 s and respawns it. No beat sweep runs; only the
engine's own paths (the lazy reap an acquire does on a full level, and whatever else the
engine does inline) can give a slot back during the run.

A sampler in the parent reads the counters and the holders every ~50 ms and computes, per
counter key, the slots booked by no holder document: ``max(0, count − booked)``. A counter
that lists its holders (a ``holders`` array, entries ending in ``/<holder _id>``) books the
entries whose holder document (or waiting ticket) exists; otherwise a holder books a key
when the key is in its ``levels``. The counters are read before and after the holders and
the smaller count is used, and a reading must repeat in two samples in a row to count as a
leak, so a live process between two of its commands is not taken for one.

Reported per run: kills, grants, the highest occupancy seen per level vs its cap (it must
never exceed), slots leaked at the end, the longest time a slot stayed booked by no holder,
slot-seconds lost (total and per kill); then ``leases.upkeep.sweeps.reconcile(safety_ms=0)`` (what
``manage.py lease reconcile --safety-ms 0`` runs) and what it corrected.

Run: ``python bench/bench_chaos.py [--seconds 60] [--runs N]`` (embedded server unless
MONGODB_URI is set). Not a test: it measures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _setup import register_bench_handler, setup  # noqa: E402

if __name__ != "__main__" and os.environ.get("DJANGO_SETTINGS_MODULE") and os.environ.get("MONGODB_URI"):
    # Imported by the forkserver (preload) and by its children: Django starts once in the
    # forkserver, so a respawn after each kill costs a fork, not a fresh interpreter (1-3 s
    # of CPU on a busy machine, which would otherwise starve the processes being measured).
    import django

    django.setup()

LEASE = "chaos"
WAITERS = "resource_lease_waiters"  # the waiting queue's collection, once the engine has one
LEVELS = {"global": 2, "tenant": 1}
TTL_SECONDS = 2
WAIT_MS = 20000
HOLD_S = (0.08, 0.12)
TENANTS = ["t1"] * 4 + ["t2"] * 3 + ["t3"] * 3
KILL_EVERY_S = (0.4, 0.8)
SAMPLE_EVERY_S = 0.05
MIN_RUN = 2  # consecutive samples before a count above its holders is a leak, not a step
READY_TIMEOUT_S = 120.0


# --- children -------------------------------------------------------------------------------


def _child(index, tenant, grants, busy, ready, stop):
    import django

    django.setup()
    import leases
    from leases.definitions import invalidation

    register_bench_handler()
    invalidation.wait_listening()  # a long-running process: definitions come from its cache
    request = leases.LeaseRequest(type="bench", lease=LEASE, tenant_id=tenant, project_id="p1",
                                  user_id=f"u{index}")
    ready[index] = 1
    while not stop.value:
        try:
            lease = leases.acquire(request)
        except leases.LeaseBusy:
            busy[index] += 1
            continue
        except leases.LeaseUnavailable:
            time.sleep(0.05)
            continue
        grants[index] += 1  # one writer per index: the parent respawns only after the kill
        time.sleep(random.uniform(*HOLD_S))
        lease.release()


# --- the sampler ----------------------------------------------------------------------------


def _holder_token(entry) -> str | None:
    """The holder ``_id`` an entry of a counter's ``holders`` array names (its last ``/`` part)."""
    if isinstance(entry, str):
        return entry.rsplit("/", 1)[-1]
    if isinstance(entry, dict):  # tolerate a sub-document entry
        for name in ("token", "holder", "_id", "id"):
            if isinstance(entry.get(name), str):
                return entry[name].rsplit("/", 1)[-1]
    return None


def _count(doc) -> int:
    if "count" in doc:
        return int(doc.get("count") or 0)
    return len(doc.get("holders") or ())


def take_sample(db) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """One reading: ``({key: count}, {key: highest count}, {key: booked})`` for the lease.

    Counters, then holders, then counters again, taking the smaller count: the engine books
    a counter before the holder records it and frees the holder before the counter, so a
    count higher than its holders in both readings is not a step in progress.
    """
    prefix = {"_id": {"$regex": f"^{LEASE}\\|"}}
    first = {d["_id"]: d for d in db.resource_lease_counters.find(prefix)}
    holders = list(db.resource_lease_holders.find({"resource": LEASE}, {"levels": 1, "keys": 1}))
    second = {d["_id"]: d for d in db.resource_lease_counters.find(prefix)}
    live = {h["_id"] for h in holders}
    # A waiting ticket may keep the narrower levels it already took (a design the waiting
    # queue is free to choose): an entry naming a live ticket is booked too.
    live.update(d["_id"] for d in db[WAITERS].find({}, {"_id": 1}))
    by_levels: dict[str, int] = defaultdict(int)
    for h in holders:
        for key in h.get("levels") or ():
            by_levels[key] += 1
    counts: dict[str, int] = {}
    highest: dict[str, int] = {}  # for the cap check: any reading above the cap counts
    booked: dict[str, int] = {}
    for key in set(first) | set(second):
        docs = [d for d in (first.get(key), second.get(key)) if d is not None]
        counts[key] = min(_count(d) for d in docs) if len(docs) == 2 else 0
        highest[key] = max(_count(d) for d in docs)
        latest = docs[-1]
        if isinstance(latest.get("holders"), list):
            booked[key] = sum(1 for e in latest["holders"] if _holder_token(e) in live)
        else:
            booked[key] = by_levels.get(key, 0)
    return counts, highest, booked


@dataclass
class _Run:
    start: float
    leaked_samples: int = 0
    lost: float = 0.0  # slot-seconds so far
    last: int = 0  # the last non-zero reading
    clean: int = 0  # consecutive clean samples since
    clean_at: float = 0.0
    lost_at_clean: float = 0.0


@dataclass
class Tracker:
    """Leak accounting over consecutive samples.

    A leak is a key whose count exceeds its booked holders in at least ``MIN_RUN`` samples in
    a row (≥ ~50 ms); it ends at the first of ``MIN_RUN`` clean samples in a row. One-sample
    readings are counted apart as blips: a live process between two of its commands
    (rollback: holder deleted, counter not yet decremented) looks the same for a few
    milliseconds, while a slot lost to a crash stays lost far longer. A single clean sample
    inside a leak does not end it: an acquire landing between the sampler's reads can hide
    a leaked slot for one sample.
    """

    max_count: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # per level
    max_booked: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # per level
    slot_seconds: float = 0.0
    longest: float = 0.0
    longest_key: str = ""
    blips: int = 0
    samples: int = 0
    last_t: float | None = None
    runs: dict[str, _Run] = field(default_factory=dict)

    def add(self, t: float, counts: dict[str, int], highest: dict[str, int], booked: dict[str, int]) -> None:
        self.samples += 1
        leaked = {}
        for key, count in counts.items():
            level = key.split("|")[1] if key.count("|") >= 2 else "?"
            self.max_count[level] = max(self.max_count[level], highest.get(key, count))
            self.max_booked[level] = max(self.max_booked[level], booked.get(key, 0))
            leaked[key] = max(0, count - booked.get(key, 0))
        dt = 0.0 if self.last_t is None else t - self.last_t
        for run in self.runs.values():
            run.lost += run.last * dt  # the reading at the previous sample held until now
        for key in set(leaked) | set(self.runs):
            n = leaked.get(key, 0)
            run = self.runs.get(key)
            if n > 0:
                if run is None:
                    run = self.runs[key] = _Run(start=t)
                run.leaked_samples += 1
                run.last, run.clean = n, 0
            elif run is not None:
                if run.leaked_samples < MIN_RUN:
                    del self.runs[key]
                    self.blips += 1
                    continue
                if run.clean == 0:
                    run.clean_at, run.lost_at_clean = t, run.lost
                run.clean += 1
                if run.clean >= MIN_RUN:
                    self._close(key, run.clean_at, run.lost_at_clean)
        self.last_t = t

    def _close(self, key: str, end: float, lost: float) -> None:
        run = self.runs.pop(key)
        self.slot_seconds += lost
        if end - run.start > self.longest:
            self.longest, self.longest_key = end - run.start, key

    def finish(self) -> dict[str, int]:
        """Close the open leaks at the last sample; returns the slots leaked at that moment."""
        open_leaks = {}
        for key, run in list(self.runs.items()):
            if run.leaked_samples < MIN_RUN:
                del self.runs[key]
                continue
            open_leaks[key] = run.last
            if run.clean:
                self._close(key, run.clean_at, run.lost_at_clean)
            else:
                self._close(key, self.last_t, run.lost)
        return open_leaks


def _sampler(db, tracker: Tracker, done: threading.Event) -> None:
    while not done.is_set():
        began = time.monotonic()
        try:
            tracker.add(time.monotonic(), *take_sample(db))
        except Exception as exc:  # noqa: BLE001 - a lost sample is reported, not fatal
            print(f"sampler: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        done.wait(max(0.0, SAMPLE_EVERY_S - (time.monotonic() - began)))


# --- one run --------------------------------------------------------------------------------


@dataclass
class RunResult:
    kills: int = 0
    grants: int = 0
    busy: int = 0
    tracker: Tracker = field(default_factory=Tracker)
    leaked_end: dict[str, int] = field(default_factory=dict)
    leaked_rest: dict[str, int] = field(default_factory=dict)
    stragglers: int = 0
    reconciled: int = 0  # reconcile's own figure: counters it updated or deleted
    returned: dict[str, int] = field(default_factory=dict)  # slots it took off each counter
    leaked_after: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    ready_s: float = 0.0
    quiesce_s: float = 0.0


def define() -> None:
    from leases.definitions import layers as config
    from leases.definitions.model import document_path

    body = ", ".join(f"{level}: {cap}" for level, cap in LEVELS.items())
    config.put_document("_vance", "_tenant", document_path(LEASE),
                        f"levels: {{{body}}}\nttlSeconds: {TTL_SECONDS}\nwaitMs: {WAIT_MS}")


def _leaked(db) -> dict[str, int]:
    counts, _, booked = take_sample(db)
    return {k: c - booked.get(k, 0) for k, c in counts.items() if c > booked.get(k, 0)}


def _counts(db) -> dict[str, int]:
    return {d["_id"]: _count(d) for d in db.resource_lease_counters.find({"_id": {"$regex": f"^{LEASE}\\|"}})}


def one_run(ctx, seconds: float) -> RunResult:
    from leases.store import client as store
    from leases.upkeep import sweeps

    db = store.db()
    db.resource_lease_holders.delete_many({"resource": LEASE})
    db.resource_lease_counters.delete_many({"_id": {"$regex": f"^{LEASE}\\|"}})
    n = len(TENANTS)
    grants, busy, ready = ctx.RawArray("q", n), ctx.RawArray("q", n), ctx.RawArray("b", n)
    stop = ctx.RawValue("b", 0)

    def spawn(i):
        ready[i] = 0
        proc = ctx.Process(target=_child, args=(i, TENANTS[i], grants, busy, ready, stop), daemon=True)
        proc.start()
        return proc

    procs = [spawn(i) for i in range(n)]
    result = RunResult()
    spawned = time.monotonic()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(ready) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not all(ready):
            raise RuntimeError("children did not start in time")
        result.ready_s = time.monotonic() - spawned
        done = threading.Event()
        tracker = result.tracker
        sampler = threading.Thread(target=_sampler, args=(db, tracker, done), daemon=True)
        grants_before = sum(grants)
        busy_before = sum(busy)
        started = time.monotonic()
        sampler.start()
        end = started + seconds
        next_kill = started + random.uniform(*KILL_EVERY_S)
        while time.monotonic() < end:
            time.sleep(max(0.0, min(next_kill, end) - time.monotonic()))
            if time.monotonic() >= end:
                break
            next_kill = time.monotonic() + random.uniform(*KILL_EVERY_S)
            candidates = [i for i in range(n) if ready[i]]
            if not candidates:
                continue
            victim = random.choice(candidates)
            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].join(timeout=10)
            result.kills += 1
            procs[victim] = spawn(victim)
        result.seconds = time.monotonic() - started
        result.grants = sum(grants) - grants_before
        result.busy = sum(busy) - busy_before
        done.set()
        sampler.join(timeout=10)
        result.leaked_end = tracker.finish()
        # Quiesce: every child finishes its cycle (a waiter may wait up to waitMs).
        stop.value = 1
        quiesce = time.monotonic()
        for proc in procs:
            proc.join(timeout=max(0.1, quiesce + WAIT_MS / 1000 + 5 - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                result.stragglers += 1
                proc.kill()
                proc.join(timeout=5)
        result.quiesce_s = time.monotonic() - quiesce
        result.leaked_rest = _leaked(db)
        before = _counts(db)
        while True:
            corrected, more = sweeps.reconcile(safety_ms=0)
            result.reconciled += corrected
            if not more:
                break
        after = _counts(db)
        result.returned = {k: n - after.get(k, 0) for k, n in before.items() if n > after.get(k, 0)}
        result.leaked_after = _leaked(db)
        return result
    finally:
        stop.value = 1
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)


# --- output ---------------------------------------------------------------------------------


def _keys(leaks: dict[str, int]) -> str:
    if not leaks:
        return "0"
    total = sum(leaks.values())
    return f"{total} (" + ", ".join(f"{k.split('|', 1)[1]}: {v}" for k, v in sorted(leaks.items())) + ")"


def _occupancy(r: RunResult) -> str:
    parts = []
    for level, cap in LEVELS.items():
        seen = max(r.tracker.max_count.get(level, 0), r.tracker.max_booked.get(level, 0))
        flag = "" if seen <= cap else " **OVER CAP**"
        parts.append(f"{level} {seen}/{cap}{flag}")
    return ", ".join(parts)


def print_results(results: list[RunResult]) -> None:
    print("| run | kills | grants | LeaseBusy | max occupancy seen / cap | leaked at end | longest booked by no holder (s) "
          "| slot-seconds lost | per kill | leaked at rest | reconcile: slots returned (counters written) | leaked after |")
    print("|---|---:|---:|---:|---|---|---:|---:|---:|---|---:|---|")
    for i, r in enumerate(results, 1):
        t = r.tracker
        per_kill = t.slot_seconds / r.kills if r.kills else 0.0
        print(f"| {i} | {r.kills} | {r.grants} | {r.busy} | {_occupancy(r)} | {_keys(r.leaked_end)} "
              f"| {t.longest:.2f} | {t.slot_seconds:.1f} | {per_kill:.2f} | {_keys(r.leaked_rest)} "
              f"| {_keys(r.returned)} ({r.reconciled}) | {_keys(r.leaked_after)} |")
    if len(results) > 1:
        worst_occ = max(results, key=lambda r: max(max(r.tracker.max_count.values(), default=0),
                                                   max(r.tracker.max_booked.values(), default=0)))
        worst_end = max(results, key=lambda r: sum(r.leaked_end.values()))
        longest = max(r.tracker.longest for r in results)
        lost = max(results, key=lambda r: r.tracker.slot_seconds)
        per_kill = max((r.tracker.slot_seconds / r.kills if r.kills else 0.0) for r in results)
        rest = max(results, key=lambda r: sum(r.leaked_rest.values()))
        print(f"| worst | {min(r.kills for r in results)}–{max(r.kills for r in results)} "
              f"| {min(r.grants for r in results)} (min) | {max(r.busy for r in results)} | {_occupancy(worst_occ)} "
              f"| {_keys(worst_end.leaked_end)} | {longest:.2f} | {lost.tracker.slot_seconds:.1f} | {per_kill:.2f} "
              f"| {_keys(rest.leaked_rest)} | {_keys(max(results, key=lambda r: sum(r.returned.values())).returned)} "
              f"({max(r.reconciled for r in results)}) "
              f"| {_keys(max(results, key=lambda r: sum(r.leaked_after.values())).leaked_after)} |")
    print()
    leaky = sum(1 for r in results if r.leaked_end or r.leaked_rest)
    print(f"{leaky} of {len(results)} runs ended with slots booked by no holder.")
    for i, r in enumerate(results, 1):
        t = r.tracker
        extra = f"; longest on {t.longest_key}" if t.longest_key else ""
        print(f"- run {i}: {t.samples} samples over {r.seconds:.1f} s, {t.blips} one-sample blips "
              f"(not counted){extra}; children ready after {r.ready_s:.1f} s, stopped in {r.quiesce_s:.1f} s"
              + (f"; {r.stragglers} children still waiting at stop were killed" if r.stragglers else ""))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="chaos window per run")
    parser.add_argument("--runs", type=int, default=1, help="repeat, report each run and the worst")
    args = parser.parse_args()
    if args.runs < 1 or args.seconds <= 0:
        parser.error("--runs must be ≥ 1 and --seconds > 0")

    setup("bench_chaos")
    from leases.store import client as store

    store.client().drop_database(store.database_name())
    register_bench_handler()
    define()
    ctx = multiprocessing.get_context("forkserver")
    # By module name, found through PYTHONPATH: Python 3.11's forkserver ignores both the main
    # path and the parent's sys.path it is handed, so "__main__" would silently not preload.
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    ctx.set_forkserver_preload([os.path.splitext(os.path.basename(__file__))[0]])
    print(f"### Chaos: {len(TENANTS)} processes (tenants 4/3/3), levels {LEVELS}, ttlSeconds {TTL_SECONDS}, "
          f"waitMs {WAIT_MS}, hold {HOLD_S[0] * 1000:.0f}–{HOLD_S[1] * 1000:.0f} ms, kill -9 every "
          f"{KILL_EVERY_S[0]}–{KILL_EVERY_S[1]} s, {args.seconds:g} s per run, no beat sweep, "
          f"sampled every {SAMPLE_EVERY_S * 1000:.0f} ms; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at start\n")
    results = []
    for _ in range(args.runs):
        results.append(one_run(ctx, args.seconds))
        sys.stdout.flush()
    print_results(results)


if __name__ == "__main__":
    main()
