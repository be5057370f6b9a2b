"""Contention benchmark: many OS processes waiting on one small cap, beside kazoo's Semaphore.

Loads (each ``--seconds`` long, one common measurement window per load):

* A: 12 processes in 3 tenants (4 each) on ``levels: {global: 2}``, ``waitMs: 60000``; run
  once per hold of ``--holds`` (default 100 ms; issue 21's table: ``--holds 100,50,20,10``);
* B: unequal demand on the same kind of lease: tenant ``ta`` 9 processes, ``tb`` 3;
* C: a 4-level lease (``global: 4, tenant: 2, project: 2, user: 1``) with processes spread
  so that each level is the binding one some of the time.

B, C and the who-goes-next loads hold 100 ms.

Who goes next (``--loads shares`` runs all five; global cap 2 each):

* E: equal shares, 2 tenants × 6 processes: the baseline of W (commands per grant) and the
  wait estimates at steady state;
* W: the same processes with ``shares: {tenants: {t1: 3, t2: 1}}`` (target 75 / 25 %);
* P: project weights 2 : 1 inside tenant ``ta`` beside an equal tenant ``tb`` (33 / 17 / 50 %);
* I: 8 batch processes looping, 1 interactive process arriving every 0.5 s (its p99 wait);
* S: 4 interactive + 4 batch processes looping, ``maxStarvationMs: 2000`` (every batch process
  is granted, its longest wait).

Every process connects and warms up first, reports ready, and then all begin at one start
time the parent hands out and stop at start + seconds; grants outside that window are not
counted. Each process counts its own MongoDB commands (pymongo command monitoring) inside
the window only, each with the time it was started (the clock of the grants and releases),
so that every hand-off (a release call paired with the next acquire return on the resource,
keeping which process released and which was granted) also counts the store commands on its
critical path: the releaser's inside its release call, plus the granted process's between the
release call and its acquire's return. When a ZooKeeper server can be started, loads A (at
every hold) and B also run on ``kazoo.recipe.lock.Semaphore`` in the same run, side by side.
The kazoo side needs ``pip install -e ".[bench]"`` (kazoo) and ``apt-get install zookeeper``
(Debian; the bench starts ``/usr/share/java/zookeeper.jar`` itself on a free port, or the jar
named by ``ZK_CLASSPATH``) and java; without them the kazoo column says why it is missing.
The CPU time each server process (the embedded server this bench started, ZooKeeper's JVM)
used inside the window is read from ``/proc`` at its start and end: short holds are bound by
the server, and this shows how busy it was and what a grant cost it ("—" with MONGODB_URI);
the clients' CPU in the window is beside it. The header gives the server's speed at the start
(a fixed cycle of four writes by one client, wall and server CPU): the same 2-core machine has
run twice as slow in one hour as in the hour before, so compare tables only with the same
speed beside them.

Prints markdown tables, and with load A a summary across holds at the end. Run:
``python bench/bench_contention.py [--loads A,B,C | shares] [--holds 100,50,20,10]
[--seconds 30] [--no-zk]`` (embedded server unless MONGODB_URI is set). Not a test: it
asserts nothing, it measures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _setup  # noqa: E402
from _common import CpuSampler, ZooKeeper, calibration, jain, percentile, spawn_clients  # noqa: E402
from _setup import CommandCounter, register_bench_handler, setup  # noqa: E402

HOLD_S = 0.1  # loads B, C and the who-goes-next loads; load A: each of --holds
WAIT_MS = 60000
READY_TIMEOUT_S = 180.0
START_DELAY_S = 0.5  # between "everyone is ready" and the window: the start time reaches all
DRAIN_TIMEOUT_S = 120.0  # after the window: the last waiters still have to get (and return) a slot
LEVEL_ORDER = ("global", "tenant", "project", "user")

# Targets (embedded server; issue 21 for utilisation, p99, hand-off and commands).
T_UTILISATION = 0.95  # at hold 100 ms; at every hold also at least kazoo's in the same run
T_P99_RATIO = 1.15  # × the FIFO ideal, at hold 100 ms
T_MAX_RATIO = 2.0
T_JAIN = 0.99
T_SMALL_SHARE = (45.0, 55.0)
T_EXTRA_COMMANDS = 4  # loads B and C: commands per grant ≤ uncontended acquire+release + 4
T_COMMANDS_PER_GRANT_A = 8.4  # load A: no higher than before direct hand-off (issue 21)
T_HANDOFF_P50_MS = 6.0
T_CRITICAL_COMMANDS = 2  # store commands between the release call and the next holder's return
T_SHARE_UTILISATION = 0.90  # loads W and I (who goes next)


@dataclass(frozen=True)
class Load:
    name: str
    title: str
    levels: dict[str, int]
    procs: list[tuple[str, str, str]]  # (tenant, project, user) per process
    zk: bool  # also run on kazoo's Semaphore (single cap: the global one)
    small_tenant: str | None = None  # the tenant whose share the 9 : 3 target is about
    extra_yaml: str = ""  # more definition fields (shares, priorities, maxStarvationMs)
    classes: tuple[str | None, ...] = ()  # priority class per process (None: the default)
    pace: tuple[float | None, ...] = ()  # seconds between arrivals per process (None: loop)


def _load_a() -> Load:
    procs = [(f"t{t}", "p1", f"u{t}{i}") for t in (1, 2, 3) for i in range(4)]
    return Load("A", "12 processes, 3 tenants × 4, global cap 2", {"global": 2}, procs, True)


def _load_b() -> Load:
    procs = [("ta", "p1", f"ua{i}") for i in range(9)] + [("tb", "p1", f"ub{i}") for i in range(3)]
    return Load("B", "unequal demand: tenant ta 9 processes, tb 3, global cap 2", {"global": 2}, procs,
                True, small_tenant="tb")


def _load_c() -> Load:
    # Each level binds some of the time: t1/u1 runs twice (user cap 1), t2/p1 has three users
    # (project cap 2), every tenant has four processes (tenant cap 2), and three tenants × 2
    # exceed the global cap 4. t3/u1 crosses projects (the user scope is tenant-wide).
    procs = [
        ("t1", "p1", "u1"), ("t1", "p1", "u1"), ("t1", "p1", "u2"), ("t1", "p2", "u3"),
        ("t2", "p1", "u1"), ("t2", "p1", "u2"), ("t2", "p1", "u3"), ("t2", "p2", "u4"),
        ("t3", "p1", "u1"), ("t3", "p2", "u2"), ("t3", "p3", "u3"), ("t3", "p3", "u1"),
    ]
    return Load("C", "4 levels (global 4, tenant 2, project 2, user 1), 12 processes in 3 tenants",
                {"global": 4, "tenant": 2, "project": 2, "user": 1}, procs, False)


# --- who goes next: weights, project shares, priority classes, starvation -------------------

T_SHARE_POINTS = 5.0
T_INTERACTIVE_P99_S = HOLD_S + 0.050
T_STARVATION_MS = 2000
T_ESTIMATE_ERROR = 0.25


def _load_e() -> Load:
    procs = [(f"t{t}", "p1", f"u{t}{i}") for t in (1, 2) for i in range(6)]
    return Load("E", "equal shares: 2 tenants × 6 processes, global cap 2 (the baseline of W; estimates)",
                {"global": 2}, procs, False)


def _load_w() -> Load:
    procs = [(f"t{t}", "p1", f"u{t}{i}") for t in (1, 2) for i in range(6)]
    return Load("W", "weights 3 : 1 (t1 : t2), 2 tenants × 6 processes, global cap 2", {"global": 2}, procs, False,
                extra_yaml="shares: {tenants: {t1: 3, t2: 1}}")


def _load_p() -> Load:
    procs = ([("ta", "pa1", f"a1u{i}") for i in range(4)] + [("ta", "pa2", f"a2u{i}") for i in range(4)]
             + [("tb", "pb1", f"bu{i}") for i in range(4)])
    return Load("P", "project weights 2 : 1 inside tenant ta (pa1 : pa2) beside an equal tenant tb, global cap 2",
                {"global": 2}, procs, False, extra_yaml="shares: {projects: {pa1: 2, pa2: 1}}")


def _load_i() -> Load:
    procs = [("tb", "p1", f"batch{i}") for i in range(8)] + [("ti", "p1", "inter")]
    return Load("I", "priority under a batch flood: 8 batch processes looping, 1 interactive arriving every 0.5 s",
                {"global": 2}, procs, False, extra_yaml="priorities: [interactive, batch]",
                classes=("batch",) * 8 + ("interactive",), pace=(None,) * 8 + (0.5,))


def _load_s() -> Load:
    procs = [("ti", "p1", f"inter{i}") for i in range(4)] + [("tb", "p1", f"batch{i}") for i in range(4)]
    return Load("S", "starvation bound: 4 interactive + 4 batch processes looping, maxStarvationMs 2000",
                {"global": 2}, procs, False,
                extra_yaml=f"priorities: [interactive, batch]\nmaxStarvationMs: {T_STARVATION_MS}",
                classes=("interactive",) * 4 + ("batch",) * 4)


LOADS = {"A": _load_a, "B": _load_b, "C": _load_c, "E": _load_e, "W": _load_w, "P": _load_p, "I": _load_i,
         "S": _load_s}
SHARE_LOADS = ("E", "W", "P", "I", "S")


def _scope_keys(levels: dict[str, int], proc: tuple[str, str, str]) -> list[tuple[str, str]]:
    tenant, project, user = proc
    scopes = {"global": "*", "tenant": tenant, "project": f"{tenant}/{project}", "user": f"{tenant}/{user}"}
    return [(level, scopes[level]) for level in LEVEL_ORDER if level in levels]


def effective_cap(load: Load) -> int:
    """The most processes of this load that can hold at once under every level's cap.

    Brute force over subsets (12 processes: 4096): user and project scopes are not nested,
    so no simple formula exists, and the FIFO ideal and utilisation need the true figure.
    """
    n = len(load.procs)
    best = 0
    for mask in range(1 << n):
        size = bin(mask).count("1")
        if size <= best:
            continue
        used: dict[tuple[str, str], int] = defaultdict(int)
        ok = True
        for i in range(n):
            if mask >> i & 1:
                for key in _scope_keys(load.levels, load.procs[i]):
                    used[key] += 1
                    if used[key] > load.levels[key[0]]:
                        ok = False
                        break
            if not ok:
                break
        if ok:
            best = size
    return best


# --- children -------------------------------------------------------------------------------


def _lease_name(load_name: str, hold: float = HOLD_S) -> str:
    # One lease per hold: a run starts on a lease no earlier run left tickets on.
    suffix = "" if round(hold * 1000) == round(HOLD_S * 1000) else f"h{round(hold * 1000)}"
    return f"contention{load_name.lower()}{suffix}"


def _run_window(index, acquire, release, ready_q, start_event, start_value, result_q, seconds, hold,
                counter=None, pace=None):
    """Warm up, report ready, then loop acquire → hold → release inside the shared window.

    ``counter`` (a timed CommandCounter) sees the process's commands; those started inside
    the window are sent back with their times.
    """
    release(acquire())  # connections open, definition cached, counters exist
    ready_q.put(index)
    start_event.wait()
    start = start_value.value
    end = start + seconds
    time.sleep(max(0.0, start - time.time()))
    cpu_start = time.process_time()  # all the process's threads (the wake-up listener too)
    grants: list[float] = []
    releases: list[float] = []  # release() called
    released: list[float] = []  # release() returned
    waits: list[float] = []
    estimates: list[tuple[float, float]] = []  # (estimated wait, actual wait) of queued grants
    busy = errors = 0
    arrivals = 0
    while True:
        if pace:
            # A paced process arrives every ``pace`` seconds from the window's start.
            arrivals += 1
            time.sleep(max(0.0, start + arrivals * pace - time.time()))
        called = time.time()
        if called >= end:
            break
        try:
            handle = acquire()
        except TimeoutError:
            busy += 1
            continue
        except Exception:  # noqa: BLE001 - store or ZooKeeper trouble: counted, not fatal
            errors += 1
            time.sleep(0.05)
            continue
        granted = time.time()
        waits.append(granted - called)  # every call made inside the window, granted in it or not
        if granted >= end:
            release(handle)
            break
        grants.append(granted)
        estimate = getattr(handle, "estimated_wait_s", None)
        if estimate is not None:
            estimates.append((estimate, granted - called))
        time.sleep(max(0.0, granted + hold - time.time()))
        releasing = time.time()
        release(handle)
        releases.append(releasing)
        released.append(time.time())
    cpu = time.process_time() - cpu_start
    timed = None
    if counter is not None:
        # Commands started inside the window (after its end only the drain is left).
        timed = [(t, name) for t, name in list(counter.timed) if start <= t < end]
    result_q.put({"index": index, "grants": grants, "releases": releases, "released": released, "waits": waits,
                  "busy": busy, "errors": errors, "commands": None if timed is None else len(timed),
                  "timed": timed, "start": start, "end": end, "estimates": estimates, "cpu": cpu})


def _project_child(index, load_name, proc, hold, seconds, ready_q, start_event, start_value, result_q):
    import django

    django.setup()
    import pymongo
    from django.conf import settings

    import leases
    from leases.definitions import invalidation
    from leases.store import client as store

    register_bench_handler()
    counter = CommandCounter(timed=True)
    client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[counter], tz_aware=False,
                                 appname="bench-contention")
    store.set_client(client)
    # Until config invalidation listens, every acquire re-reads the definition (one more
    # command): a long-running process is past that point.
    invalidation.wait_listening()
    tenant, project, user = proc
    load = LOADS[load_name]()
    priority = load.classes[index] if load.classes else None
    request = leases.LeaseRequest(type="bench", lease=_lease_name(load_name, hold), tenant_id=tenant,
                                  project_id=project, user_id=user, holder_ref=f"proc{index}", priority=priority)

    def acquire():
        try:
            return leases.acquire(request)
        except leases.LeaseBusy as exc:
            raise TimeoutError(str(exc)) from None

    _run_window(index, acquire, lambda lease: lease.release(), ready_q, start_event, start_value,
                result_q, seconds, hold, counter, pace=load.pace[index] if load.pace else None)


def _zk_child(index, hosts, path, cap, hold, seconds, ready_q, start_event, start_value, result_q):
    from kazoo.client import KazooClient
    from kazoo.exceptions import LockTimeout

    zk = KazooClient(hosts=hosts, timeout=10.0)
    zk.start(timeout=30)
    semaphore = zk.Semaphore(path, identifier=f"proc{index}", max_leases=cap)

    def acquire():
        try:
            if not semaphore.acquire(blocking=True, timeout=WAIT_MS / 1000):
                raise TimeoutError("not acquired")
        except LockTimeout as exc:
            raise TimeoutError(str(exc)) from None
        return semaphore

    try:
        _run_window(index, acquire, lambda s: s.release(), ready_q, start_event, start_value, result_q,
                    seconds, hold)
    finally:
        zk.stop()
        zk.close()


def run_processes(target, argsets, seconds, *, server_pid: int | None = None) -> tuple[list[dict], float | None]:
    """Spawn one process per argument set, release them into one window, collect results.

    Also answers the CPU seconds the server process ``server_pid`` used inside the window
    (None without a pid, or when ``/proc`` could not be read)."""
    procs, ready_q, result_q, start_event, start_value = spawn_clients(target, argsets, seconds)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        ready = 0
        while ready < len(procs):
            ready_q.get(timeout=max(0.1, deadline - time.monotonic()))
            ready += 1
        start_value.value = time.time() + START_DELAY_S
        start_event.set()
        sampler = CpuSampler([server_pid] if server_pid is not None else [], [start_value.value, start_value.value + seconds])
        deadline = time.monotonic() + START_DELAY_S + seconds + DRAIN_TIMEOUT_S
        results = [result_q.get(timeout=max(0.1, deadline - time.monotonic())) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        return sorted(results, key=lambda r: r["index"]), sampler.used(0, 1)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)


# --- figures --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Handoff:
    """One release paired with the grant that took its slot."""

    called: float  # the releaser called release()
    returned: float  # its release() returned
    releaser: int  # process index
    granted: float  # the next holder's acquire() returned
    grantee: int


def handoffs(results: list[dict], cap: int) -> list[Handoff]:
    """Release → next grant on the resource, pairing each grant with the oldest free slot.

    A release is timed when ``release()`` is called (the holder is done with the slot), a
    grant when ``acquire()`` returns.

    The window opens with ``cap`` free slots (virtual releases at the start, not measured);
    every release frees one, every grant takes the oldest freed one. A release whose slot is
    not taken again inside the window is left out (its gap is not known).
    """
    events = sorted([(t, 1, r["index"], done) for r in results for t, done in zip(r["releases"], r["released"])]
                    + [(t, 0, r["index"], t) for r in results for t in r["grants"]])
    free: list[tuple[float, float, int] | None] = [None] * cap
    pairs: list[Handoff] = []
    for t, is_release, index, done in events:
        if is_release:
            free.append((t, done, index))
        elif free:
            freed = free.pop(0)
            if freed is not None:
                pairs.append(Handoff(freed[0], freed[1], freed[2], t, index))
    return pairs


def _between(timed: list[tuple[float, str]], low: float, high: float) -> list[str]:
    """Names of the commands (sorted by time) started in [low, high]."""
    return [name for _, name in timed[bisect_left(timed, (low,)):bisect_right(timed, (high, "\uffff"))]]


def critical_path(pairs: list[Handoff], results: list[dict]) -> tuple[list[int], list[int], Counter]:
    """Store commands per hand-off: (on the critical path, both processes' in the interval, by name).

    On the critical path: the releaser's commands started between its release call and the
    return of that call (or the grant, if sooner), plus the granted process's commands started
    between the release call and its acquire's return. The wider count takes everything both
    processes started in [release call, grant] — also the releaser's own next acquire, which
    runs beside the hand-off rather than in it.
    """
    timed = {r["index"]: sorted(r["timed"]) for r in results}
    counts: list[int] = []
    wide: list[int] = []
    names: Counter = Counter()
    for h in pairs:
        grantee = _between(timed[h.grantee], h.called, h.granted)
        releaser = all_releaser = []
        if h.releaser != h.grantee:
            releaser = _between(timed[h.releaser], h.called, min(h.returned, h.granted))
            all_releaser = _between(timed[h.releaser], h.called, h.granted)
        counts.append(len(releaser) + len(grantee))
        wide.append(len(all_releaser) + len(grantee))
        names.update(("releaser", n) for n in releaser)
        names.update(("next holder", n) for n in grantee)
    return counts, wide, names


@dataclass
class Figures:
    grants: int = 0
    busy: int = 0
    errors: int = 0
    utilisation: float | None = None
    p50: float | None = None
    p99: float | None = None
    max: float | None = None
    jain: float | None = None
    shares: dict[str, float] = field(default_factory=dict)
    commands_per_grant: float | None = None
    handoff_p50: float | None = None
    handoff_p99: float | None = None
    handoffs: int = 0
    critical_p50: float | None = None
    critical_mean: float | None = None
    critical_wide_mean: float | None = None
    critical_names: str = ""
    names_per_grant: str = ""  # every command started in the window, by name, per grant
    server_cpu: float | None = None  # CPU seconds the server used in the window
    client_cpu: float | None = None  # CPU seconds all client processes used in the window


def figures(load: Load, results: list[dict], cap: int, seconds: float, hold: float = HOLD_S,
            server_cpu: float | None = None) -> Figures:
    grants = [len(r["grants"]) for r in results]
    total = sum(grants)
    waits = [w for r in results for w in r["waits"]]
    by_tenant: dict[str, int] = defaultdict(int)
    for r, count in zip(results, grants):
        by_tenant[load.procs[r["index"]][0]] += count
    commands = [r["commands"] for r in results]
    pairs = handoffs(results, cap)
    gaps = [h.granted - h.called for h in pairs]
    result = Figures(
        grants=total,
        busy=sum(r["busy"] for r in results),
        errors=sum(r["errors"] for r in results),
        utilisation=total / (cap * seconds / hold),
        p50=percentile(waits, 0.50), p99=percentile(waits, 0.99), max=max(waits) if waits else None,
        jain=jain([float(g) for g in grants]),
        shares={t: 100.0 * n / total if total else 0.0 for t, n in sorted(by_tenant.items())},
        commands_per_grant=(sum(commands) / total) if total and None not in commands else None,
        handoff_p50=percentile(gaps, 0.50), handoff_p99=percentile(gaps, 0.99), handoffs=len(pairs),
        server_cpu=server_cpu,
        client_cpu=sum(r.get("cpu", 0.0) for r in results),
    )
    timed = all(r.get("timed") is not None for r in results)
    if total and timed:
        by_name = Counter(name for r in results for _, name in r["timed"])
        result.names_per_grant = ", ".join(f"{name} {n / total:.2f}" for name, n in by_name.most_common()
                                           if n / total >= 0.01)
    if pairs and timed:
        counts, wide, names = critical_path(pairs, results)
        result.critical_p50 = percentile([float(c) for c in counts], 0.50)
        result.critical_mean = sum(counts) / len(counts)
        result.critical_wide_mean = sum(wide) / len(wide)
        parts = []
        for role in ("releaser", "next holder"):
            per = sorted(((n / len(pairs), name) for (r, name), n in names.items() if r == role), reverse=True)
            shown = ", ".join(f"{name} {mean:.2f}" for mean, name in per if mean >= 0.01)
            parts.append(f"{role}: {shown or 'none'}")
        result.critical_names = "; ".join(parts)
    return result


# --- ZooKeeper ------------------------------------------------------------------------------


# --- project side ---------------------------------------------------------------------------


def define(load: Load, hold: float = HOLD_S) -> None:
    from leases.definitions import layers as config
    from leases.definitions.model import document_path

    body = ", ".join(f"{level}: {cap}" for level, cap in load.levels.items())
    config.put_document("_vance", "_tenant", document_path(_lease_name(load.name, hold)),
                        f"levels: {{{body}}}\nttlSeconds: 30\nwaitMs: {WAIT_MS}\n{load.extra_yaml}")


def uncontended_commands(load: Load, hold: float = HOLD_S) -> int:
    """MongoDB commands of one uncontended acquire + release (definition cached)."""
    import pymongo
    from django.conf import settings

    import leases
    from leases.definitions import invalidation
    from leases.store import client as store

    counter = CommandCounter()
    client = pymongo.MongoClient(settings.MONGODB_URI, event_listeners=[counter], tz_aware=False)
    store.set_client(client)
    invalidation.wait_listening()
    try:
        tenant, project, user = load.procs[0]
        request = leases.LeaseRequest(type="bench", lease=_lease_name(load.name, hold), tenant_id=tenant,
                                      project_id=project, user_id=user)
        leases.acquire(request).release()  # counters exist, definition cached
        counter.names.clear()
        leases.acquire(request).release()
        return len(counter.names)
    finally:
        store.set_client(None)
        client.close()


# --- output ---------------------------------------------------------------------------------


def _s(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:.0f}"


def _ratio(value: float | None, ideal: float) -> str:
    return "—" if value is None or ideal <= 0 else f"{value / ideal:.2f}×"


def _cpu(used: float | None, grants: int, seconds: float) -> str:
    """CPU seconds ``used`` in the window as a share of one core and ms a grant."""
    if used is None:
        return "—"
    per_grant = f"{1000 * used / grants:.1f}" if grants else "—"
    return f"{100 * used / seconds:.0f} %; {per_grant}"


def _ideal(load: Load, cap: int, hold: float) -> float:
    """FIFO ideal wait: (waiters − cap) ÷ cap × hold."""
    return (len(load.procs) - cap) / cap * hold


def print_table(load: Load, cap: int, seconds: float, uncontended: int, ours: Figures,
                zk: Figures | None, zk_note: str, hold: float = HOLD_S) -> None:
    waiters = len(load.procs)
    ideal = _ideal(load, cap, hold)
    at_base = round(hold * 1000) == round(HOLD_S * 1000)  # the hold the absolute targets are set for
    cols = ["this project"] + (["kazoo Semaphore (ZooKeeper)"] if load.zk else [])
    print(f"### Load {load.name}: {load.title}, hold {hold * 1000:g} ms\n")
    print(f"{waiters} processes, hold {hold * 1000:g} ms, {seconds:g} s window; cap {cap}"
          + (" (the most holders the four levels admit at once for these processes)" if len(load.levels) > 1 else "")
          + f"; FIFO ideal wait (waiters − cap) ÷ cap × hold = {ideal:.3f} s.")
    if load.zk and zk is None:
        print(f"kazoo column missing: {zk_note}")
    print()
    print("| figure | " + " | ".join(cols) + " | target |")
    print("|---|" + "---:|" * len(cols) + "---|")

    def row(label, fn, target):
        cells = [fn(ours)]
        if load.zk:
            cells.append(fn(zk) if zk is not None else "—")
        print(f"| {label} | " + " | ".join(cells) + f" | {target} |")

    row("grants in the window", lambda f: str(f.grants), "")
    util_targets = [f"≥ {T_UTILISATION:.2f}"] if at_base else []
    if zk is not None and zk.utilisation is not None:
        util_targets.append(f"≥ kazoo ({zk.utilisation:.2f})")
    row("utilisation (grants ÷ cap·seconds/hold)", lambda f: _s(f.utilisation),
        " and ".join(util_targets) or "≥ kazoo's (no kazoo column)")
    p99_target = f"p99 ≤ {T_P99_RATIO * ideal:.3f}, " if at_base else ""
    row("wait p50 / p99 / max (s)", lambda f: f"{_s(f.p50, 3)} / {_s(f.p99, 3)} / {_s(f.max, 3)}",
        f"{p99_target}max ≤ {T_MAX_RATIO * ideal:.3f}")
    row("p99 ÷ ideal, max ÷ ideal", lambda f: f"{_ratio(f.p99, ideal)}, {_ratio(f.max, ideal)}",
        (f"≤ {T_P99_RATIO}×, " if at_base else f"(≤ {T_P99_RATIO}× at {HOLD_S * 1000:g} ms), ")
        + f"≤ {T_MAX_RATIO:g}×")
    equal_demand = load.name == "A"
    row("Jain fairness across processes (grants each)", lambda f: _s(f.jain, 3),
        f"≥ {T_JAIN}" if equal_demand else "— (demand not equal per process)")
    tenants = sorted({p[0] for p in load.procs})
    for tenant in tenants:
        n = sum(1 for p in load.procs if p[0] == tenant)
        if tenant == load.small_tenant:
            target = f"{T_SMALL_SHARE[0]:.0f}–{T_SMALL_SHARE[1]:.0f} %"
        elif load.small_tenant is None and len({sum(1 for p in load.procs if p[0] == t) for t in tenants}) == 1:
            target = f"≈ {100 / len(tenants):.0f} %"
        else:
            target = ""
        row(f"share of grants, tenant {tenant} ({n} processes)", lambda f, t=tenant: f"{f.shares.get(t, 0):.1f} %",
            target)
    if load.name == "A":
        per_grant_target = f"≤ {T_COMMANDS_PER_GRANT_A} (before direct hand-off)"
    else:
        per_grant_target = (f"≤ {uncontended + T_EXTRA_COMMANDS} (uncontended acquire+release {uncontended} "
                            f"+ {T_EXTRA_COMMANDS})")
    row("store commands per grant (in the window)",
        lambda f: _s(f.commands_per_grant, 1) if f is ours else "—",
        per_grant_target + f"; uncontended acquire+release {uncontended}")
    approx = " (one slot pool per resource; approximate with 4 levels)" if len(load.levels) > 1 else ""
    row("hand-off: release call → next acquire return, p50 / p99 (ms)",
        lambda f: f"{_ms(f.handoff_p50)} / {_ms(f.handoff_p99)}", f"p50 ≤ {T_HANDOFF_P50_MS:g}{approx}")
    row("store commands on the critical path per hand-off, p50 / mean",
        lambda f: f"{_s(f.critical_p50, 0)} / {_s(f.critical_mean, 2)}" if f is ours else "—",
        f"≤ {T_CRITICAL_COMMANDS} (releaser's release call + the next holder's commands until it returns){approx}")
    row("… and all both processes started in [release call, grant] (with the releaser's next acquire)",
        lambda f: _s(f.critical_wide_mean, 2) if f is ours else "—", "(mean; not a target)")
    row("server CPU in the window: share of one core; per grant (ms)", lambda f: _cpu(f.server_cpu, f.grants, seconds),
        "(not a target; embedded server or ZooKeeper, started by this bench)")
    row("client processes' CPU in the window: share of one core; per grant (ms)",
        lambda f: _cpu(f.client_cpu, f.grants, seconds), "(not a target; all the processes' threads)")
    row("hand-offs paired", lambda f: str(f.handoffs), "")
    row("acquire timeouts (LeaseBusy / LockTimeout)", lambda f: str(f.busy), "0")
    if ours.errors or (zk is not None and zk.errors):
        row("acquire errors (store / ZooKeeper unavailable)", lambda f: str(f.errors), "0")
    print()
    if ours.critical_names:
        print(f"Critical-path commands by name, mean per hand-off: {ours.critical_names}.\n")
    if ours.names_per_grant:
        print(f"All store commands in the window by name, per grant: {ours.names_per_grant}.\n")


def print_summary(rows: list[tuple[float, Load, int, Figures, Figures | None]], seconds: float) -> None:
    """Load A across holds: ours beside kazoo's."""
    print("### Load A across holds\n")
    print("| hold | ours: utilisation / p99 ÷ ideal / hand-off p50 (ms) | ours: critical-path commands p50 / mean; "
          "per grant | kazoo: utilisation / p99 ÷ ideal / hand-off p50 (ms) | server CPU, share of a core; ms a grant: "
          "ours / ZooKeeper |")
    print("|---:|---|---|---|---|")
    for hold, load, cap, ours, zk in rows:
        ideal = _ideal(load, cap, hold)
        cells = ["—" if f is None else f"{_s(f.utilisation)} / {_ratio(f.p99, ideal)} / {_ms(f.handoff_p50)}"
                 for f in (ours, zk)]
        print(f"| {hold * 1000:g} ms | {cells[0]} | {_s(ours.critical_p50, 0)} / {_s(ours.critical_mean, 2)}; "
              f"{_s(ours.commands_per_grant, 1)} | {cells[1]} | {_cpu(ours.server_cpu, ours.grants, seconds)} / "
              f"{_cpu(zk.server_cpu, zk.grants, seconds) if zk is not None else '—'} |")
    print(f"\nTargets: utilisation ≥ {T_UTILISATION} at {HOLD_S * 1000:g} ms and ≥ kazoo's at every hold; "
          f"p99 ≤ {T_P99_RATIO}× ideal at {HOLD_S * 1000:g} ms; hand-off p50 ≤ {T_HANDOFF_P50_MS:g} ms; "
          f"critical-path commands ≤ {T_CRITICAL_COMMANDS}; commands per grant ≤ {T_COMMANDS_PER_GRANT_A}.\n")


def _shares_by(load: Load, results: list[dict], key) -> dict[str, float]:
    counts: dict[str, int] = defaultdict(int)
    for r in results:
        counts[key(r["index"])] += len(r["grants"])
    total = sum(counts.values())
    return {k: 100.0 * v / total if total else 0.0 for k, v in sorted(counts.items())}


def _waits_of(load: Load, results: list[dict], cls: str) -> list[float]:
    return [w for r in results if load.classes[r["index"]] == cls for w in r["waits"]]


def estimate_error(results: list[dict]) -> tuple[int, float | None, float | None, float | None]:
    """(samples, median |estimate − actual| ÷ actual, median |estimate − actual| (s), median actual (s))
    over the grants that queued with an estimate (actual waits under 10 ms are hand-offs
    already due, left out: a ratio to ~0 says nothing)."""
    pairs = [(e, a) for r in results for e, a in r.get("estimates") or () if a >= 0.010]
    if not pairs:
        return 0, None, None, None
    return (len(pairs), percentile([abs(e - a) / a for e, a in pairs], 0.5),
            percentile([abs(e - a) for e, a in pairs], 0.5), percentile([a for _, a in pairs], 0.5))


def print_share_table(load: Load, cap: int, seconds: float, uncontended: int, ours: Figures,
                      results: list[dict], baseline: dict[str, float]) -> None:
    """The table of one who-goes-next load (weights, projects, classes, starvation, estimates)."""
    print(f"### Load {load.name}: {load.title}\n")
    print(f"{len(load.procs)} processes, hold {HOLD_S * 1000:.0f} ms, {seconds:g} s window, cap {cap}"
          + (f"; definition adds `{load.extra_yaml.replace(chr(10), '; ')}`" if load.extra_yaml else "") + ".\n")
    print("| figure | measured | target |")
    print("|---|---:|---|")

    def row(label, value, target=""):
        print(f"| {label} | {value} | {target} |")

    row("grants in the window", str(ours.grants))
    row("utilisation (grants ÷ cap·seconds/hold)", _s(ours.utilisation),
        f"≥ {T_SHARE_UTILISATION:.2f}" if load.name in ("W", "I") else "")
    if load.name == "W":
        for tenant, share in _shares_by(load, results, lambda i: load.procs[i][0]).items():
            target = 75.0 if tenant == "t1" else 25.0
            row(f"share of grants, tenant {tenant} (weight {3 if tenant == 't1' else 1})", f"{share:.1f} %",
                f"{target:.0f} % ± {T_SHARE_POINTS:.0f}")
    if load.name == "E":
        for tenant, share in _shares_by(load, results, lambda i: load.procs[i][0]).items():
            row(f"share of grants, tenant {tenant} (weight 1)", f"{share:.1f} %", "50 %")
    if load.name == "P":
        targets = {"ta/pa1": 100 / 3, "ta/pa2": 100 / 6, "tb/pb1": 50.0}
        for key, share in _shares_by(load, results, lambda i: f"{load.procs[i][0]}/{load.procs[i][1]}").items():
            row(f"share of grants, {key}", f"{share:.1f} %", f"{targets[key]:.0f} % ± {T_SHARE_POINTS:.0f}")
    if load.name in ("I", "S"):
        for cls in ("interactive", "batch"):
            waits = _waits_of(load, results, cls)
            grants = sum(len(r["grants"]) for r in results if load.classes[r["index"]] == cls)
            target = ""
            if cls == "interactive" and load.name == "I":
                target = f"p99 ≤ {T_INTERACTIVE_P99_S:.3f} (hold + 50 ms)"
            if cls == "batch" and load.name == "S":
                target = f"max ≤ {T_STARVATION_MS / 1000 + HOLD_S:.3f} (maxStarvationMs + hold)"
            row(f"{cls}: grants; wait p50 / p99 / max (s)",
                f"{grants}; {_s(percentile(waits, 0.5), 3)} / {_s(percentile(waits, 0.99), 3)} / "
                f"{_s(max(waits) if waits else None, 3)}", target)
    if load.name == "S":
        per = [len(r["grants"]) for r in results if load.classes[r["index"]] == "batch"]
        row("grants per batch process", ", ".join(map(str, per)), "every one ≥ 1")
    # The estimate's figures for every load ("—" where none was made); the target is for
    # the steady loads E and W only (P, I and S show how far weights and classes move it).
    n, rel, absolute, actual = estimate_error(results)
    row("estimate error: median abs(est − actual) ÷ actual (queued grants)",
        _s(rel, 3) + f" (n = {n})" if n else "—", f"≤ {T_ESTIMATE_ERROR:.2f}" if load.name in ("E", "W") else "")
    row("estimate: median abs error / median actual wait (s)", f"{_s(absolute, 3)} / {_s(actual, 3)}" if n else "—")
    for tenant in sorted({p[0] for p in load.procs}):
        ratios = [e / a for r in results if load.procs[r["index"]][0] == tenant
                  for e, a in r.get("estimates") or () if a >= 0.010]
        row(f"estimate ÷ actual, median, tenant {tenant}", _s(percentile(ratios, 0.5), 2))
    waits = [w for r in results for w in r["waits"]]
    over = sum(1 for w in waits if w > 1.0)
    row("waits longer than the 1 s keep-alive period (each costs ≥ 1 keep-alive)",
        f"{100.0 * over / len(waits):.1f} %" if waits else "—")
    cpg = ours.commands_per_grant
    if load.name == "E":
        baseline["E"] = cpg or 0.0
        row("store commands per grant (in the window)", _s(cpg, 2), f"uncontended acquire+release {uncontended}")
    else:
        base = baseline.get("E")
        row("store commands per grant (in the window)", _s(cpg, 2),
            f"≤ equal shares (load E: {_s(base, 2)})" if base else "(run load E for the equal-shares figure)")
    row("acquire timeouts (LeaseBusy)", str(ours.busy), "0")
    if ours.errors:
        row("acquire errors (store unavailable)", str(ours.errors), "0")
    print()


def _holds(text: str) -> list[float]:
    holds = [float(part) / 1000 for part in text.split(",") if part.strip()]
    if not holds or any(h <= 0 for h in holds):
        raise argparse.ArgumentTypeError(f"holds must be positive milliseconds, got {text!r}")
    return holds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", default="A,B,C",
                        help="comma-separated subset of A,B,C (fairness) and E,W,P,I,S (shares, classes, "
                             "starvation, estimates); 'shares' = E,W,P,I,S")
    parser.add_argument("--holds", type=_holds, default=[HOLD_S],
                        help="comma-separated hold times in ms for load A, one run each (default 100; "
                             "issue 21's table: 100,50,20,10); the other loads hold 100 ms")
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window per load")
    parser.add_argument("--no-zk", action="store_true", help="skip the kazoo/ZooKeeper side")
    args = parser.parse_args()
    names = [n.strip().upper() for n in args.loads.split(",") if n.strip()]
    if names == ["SHARES"]:
        names = list(SHARE_LOADS)
    unknown = [n for n in names if n not in LOADS]
    if unknown:
        parser.error(f"unknown loads {unknown}; choose from {sorted(LOADS)}")
    runs = [(LOADS[n](), hold) for n in names for hold in (args.holds if n == "A" else [HOLD_S])]

    external = bool(os.environ.get("MONGODB_URI"))
    setup("bench_contention")
    from leases.store import client as store

    store.client().drop_database(store.database_name())
    register_bench_handler()

    zk: ZooKeeper | None = None
    zk_note = "--no-zk given" if args.no_zk else "not used by these loads"
    if not args.no_zk and any(load.zk for load, _ in runs):
        zk = ZooKeeper()
        try:
            zk.start()
            zk_note = ""
        except RuntimeError as exc:
            zk_note = f"ZooKeeper could not start: {exc}"
            zk.stop()
            zk = None

    holds_ms = ", ".join(f"{h * 1000:g}" for h in args.holds)
    hold_note = f"{holds_ms} ms (load A), {HOLD_S * 1000:g} ms (the others)" if "A" in names else f"{HOLD_S * 1000:g} ms"
    print(f"hold {hold_note}; window {args.seconds:g} s per load, "
          f"waitMs {WAIT_MS}; MongoDB: {'MONGODB_URI' if external else 'embedded server (own process)'}; "
          f"ZooKeeper: {zk.hosts if zk else 'none (' + zk_note + ')'}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
          f"server speed {calibration(store.client_options()[0])}\n")
    baseline: dict[str, float] = {}
    summary: list[tuple[float, Load, int, Figures, Figures | None]] = []
    try:
        for load, hold in runs:
            define(load, hold)
            cap = effective_cap(load)
            uncontended = uncontended_commands(load, hold)
            results, used = run_processes(_project_child,
                                          [(i, load.name, proc, hold) for i, proc in enumerate(load.procs)],
                                          args.seconds, server_pid=_setup.SERVER_PID)
            ours = figures(load, results, cap, args.seconds, hold, used)
            if load.name in SHARE_LOADS:
                print_share_table(load, cap, args.seconds, uncontended, ours, results, baseline)
                sys.stdout.flush()
                continue
            theirs = None
            if load.zk and zk is not None:
                path = f"/bench/contention-{load.name.lower()}-{round(hold * 1000)}"
                zk_results, zk_used = run_processes(
                    _zk_child, [(i, zk.hosts, path, cap, hold) for i in range(len(load.procs))], args.seconds,
                    server_pid=zk.process.pid if zk.process is not None else None)
                theirs = figures(load, zk_results, cap, args.seconds, hold, zk_used)
            print_table(load, cap, args.seconds, uncontended, ours, theirs, zk_note, hold)
            if load.name == "A":
                summary.append((hold, load, cap, ours, theirs))
            sys.stdout.flush()
        if summary:
            print_summary(summary, args.seconds)
    finally:
        if zk is not None:
            zk.stop()


if __name__ == "__main__":
    main()
