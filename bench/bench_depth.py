"""Queue-depth benchmark (issue 33): does a grant cost the same with 1,000 waiters as with 12,
and does a deep queue leave the store standing? Beside kazoo's Semaphore in the same run.

One resource ``levels: {global: 2}``, 3 tenants (waiter ``w`` is in tenant ``t{w % 3 + 1}``),
100 ms holds; every waiter loops acquire → hold → release with a ``waitMs`` longer than the
window. Only the public API is used, so the bench runs the same before and after a redesign
of the waiting queue: ``leases.acquire`` (threads), ``leases.aacquire`` (asyncio) and the v1
HTTP endpoints (kept tickets).

Modes (``--mode``, comma-separated for several; one table each):

* ``threads``: P processes × T threads (12 = 4×3, 96 = 8×12, 384 = 8×48, 1000 = 8×125; other
  depths: up to 8 processes, threads split evenly);
* ``aio``: the same number of asyncio tasks in one process;
* ``http``: kept tickets of the v1 HTTP API, served by gunicorn (``tests.http_server``) on the
  same store: ``--http-clients`` processes (4) each keep their share of the tickets, a thread
  a ticket: ``POST /api/v1/leases`` with ``waitMs: 1`` (a ticket at once), then ``GET
  /api/v1/tickets/{id}?waitMs=5000`` (a long poll: ``--http-poll-wait-ms``, 0 for plain polls)
  at once and then at every ``Retry-After`` until ``201``, hold, ``DELETE`` the lease; each
  gunicorn worker runs half its threads' worth of long polls (``LEASES_HTTP_LONG_POLLS``).

At every depth, unless ``--no-zk``, ``kazoo.recipe.lock.Semaphore(max_leases=2)`` runs with
the same P × T threads (one KazooClient a process) on ZooKeeper started from
``/usr/share/java/zookeeper.jar`` (``apt-get install -y zookeeper``; needs java and ``pip
install -e ".[bench]"``).

As in ``bench_contention.py`` (whose machinery is shared through ``_common.py``): every
process warms up, reports ready, and all begin at one start time the parent hands out; grants
and store commands (pymongo command monitoring, each process its own) count inside
``[start, start + seconds)`` only; the CPU time of the embedded server (and of ZooKeeper's JVM,
and gunicorn's processes in the http mode) is read from ``/proc`` at the window's start and
end; the header gives the server's speed (compare tables only beside the same speed). After
the window, waiters still queued keep waiting (holding their slot when granted, not looping)
until the grace (``--grace``; default 1.5 × the FIFO ideal + 5 s, at most 120 s): their waits
count; a wait still open then is counted at its length so far (the ``≥`` in the table) and
the processes exit (``os._exit``: a waiter left in the queue goes stale by its TTL).

Figures per depth: utilisation (held time inside the window ÷ cap × window); wait p99 beside
the FIFO ideal (depth − cap) ÷ cap × hold; store commands a grant (clients' commands; the
server's ``serverStatus`` opcounters beside them, the only count in the http mode); server
CPU a grant; the gate counter document's size (``bson`` bytes of the largest document of
the counters collection whose ``_id`` starts with the resource name, read at the window's
end); errors by type (``LeaseUnavailable(cause)``, ``LeaseBusy``, others; release errors
apart); Jain's index over the tenants' grants and over the waiters' grants (waiters without
a grant count as 0: a depth above cap × window ÷ hold cannot give every waiter one); tenant
shares against their weights (equal: 33.3 % each); client memory a waiter (RSS in the middle
of the window minus RSS before the waiters started, ÷ waiters); kazoo's utilisation, p99 and
ZooKeeper's CPU a grant.

Scenarios beside the depths:

* ``--idle-waiters N``: two holders take both slots and hold for the whole run; after a quiet
  stretch N waiters queue and just wait. The store's CPU while they wait minus the quiet
  stretch's is the CPU of waiting alone (% of a core); ``--hold-minutes M`` makes the waiting
  stretch M minutes (default ``--seconds``).
* ``--resources R --per-resource K``: R resources (cap 2 each) with K looping waiters each
  (threads, 8 processes): each resource's utilisation (min / median / max), to compare with
  a single resource at depth K.

Run (embedded server unless MONGODB_URI is set)::

    python bench/bench_depth.py [--mode threads,aio,http] [--depths 12,96,384,1000]
        [--seconds 30] [--no-zk] [--grace S] [--error-pause 0.05]
        [--http-clients 4 --http-threads N --http-workers 4 --http-server-threads 8 --http-poll-wait-ms 5000]
    python bench/bench_depth.py --idle-waiters 1000 [--hold-minutes 2]
    python bench/bench_depth.py --resources 100 --per-resource 100

With ``--idle-waiters`` or ``--resources`` the depths run only when ``--depths`` is given.
Not a test: it asserts nothing, it measures. Each run uses fresh resource names, so queues
left by a collapsed run do not reach the next one (they share the server, though).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import os
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _setup  # noqa: E402
from _common import CpuSampler, ZooKeeper, calibration, jain, percentile, spawn_clients  # noqa: E402
from _setup import CommandCounter, register_bench_handler, setup  # noqa: E402

HOLD_S = 0.1
CAP = 2
TENANTS = ("t1", "t2", "t3")
LAYOUTS = {12: (4, 3), 96: (8, 12), 384: (8, 48), 1000: (8, 125)}
MAX_PROCS = 8
READY_TIMEOUT_S = 300.0
START_DELAY_S = 1.0  # between "everyone is ready" and the window: the start time reaches all
REPORT_TIMEOUT_S = 60.0  # after the grace: the children still have to send their figures
# A waiter whose acquire failed tries again after this (``--error-pause``; the children read it
# from the environment).
ERROR_PAUSE_S = float(os.environ.get("BENCH_DEPTH_ERROR_PAUSE_S", "0.05"))
THREAD_STACK = 512 * 1024
HTTP_TYPE = "tex"  # registered in every process of config.settings (the gunicorn workers too)
IDLE_SETTLE_S = 3.0  # idle scenario: between the waiters' arrival and the measured stretch
# Idle scenario: a second stretch from this long after the waiters' arrival, when 1,000 of them
# are all queued (their shared writes take longer than IDLE_SETTLE_S on 2 cores), so that it
# measures waiting alone, not the tail of the queueing.
IDLE_QUEUED_S = 15.0


# --- the waiters ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Waiter:
    index: int  # global, across processes
    resource: str
    tenant: str
    role: str = "loop"  # "loop" | "holder" (holds the whole run) | "idle" (queues once, late)


def split(total: int, parts: int) -> list[int]:
    """``total`` into ``parts`` near-equal counts (the first ones larger)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def layout(depth: int) -> list[int]:
    """Threads per process for ``depth`` waiters (the issue's layouts, else ≤ 8 processes)."""
    if depth in LAYOUTS:
        procs, threads = LAYOUTS[depth]
        return [threads] * procs
    return split(depth, min(MAX_PROCS, max(1, depth)))


def spread(waiters: list[Waiter], counts: list[int]) -> list[list[Waiter]]:
    out, i = [], 0
    for n in counts:
        out.append(waiters[i:i + n])
        i += n
    return [group for group in out if group]


def loopers(resource: str, depth: int) -> list[Waiter]:
    return [Waiter(w, resource, TENANTS[w % len(TENANTS)]) for w in range(depth)]


# --- what a child records ---------------------------------------------------------------------


def error_name(exc: BaseException) -> str:
    """``LeaseUnavailable(NetworkTimeout)``, ``LeaseBusy``, or the class name."""
    import leases

    if isinstance(exc, leases.LeaseUnavailable):
        cause = exc.__cause__ or exc.__context__
        return f"LeaseUnavailable({type(cause).__name__})" if cause is not None else "LeaseUnavailable"
    if isinstance(exc, leases.LeaseBusy):
        # Which Busy: a full queue refuses at once; otherwise the wait ran out (or the
        # ticket's place was lost).
        return "LeaseBusy(queue full)" if getattr(exc, "queue_full", False) else "LeaseBusy"
    return type(exc).__name__


class Recorder:
    """One process's grants, waits and errors (appended from many threads or tasks)."""

    def __init__(self) -> None:
        self.grants: list[tuple[float, float, int]] = []  # (granted, release called, waiter) inside the window
        self.waits: list[float] = []  # every acquire called inside the window and granted
        self.pending: dict[int, float] = {}  # waiter → acquire called, not answered yet
        self.errors: Counter = Counter()

    def call(self, w: int) -> float:
        called = time.time()
        self.pending[w] = called
        return called

    def grant(self, w: int, called: float) -> float:
        granted = time.time()
        self.pending.pop(w, None)
        self.waits.append(granted - called)
        return granted

    def fail(self, w: int, exc: BaseException, *, prefix: str = "") -> None:
        self.pending.pop(w, None)
        self.errors[prefix + error_name(exc)] += 1

    def held(self, w: int, granted: float, released: float, end: float) -> None:
        if granted < end:
            self.grants.append((granted, released, w))

    def result(self, index: int, cutoff: float, **extra) -> dict:
        return {"index": index, "grants": list(self.grants), "waits": list(self.waits),
                "open": [cutoff - called for called in list(self.pending.values())],
                "errors": dict(self.errors), **extra}


def sit_out_window(start: float, seconds: float) -> tuple[float, int]:
    """Sleep through the window ``[start, start + seconds)`` (wall clock) while this process's
    threads work; answers its CPU seconds inside the window and its RSS in the middle."""
    time.sleep(max(0.0, start - time.time()))
    cpu = time.process_time()
    time.sleep(max(0.0, start + seconds / 2 - time.time()))
    rss_mid = rss_bytes()
    time.sleep(max(0.0, start + seconds - time.time()))
    return time.process_time() - cpu, rss_mid


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sync_waiter(rec: Recorder, waiter: Waiter, acquire, release, start: float, end: float, hold: float,
                idle_delay: float) -> None:
    """One waiter's life: loop acquire → hold → release until ``end`` (then one last wait,
    holding the slot it gets); a holder holds from ``start`` to ``end``; an idle waiter queues
    once at ``start + idle_delay``. Every failure is counted, never raised."""
    w = waiter.index
    begin = start + (idle_delay if waiter.role == "idle" else 0.0)
    time.sleep(max(0.0, begin - time.time()))
    while True:
        called = time.time()
        if called >= end:
            return
        rec.call(w)
        try:
            handle = acquire()
        except Exception as exc:  # noqa: BLE001 - counted by type: the bench survives a collapsed store
            rec.fail(w, exc)
            time.sleep(ERROR_PAUSE_S)
            continue
        granted = rec.grant(w, called)
        until = end if waiter.role in ("holder", "idle") else granted + hold
        time.sleep(max(0.0, until - time.time()))
        releasing = time.time()
        try:
            release(handle)
        except Exception as exc:  # noqa: BLE001
            rec.fail(w, exc, prefix="release ")
        rec.held(w, granted, releasing, end)
        if granted >= end or waiter.role != "loop":
            return


def _warm_up(step) -> None:
    """One warm-up cycle, tried three times: a store still busy with the previous run must not
    keep a child from reporting ready (its failures then show in the window's errors)."""
    for _ in range(3):
        try:
            step()
            return
        except Exception:  # noqa: BLE001
            time.sleep(1.0)


def _finish(result_q, result: dict) -> None:
    """Send the figures and leave at once: waiters still blocked are abandoned (their tickets go
    stale by TTL), no clean-up may hang the exit."""
    result_q.put(result)
    result_q.close()
    result_q.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _window(index, rec, waiters, make_thread, seconds, grace, ready_q, start_event, start_value):
    """Start the waiters' threads, report ready, wait for the start, then measure RSS (before /
    middle), the process's CPU in the window, and wait for the threads until end + grace."""
    rss_before = rss_bytes()
    box: dict[str, float] = {}
    go = threading.Event()
    threading.stack_size(THREAD_STACK)
    threads = [threading.Thread(target=make_thread(waiter, go, box), daemon=True) for waiter in waiters]
    for thread in threads:
        thread.start()
    ready_q.put(index)
    start_event.wait()
    start = box["start"] = start_value.value
    end = box["end"] = start + seconds
    go.set()
    cpu, rss_mid = sit_out_window(start, seconds)
    cutoff = end + grace
    for thread in threads:
        thread.join(max(0.0, cutoff - time.time()))
    return start, end, min(time.time(), cutoff), {"rss_before": rss_before, "rss_mid": rss_mid, "cpu": cpu,
                                                   "waiters": len(waiters)}


def _store_client(counter: CommandCounter):
    """The engine's client as settings build it (timeouts, pool), with ``counter`` listening."""
    import pymongo

    from leases.definitions import invalidation
    from leases.store import client as store

    uri, options = store.client_options()
    client = pymongo.MongoClient(uri, **{**options, "appname": "bench-depth"}, event_listeners=[counter])
    store.set_client(client)
    # Until config invalidation listens, every acquire re-reads the definition (one more command).
    invalidation.wait_listening()
    return client


def _request(waiter: Waiter):
    import leases

    return leases.LeaseRequest(type="bench", lease=waiter.resource, tenant_id=waiter.tenant, project_id="p1",
                               user_id=f"u{waiter.index}", holder_ref=f"w{waiter.index}")


def _in_window(counter: CommandCounter, start: float, end: float) -> tuple[int, dict[str, int]]:
    timed = [name for t, name in list(counter.timed or ()) if start <= t < end]
    return len(timed), dict(Counter(timed))


def threads_child(index, waiters, hold, grace, idle_delay, seconds, ready_q, start_event, start_value, result_q):
    import django

    django.setup()
    import leases

    register_bench_handler()
    counter = CommandCounter(timed=True)
    _store_client(counter)
    for resource in sorted({w.resource for w in waiters}):  # counters exist, definitions cached
        _warm_up(lambda r=resource: leases.acquire(_request(next(w for w in waiters if w.resource == r))).release())
    rec = Recorder()

    def make_thread(waiter, go, box):
        request = _request(waiter)

        def run():
            go.wait()
            sync_waiter(rec, waiter, lambda: leases.acquire(request), lambda lease: lease.release(),
                        box["start"], box["end"], hold, idle_delay)
        return run

    start, end, cutoff, extra = _window(index, rec, waiters, make_thread, seconds, grace, ready_q, start_event,
                                        start_value)
    # The idle scenario measures from IDLE_SETTLE_S after the waiters queued.
    commands, names = _in_window(counter, start + (idle_delay + IDLE_SETTLE_S if idle_delay else 0.0), end)
    late, _ = _in_window(counter, start + seconds / 2, end)
    if idle_delay:
        extra["idle_queued"] = _in_window(counter, start + idle_delay + IDLE_QUEUED_S, end)
    _finish(result_q, rec.result(index, cutoff, commands=commands, names=names, commands_late=late, **extra))


def kazoo_child(index, hosts, waiters, hold, grace, idle_delay, seconds, ready_q, start_event, start_value,
                result_q):
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=hosts, timeout=10.0)
    zk.start(timeout=30)
    warm = zk.Semaphore(f"/bench/{waiters[0].resource}", identifier="warm", max_leases=CAP)
    _warm_up(lambda: warm.acquire(timeout=30) and warm.release())
    rec = Recorder()

    def make_thread(waiter, go, box):
        semaphore = zk.Semaphore(f"/bench/{waiter.resource}", identifier=f"w{waiter.index}", max_leases=CAP)

        def acquire():
            if not semaphore.acquire(blocking=True, timeout=max(0.1, box["end"] + grace - time.time())):
                raise TimeoutError("not acquired")
            return semaphore

        def run():
            go.wait()
            sync_waiter(rec, waiter, acquire, lambda s: s.release(), box["start"], box["end"], hold, idle_delay)
        return run

    start, end, cutoff, extra = _window(index, rec, waiters, make_thread, seconds, grace, ready_q, start_event,
                                        start_value)
    _finish(result_q, rec.result(index, cutoff, commands=None, names={}, **extra))


def aio_child(index, waiters, hold, grace, idle_delay, seconds, ready_q, start_event, start_value, result_q):
    import django

    django.setup()
    import pymongo

    import leases
    from leases.store import client as store

    register_bench_handler()
    counter = CommandCounter(timed=True)
    _store_client(counter)  # the queue's store steps run on the sync engine
    uri, options = store.client_options()
    store.set_async_client_factory(lambda: pymongo.AsyncMongoClient(uri, **{**options, "appname": "bench-depth-aio"},
                                                                    event_listeners=[counter]))
    rec = Recorder()

    async def waiter_task(waiter: Waiter, start: float, end: float) -> None:
        request = _request(waiter)
        w = waiter.index
        await asyncio.sleep(max(0.0, start - time.time()))
        while True:
            called = time.time()
            if called >= end:
                return
            rec.call(w)
            try:
                lease = await leases.aacquire(request)
            except Exception as exc:  # noqa: BLE001 - counted by type
                rec.fail(w, exc)
                await asyncio.sleep(ERROR_PAUSE_S)
                continue
            granted = rec.grant(w, called)
            await asyncio.sleep(max(0.0, granted + hold - time.time()))
            releasing = time.time()
            try:
                await lease.arelease()
            except Exception as exc:  # noqa: BLE001
                rec.fail(w, exc, prefix="release ")
            rec.held(w, granted, releasing, end)
            if granted >= end:
                return

    async def main() -> None:
        for _ in range(3):  # counters, definition, async client; a saturated store must not stop the run
            try:
                await (await leases.aacquire(_request(waiters[0]))).arelease()
                break
            except Exception:  # noqa: BLE001
                await asyncio.sleep(1.0)
        rss_before = rss_bytes()
        box: dict[str, float] = {}
        go = asyncio.Event()

        async def gated(waiter: Waiter) -> None:
            await go.wait()
            await waiter_task(waiter, box["start"], box["end"])

        tasks = [asyncio.create_task(gated(waiter)) for waiter in waiters]
        await asyncio.sleep(0)
        ready_q.put(index)
        await asyncio.get_running_loop().run_in_executor(None, start_event.wait)
        start = box["start"] = start_value.value
        end = box["end"] = start + seconds
        go.set()
        await asyncio.sleep(max(0.0, start - time.time()))
        cpu = time.process_time()
        await asyncio.sleep(max(0.0, start + seconds / 2 - time.time()))
        rss_mid = rss_bytes()
        await asyncio.sleep(max(0.0, end - time.time()))
        cpu = time.process_time() - cpu
        cutoff = end + grace
        await asyncio.wait(tasks, timeout=max(0.0, cutoff - time.time()))
        result_cutoff = min(time.time(), cutoff)
        commands, names = _in_window(counter, start, end)
        late, _ = _in_window(counter, start + seconds / 2, end)
        # Sent (and the process left) from inside the loop: tearing it down would cancel the
        # acquires still queued, which must not decide whether the figures arrive.
        _finish(result_q, rec.result(index, result_cutoff, commands=commands, names=names, rss_before=rss_before,
                                     rss_mid=rss_mid, cpu=cpu, waiters=len(waiters), commands_late=late))

    asyncio.run(main())


def http_child(index, base_url, keys, waiters, hold, grace, idle_delay, workers, poll_wait_ms, seconds, ready_q,
               start_event, start_value, result_q):
    """Keeps its waiters' tickets with ``workers`` threads: a schedule of due calls (POST,
    ticket polls at ``Retry-After`` — each waiting up to ``poll_wait_ms`` for the grant when
    the server expects it within that, 0: plain polls —, DELETE after the hold) run by a
    small pool."""
    from concurrent.futures import ThreadPoolExecutor

    import requests

    from leases.client.answers import error_from, poll_pause

    local = threading.local()

    def session() -> requests.Session:
        if getattr(local, "session", None) is None:
            local.session = requests.Session()
        return local.session

    def call(method: str, path: str, waiter: Waiter, body: dict | None = None) -> requests.Response:
        return session().request(method, f"{base_url}/api/v1/{path}", json=body, timeout=30,
                                 headers={"Authorization": f"Bearer {keys[waiter.tenant]}"})

    rec = Recorder()
    plan: list[tuple[float, int, str, Waiter, dict]] = []
    cond = threading.Condition()
    seq = iter(range(1 << 62))
    box: dict[str, float] = {}

    def later(at: float, action: str, waiter: Waiter, state: dict) -> None:
        with cond:
            heapq.heappush(plan, (at, next(seq), action, waiter, state))
            cond.notify()

    def fail(waiter: Waiter, state: dict, exc: BaseException, prefix: str = "") -> None:
        rec.fail(waiter.index, exc, prefix=prefix)
        later(time.time() + max(ERROR_PAUSE_S, getattr(exc, "retry_after", None) or 0.5), "post", waiter, {})

    def granted(waiter: Waiter, state: dict, body: dict) -> None:
        state["granted"] = rec.grant(waiter.index, state["called"])
        state["token"] = body.get("token")
        later(state["granted"] + hold, "release", waiter, state)

    def step(action: str, waiter: Waiter, state: dict) -> None:
        end = box["end"]
        try:
            if action == "post":
                if time.time() >= end:
                    return
                state = {"called": rec.call(waiter.index)}
                response = call("POST", "leases", waiter, {"type": HTTP_TYPE, "lease": waiter.resource,
                                                           "projectId": "p1", "userId": f"u{waiter.index}",
                                                           "holderRef": f"w{waiter.index}", "waitMs": 1})
            elif action == "poll":
                response = call("GET", f"tickets/{state['ticket']}" + (f"?waitMs={poll_wait_ms}" if poll_wait_ms else ""),
                                waiter)
            else:  # release
                # Called when due (as a thread calls release() after its hold), even when the
                # release pool got to it later: a busy client must not count as a longer hold.
                releasing = state["granted"] + hold
                response = call("DELETE", f"leases/{state['token']}", waiter)
                if response.status_code >= 400:
                    rec.errors["release " + error_name(error_from(response))] += 1
                rec.held(waiter.index, state["granted"], releasing, end)
                if state["granted"] < end:
                    later(time.time(), "post", waiter, {})
                return
        except requests.RequestException as exc:  # what HttpLeaseClient raises as LeaseUnavailable
            rec.pending.pop(waiter.index, None)
            rec.errors[f"LeaseUnavailable({type(exc).__name__})"] += 1
            later(time.time() + 0.5, "post", waiter, {})
            return
        if response.status_code == 201:
            granted(waiter, state, response.json())
        elif response.status_code in (200, 202) and "ticket" in (body := response.json()):
            # A 202 is followed by a poll at once when polls wait (the server answers a ticket
            # further back at once, with its Retry-After); else at Retry-After.
            first = response.status_code == 202 and poll_wait_ms > 0
            state["ticket"] = body["ticket"]
            later(time.time() + (0.0 if first else poll_pause(response, body)), "poll", waiter, state)
        elif response.status_code == 200:  # a noop grant: no limit on this resource (not expected)
            granted(waiter, state, response.json())
        else:
            fail(waiter, state, error_from(response))

    def dispatch(pool: ThreadPoolExecutor, cutoff: float) -> None:
        while True:
            with cond:
                while True:
                    now = time.time()
                    if now >= cutoff:
                        return
                    if plan and plan[0][0] <= now:
                        _, _, action, waiter, state = heapq.heappop(plan)
                        break
                    cond.wait(min(cutoff, plan[0][0] if plan else cutoff) - now)
            # Releases have threads of their own: polls stuck on a slow server must not delay them.
            (releasers if action == "release" else pool).submit(step, action, waiter, state)

    rss_before = rss_bytes()
    pool = ThreadPoolExecutor(max_workers=workers)
    releasers = ThreadPoolExecutor(max_workers=4)
    ready_q.put(index)
    start_event.wait()
    start = box["start"] = start_value.value
    end = box["end"] = start + seconds
    cutoff = end + grace
    for waiter in waiters:
        later(start, "post", waiter, {})
    dispatcher = threading.Thread(target=dispatch, args=(pool, cutoff), daemon=True)
    dispatcher.start()
    cpu, rss_mid = sit_out_window(start, seconds)
    while time.time() < cutoff and (rec.pending or any(a == "release" for _, _, a, _, _ in list(plan))):
        time.sleep(0.1)
    _finish(result_q, rec.result(index, min(time.time(), cutoff), commands=None, names={}, rss_before=rss_before,
                                 rss_mid=rss_mid, cpu=cpu, waiters=len(waiters)))


# --- the parent -------------------------------------------------------------------------------


@dataclass
class Run:
    results: list[dict]
    start: float
    end: float
    cpu: list[float | None]  # CPU seconds of the server processes between consecutive marks
    ops: int | None = None  # serverStatus opcounters in the window (MongoDB side only)
    gate: list[int] = field(default_factory=list)  # bson bytes of each resource's gate at the window's end
    lost: int = 0  # processes that sent no figures


def _opcount() -> int | None:
    from leases.store import client as store

    try:
        counters = store.client().admin.command("serverStatus", maxTimeMS=5000).get("opcounters") or {}
        return sum(int(v) for v in counters.values())
    except Exception:  # noqa: BLE001 - a saturated server: the figure is missing, not the run
        return None


def gate_bytes(resources: list[str]) -> list[int]:
    """The bson size of each resource's largest counter document (the gate), read now."""
    import bson

    from leases.store import client as store

    if not resources:
        return []
    pattern = "^(" + "|".join(re.escape(r) for r in resources) + r")\|"
    largest: dict[str, int] = {}
    try:
        for doc in store.db()[store.COUNTERS].find({"_id": {"$regex": pattern}}, max_time_ms=10000):
            resource = str(doc["_id"]).split("|", 1)[0]
            largest[resource] = max(largest.get(resource, 0), len(bson.encode(doc)))
    except Exception:  # noqa: BLE001
        return []
    return [largest[r] for r in resources if r in largest]


def run_processes(target, argsets, seconds: float, grace: float, *, pids: list[int], marks: list[float],
                  resources: list[str], window: tuple[int, int]) -> Run:
    """Spawn one process per argument set, release them into one window, collect results.

    ``marks`` are offsets from the start at which the servers' CPU is read (``window`` names
    the two that bound the measured window: opcounters there, the gates at its end)."""
    procs, ready_q, result_q, start_event, start_value = spawn_clients(target, argsets, seconds)
    results: list[dict] = []
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        for _ in procs:
            ready_q.get(timeout=max(0.1, deadline - time.monotonic()))
        start = time.time() + START_DELAY_S
        start_value.value = start
        start_event.set()
        ops: dict[int, int | None] = {}
        gates: list[int] = []

        def at_mark(i: int) -> None:
            if i in window:
                ops[i] = _opcount()
            if i == window[1]:
                gates.extend(gate_bytes(resources))

        sampler = CpuSampler(pids, [start + m for m in marks], at_mark)
        deadline = time.monotonic() + START_DELAY_S + seconds + grace + REPORT_TIMEOUT_S
        for _ in procs:
            try:
                results.append(result_q.get(timeout=max(0.1, deadline - time.monotonic())))
            except Exception:  # noqa: BLE001 - queue.Empty: a child that never reported
                break
        sampler.join(timeout=30)
        cpu = [sampler.used(i, i + 1) if sampler.readings[i + 1] is not None else None for i in range(len(marks) - 1)]
        first, last = ops.get(window[0]), ops.get(window[1])
        return Run(sorted(results, key=lambda r: r["index"]), start + marks[window[0]], start + marks[window[1]], cpu,
                   None if first is None or last is None else last - first, gates, len(procs) - len(results))
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)


def define(resource: str, *, wait_s: float, ttl_s: int = 30) -> None:
    from leases.definitions import layers as config
    from leases.definitions.model import document_path

    config.put_document("_vance", "_tenant", document_path(resource),
                        f"levels: {{global: {CAP}}}\nttlSeconds: {ttl_s}\nwaitMs: {int(wait_s * 1000)}\n")


# --- figures ----------------------------------------------------------------------------------


@dataclass
class Figures:
    depth: int
    layout: str
    grants: int = 0
    utilisation: float | None = None
    p50: float | None = None
    p99: float | None = None
    p99_open: bool = False  # the p99 includes waits still open at the cutoff (a lower bound)
    open_waits: int = 0
    waits: int = 0  # granted waits (and open ones) behind the percentiles
    ideal: float = 0.0
    commands: float | None = None  # clients' store commands a grant
    ops: float | None = None  # server opcounters a grant
    cpu: float | None = None  # server CPU seconds in the window
    gate: int | None = None  # bytes
    errors: Counter = field(default_factory=Counter)
    jain_tenants: float | None = None
    jain_waiters: float | None = None
    shares: dict[str, float] = field(default_factory=dict)
    memory: float | None = None  # bytes a waiter
    client_cpu: float | None = None
    lost: int = 0
    per_resource: list[float] = field(default_factory=list)
    names: str = ""
    # The window's second half (a middle CPU mark given): the same figures once the first
    # arrivals are behind.
    late_grants: int = 0
    late_utilisation: float | None = None
    late_commands: float | None = None
    late_cpu: float | None = None


def held_in(grants, start: float, end: float) -> float:
    return sum(max(0.0, min(released, end) - max(granted, start)) for granted, released, _ in grants)


def figures(run: Run, waiters: list[Waiter], depth: int, layout_text: str, hold: float = HOLD_S,
            resources: list[str] | None = None) -> Figures:
    window = run.end - run.start
    grants = [g for r in run.results for g in r["grants"]]
    by_waiter: Counter = Counter(w for _, _, w in grants)
    tenant_of = {w.index: w.tenant for w in waiters}
    by_tenant = Counter(dict.fromkeys(TENANTS, 0))
    for _, _, w in grants:
        by_tenant[tenant_of[w]] += 1
    waits = [x for r in run.results for x in r["waits"]]
    open_waits = [x for r in run.results for x in r["open"]]
    p99 = percentile(waits + open_waits, 0.99)
    resources = resources or sorted({w.resource for w in waiters})
    f = Figures(depth=depth, layout=layout_text, grants=len(grants), ideal=max(0, depth - CAP) / CAP * hold,
                lost=run.lost)
    f.utilisation = held_in(grants, run.start, run.end) / (CAP * len(resources) * window)
    f.p50 = percentile(waits + open_waits, 0.5)
    f.p99 = p99
    f.open_waits = len(open_waits)
    f.waits = len(waits) + len(open_waits)
    f.p99_open = bool(open_waits) and p99 is not None and p99 >= min(open_waits)
    commands = [r["commands"] for r in run.results]
    if grants and commands and None not in commands:
        f.commands = sum(commands) / len(grants)
        names: Counter = Counter()
        for r in run.results:
            names.update(r["names"])
        f.names = ", ".join(f"{n} {c / len(grants):.2f}" for n, c in names.most_common() if c / len(grants) >= 0.05)
    if grants and run.ops is not None:
        f.ops = run.ops / len(grants)
    f.cpu = sum(run.cpu) if run.cpu and None not in run.cpu else None
    if len(run.cpu) == 2:  # a middle mark: the second half too
        middle = run.start + window / 2
        late = [g for g in grants if middle <= g[0] < run.end]
        f.late_grants = len(late)
        f.late_utilisation = held_in(grants, middle, run.end) / (CAP * len(resources) * (run.end - middle))
        late_commands = [r.get("commands_late") for r in run.results]
        if late and late_commands and None not in late_commands:
            f.late_commands = sum(late_commands) / len(late)
        f.late_cpu = run.cpu[1]
    f.gate = max(run.gate) if run.gate else None
    for r in run.results:
        f.errors.update(r["errors"])
    f.jain_tenants = jain([float(by_tenant[t]) for t in TENANTS])
    f.jain_waiters = jain([float(by_waiter.get(w.index, 0)) for w in waiters if w.role == "loop"])
    f.shares = {t: 100.0 * by_tenant[t] / len(grants) if grants else 0.0 for t in TENANTS}
    count = sum(r["waiters"] for r in run.results)
    if count:
        f.memory = sum(r["rss_mid"] - r["rss_before"] for r in run.results) / count
    f.client_cpu = sum(r["cpu"] for r in run.results)
    if len(resources) > 1:
        held: Counter = Counter()
        resource_of = {w.index: w.resource for w in waiters}
        for granted, released, w in grants:
            held[resource_of[w]] += max(0.0, min(released, run.end) - max(granted, run.start))
        f.per_resource = sorted(held.get(r, 0.0) / (CAP * window) for r in resources)
    return f


# --- output -----------------------------------------------------------------------------------


def _s(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _per_grant_ms(used: float | None, grants: int) -> str:
    return "—" if used is None or not grants else f"{1000 * used / grants:.1f} ms"


def _core(used: float | None, seconds: float) -> str:
    return "—" if used is None else f"{100 * used / seconds:.0f} %"


def _bytes(n: float | None) -> str:
    if n is None:
        return "—"
    return f"{n / 1024:.1f} KB" if abs(n) < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MB"


def _errors(errors: Counter) -> str:
    if not errors:
        return "0"
    return ", ".join(f"{n} {name}" for name, n in errors.most_common())


def _p99(f: Figures) -> str:
    """p99 / ideal; with few granted waits (fewer than the waiters) their number, since the
    failed acquires are not waits."""
    if f.p99 is None:
        return "—"
    few = f" (n = {f.waits})" if f.waits < f.depth else ""
    return f"{'≥ ' if f.p99_open else ''}{f.p99:.2f} / {f.ideal:.2f} s{few}"


def _shares(f: Figures) -> str:
    if not f.grants:
        return "—"
    worst = max(abs(share - 100 / len(TENANTS)) for share in f.shares.values())
    return " / ".join(f"{f.shares[t]:.1f}" for t in TENANTS) + f" (max off {worst:.1f} pt)"


def print_mode(mode: str, rows: list[tuple[Figures, Figures | None]], seconds: float, zk_note: str,
               store_note: str) -> None:
    what = {"threads": "P processes × T threads", "aio": "asyncio tasks in one process",
            "http": "kept tickets of the v1 HTTP API (gunicorn)"}[mode]
    print(f"### Mode {mode}: {what}\n")
    print(f"One resource `levels: {{global: {CAP}}}`, {len(TENANTS)} tenants, hold {HOLD_S * 1000:g} ms, "
          f"{seconds:g} s window; FIFO ideal wait = (waiters − cap) ÷ cap × hold; {store_note}"
          + (f"; kazoo column missing: {zk_note}" if zk_note else "") + ".\n")
    print("| waiters | utilisation | wait p99 / FIFO ideal | store commands a grant (clients; server ops) "
          "| server CPU a grant | gate document | errors | kazoo: utilisation / wait p99 / ZooKeeper CPU a grant |")
    print("|---:|---:|---:|---:|---:|---:|---|---|")
    for ours, zk in rows:
        theirs = "—" if zk is None else (f"{_s(zk.utilisation)} / {'≥ ' if zk.p99_open else ''}{_s(zk.p99)} s / "
                                         f"{_per_grant_ms(zk.cpu, zk.grants)}"
                                         + (f"; errors {_errors(zk.errors)}" if zk.errors else ""))
        print(f"| {ours.depth} ({ours.layout}) | {_s(ours.utilisation)} | {_p99(ours)} | {_s(ours.commands, 1)}; "
              f"{_s(ours.ops, 1)} | {_per_grant_ms(ours.cpu, ours.grants)} | {_bytes(ours.gate)} | "
              f"{_errors(ours.errors)} | {theirs} |")
    print()
    print("| waiters | grants | wait p50 | waits open at the cutoff | Jain: tenants / waiters | tenant shares "
          "t1 / t2 / t3 % (weights 33.3 each) | client memory a waiter | server CPU (share of a core) | "
          "clients' CPU a grant | kazoo: grants / Jain tenants / memory a thread |")
    print("|---:|---:|---:|---:|---:|---|---:|---:|---:|---|")
    for ours, zk in rows:
        theirs = "—" if zk is None else f"{zk.grants} / {_s(zk.jain_tenants, 3)} / {_bytes(zk.memory)}"
        print(f"| {ours.depth} | {ours.grants} | {_s(ours.p50)} s | {ours.open_waits} | "
              f"{_s(ours.jain_tenants, 3)} / {_s(ours.jain_waiters, 3)} | {_shares(ours)} | {_bytes(ours.memory)} | "
              f"{_core(ours.cpu, seconds)} | {_per_grant_ms(ours.client_cpu, ours.grants)} | {theirs} |")
    print()
    if any(ours.late_grants for ours, _ in rows):
        print(f"The window's second half ({seconds / 2:g} s), the first arrivals of every waiter behind (at a depth "
              "whose turn comes later than the window's middle, the whole window counts their writes):\n")
        print("| waiters | utilisation | store commands a grant | server CPU a grant | "
              "kazoo: utilisation / ZooKeeper CPU a grant |")
        print("|---:|---:|---:|---:|---|")
        for ours, zk in rows:
            theirs = "—" if zk is None else f"{_s(zk.late_utilisation)} / {_per_grant_ms(zk.late_cpu, zk.late_grants)}"
            print(f"| {ours.depth} | {_s(ours.late_utilisation)} | {_s(ours.late_commands, 1)} | "
                  f"{_per_grant_ms(ours.late_cpu, ours.late_grants)} | {theirs} |")
        print()
    for ours, _ in rows:
        if ours.names:
            print(f"Depth {ours.depth}, clients' store commands by name, a grant: {ours.names}.\n")
        if ours.lost:
            print(f"Depth {ours.depth}: {ours.lost} process(es) sent no figures (killed at the cutoff).\n")
    sys.stdout.flush()


# --- scenarios --------------------------------------------------------------------------------


def http_threads(args, tickets: int) -> int:
    """A client process's threads: as given, else one for each of its tickets (a long poll
    holds one, as a real client's own connection would) and four more."""
    return args.http_threads or tickets + 4


def _grace(args, depth: int) -> float:
    if args.grace is not None:
        return args.grace
    return min(120.0, 1.5 * max(0, depth - CAP) / CAP * HOLD_S + 5.0)


def _server_pids() -> list[int]:
    return [_setup.SERVER_PID] if _setup.SERVER_PID is not None else []


def _gunicorn_pids(base_url: str) -> list[int]:
    bind = base_url.rsplit("/", 1)[-1].encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if b"gunicorn" in cmdline and bind in cmdline:
                pids.append(int(entry))
    return pids


def run_depth(mode: str, depth: int, args, zk: ZooKeeper | None, http: dict | None) -> tuple[Figures, Figures | None]:
    resource = f"depth{mode}{depth}r{int(time.time()) % 100000}"
    grace = _grace(args, depth)
    define(resource, wait_s=args.seconds + grace + 30)
    waiters = loopers(resource, depth)
    counts = layout(depth)
    groups = spread(waiters, counts)
    layout_text = f"{len(groups)}×{counts[0]}" if len(set(counts)) == 1 else f"{len(groups)} procs"
    print(f"[{time.strftime('%H:%M:%S')}] {mode} depth {depth}: ours ...", file=sys.stderr, flush=True)
    # The middle mark: the second half's figures, once the first arrivals (a burst of `depth`
    # newcomers, whose writes a 30 s window of a deep queue would count) are behind.
    common = dict(marks=[0.0, args.seconds / 2, args.seconds], resources=[resource], window=(0, 2))
    if mode == "threads":
        run = run_processes(threads_child, [(i, g, HOLD_S, grace, 0.0) for i, g in enumerate(groups)], args.seconds,
                            grace, pids=_server_pids(), **common)
    elif mode == "aio":
        layout_text = f"1×{depth} tasks"
        run = run_processes(aio_child, [(0, waiters, HOLD_S, grace, 0.0)], args.seconds, grace,
                            pids=_server_pids(), **common)
    else:
        assert http is not None
        clients = spread(waiters, split(depth, min(args.http_clients, depth)))
        layout_text = f"{len(clients)} clients"
        gunicorn = _gunicorn_pids(http["url"])
        layout_text += f"; server CPU: store + {len(gunicorn)} gunicorn processes"
        run = run_processes(http_child, [(i, http["url"], http["keys"], g, HOLD_S, grace, 0.0,
                                          http_threads(args, len(g)), args.http_poll_wait_ms)
                                         for i, g in enumerate(clients)], args.seconds, grace,
                            pids=_server_pids() + gunicorn, **common)
    ours = figures(run, waiters, depth, layout_text)
    theirs = None
    if zk is not None:
        print(f"[{time.strftime('%H:%M:%S')}] {mode} depth {depth}: kazoo ...", file=sys.stderr, flush=True)
        zk_run = run_processes(kazoo_child, [(i, zk.hosts, g, HOLD_S, grace, 0.0) for i, g in enumerate(groups)],
                               args.seconds, grace, pids=[zk.process.pid] if zk.process is not None else [],
                               marks=[0.0, args.seconds / 2, args.seconds], resources=[], window=(0, 2))
        theirs = figures(zk_run, waiters, depth, layout_text)
    return ours, theirs


def run_idle(args) -> None:
    """Two holders hold all run; N waiters queue after a quiet stretch and wait."""
    n = args.idle_waiters
    waiting_s = args.hold_minutes * 60 if args.hold_minutes else args.seconds
    quiet = min(10.0, max(3.0, waiting_s / 3))
    total = quiet + IDLE_SETTLE_S + waiting_s
    resource = f"depthidle{n}r{int(time.time()) % 100000}"
    define(resource, wait_s=total + 60, ttl_s=int(total + 120))
    holders = [Waiter(i, resource, TENANTS[i % 3], "holder") for i in range(CAP)]
    idle = [Waiter(CAP + i, resource, TENANTS[i % 3], "idle") for i in range(n)]
    counts = split(n, min(MAX_PROCS, max(1, n)))
    groups = [holders] + spread(idle, counts)
    print(f"[{time.strftime('%H:%M:%S')}] idle: {n} waiters ...", file=sys.stderr, flush=True)
    # marks: quiet stretch [1 s, quiet], the waiting stretch [quiet + settle, total], and its
    # part from quiet + IDLE_QUEUED_S (every waiter queued)
    queued_mark = quiet + IDLE_QUEUED_S
    run = run_processes(threads_child, [(i, g, HOLD_S, 2.0, quiet) for i, g in enumerate(groups)], total, 2.0,
                        pids=_server_pids(), marks=[1.0, quiet, quiet + IDLE_SETTLE_S, queued_mark, total],
                        resources=[resource], window=(2, 4))
    quiet_cpu, _, early_cpu, queued_cpu = (run.cpu + [None] * 4)[:4]
    waiting_cpu = None if early_cpu is None or queued_cpu is None else early_cpu + queued_cpu
    quiet_len, waiting_len, queued_len = quiet - 1.0, waiting_s, total - queued_mark
    alone = (None if quiet_cpu is None or waiting_cpu is None
             else waiting_cpu / waiting_len - quiet_cpu / quiet_len)
    errors: Counter = Counter()
    for r in run.results:
        errors.update(r["errors"])
    waiting = [r for r in run.results if r["index"] > 0]
    memory = (sum(r["rss_mid"] - r["rss_before"] for r in waiting) / sum(r["waiters"] for r in waiting)
              if waiting else None)
    commands = sum(r["commands"] or 0 for r in run.results)
    print(f"### Waiting alone: {n} waiters behind {CAP} holders that hold the whole run\n")
    print(f"Quiet stretch {quiet_len:g} s (holders only, the waiters' threads started but not queued), then the "
          f"waiters queue; measured stretch {waiting_len:g} s from {IDLE_SETTLE_S:g} s after they queued.\n")
    print("| figure | measured |")
    print("|---|---:|")
    print(f"| store CPU, quiet stretch (share of a core) | {_core(quiet_cpu, quiet_len)} |")
    print(f"| store CPU, {n} waiting (share of a core) | {_core(waiting_cpu, waiting_len)} |")
    print(f"| store CPU of waiting alone (difference, share of a core) | "
          f"{'—' if alone is None else f'{100 * alone:.1f} %'} |")
    print(f"| clients' store commands a second while waiting | {commands / waiting_len:.0f} |")
    print(f"| server ops a second while waiting (opcounters) | "
          f"{'—' if run.ops is None else f'{run.ops / waiting_len:.0f}'} |")
    print(f"| gate document at the end | {_bytes(max(run.gate) if run.gate else None)} |")
    print(f"| client memory a waiting thread | {_bytes(memory)} |")
    print(f"| errors | {_errors(errors)} |")
    print(f"| processes without figures | {run.lost} |")
    if queued_len > 0:
        queued_alone = (None if quiet_cpu is None or queued_cpu is None
                        else queued_cpu / queued_len - quiet_cpu / quiet_len)
        queued_commands = sum((r.get("idle_queued") or (0, {}))[0] for r in run.results)
        print(f"| from {IDLE_QUEUED_S:g} s after they queued ({queued_len:g} s, every waiter queued): store CPU of "
              f"waiting alone | {'—' if queued_alone is None else f'{100 * queued_alone:.1f} %'} |")
        print(f"| from {IDLE_QUEUED_S:g} s after they queued: clients' store commands a second | "
              f"{queued_commands / queued_len:.0f} |")
    print()
    stretches = [("while waiting", waiting_len, lambda r: r["names"])]
    if queued_len > 0:
        stretches.append((f"from {IDLE_QUEUED_S:g} s after they queued", queued_len,
                          lambda r: (r.get("idle_queued") or (0, {}))[1]))
    for what, length, names_of in stretches:
        names: Counter = Counter()
        for r in run.results:
            names.update(names_of(r))
        if names:
            print(f"Clients' store commands a second {what}, by name: "
                  + ", ".join(f"{name} {c / length:.1f}" for name, c in names.most_common() if c / length >= 0.05)
                  + ".\n")
    sys.stdout.flush()


def run_resources(args) -> None:
    r_count, k = args.resources, args.per_resource
    grace = _grace(args, k)
    stamp = int(time.time()) % 100000
    resources = [f"depthres{stamp}n{i}" for i in range(r_count)]
    for resource in resources:
        define(resource, wait_s=args.seconds + grace + 30)
    n = r_count * k
    # waiter w on resource w % R: every process has waiters of many resources
    waiters = [Waiter(w, resources[w % r_count], TENANTS[(w // r_count) % 3]) for w in range(n)]
    groups = spread(waiters, split(n, min(MAX_PROCS, n)))
    print(f"[{time.strftime('%H:%M:%S')}] resources: {r_count} × {k} ...", file=sys.stderr, flush=True)
    run = run_processes(threads_child, [(i, g, HOLD_S, grace, 0.0) for i, g in enumerate(groups)], args.seconds,
                        grace, pids=_server_pids(), marks=[0.0, args.seconds], resources=resources, window=(0, 1))
    f = figures(run, waiters, k, f"{len(groups)} procs", resources=resources)
    per = f.per_resource
    print(f"### {r_count} resources × {k} waiters each ({n} threads in {len(groups)} processes)\n")
    print(f"Each resource `levels: {{global: {CAP}}}`, hold {HOLD_S * 1000:g} ms, {args.seconds:g} s window; "
          "compare each resource's utilisation with a single resource at depth "
          f"{k} (`--depths {k}`).\n")
    print("| figure | measured |")
    print("|---|---:|")
    print(f"| utilisation per resource: min / p10 / median / max | {_s(per[0] if per else None)} / "
          f"{_s(percentile(per, 0.1))} / {_s(percentile(per, 0.5))} / {_s(per[-1] if per else None)} |")
    print(f"| resources at utilisation ≥ 0.90 | {sum(1 for u in per if u >= 0.90)} of {len(per)} |")
    print(f"| grants (all resources) | {f.grants} |")
    print(f"| wait p99 / FIFO ideal (per resource) | {_p99(f)} |")
    print(f"| store commands a grant (clients; server ops) | {_s(f.commands, 1)}; {_s(f.ops, 1)} |")
    print(f"| server CPU a grant; share of a core | {_per_grant_ms(f.cpu, f.grants)}; {_core(f.cpu, args.seconds)} |")
    print(f"| gate documents at the end: largest | {_bytes(max(run.gate) if run.gate else None)} |")
    print(f"| Jain over tenants | {_s(f.jain_tenants, 3)} |")
    print(f"| client memory a waiting thread | {_bytes(f.memory)} |")
    print(f"| clients' CPU in the window (share of a core; {n} threads on {os.cpu_count()} CPUs) | "
          f"{_core(f.client_cpu, args.seconds)} |")
    print(f"| errors | {_errors(f.errors)} |")
    print(f"| processes without figures | {run.lost} |")
    print()
    sys.stdout.flush()


def _http_server(stack, args) -> dict:
    """gunicorn on this store with one API key per tenant."""
    from insights.models import Tenant
    from leases.api import keys
    from tests.http_server import running_server

    keyset = {}
    for tenant in TENANTS:
        Tenant.objects.get_or_create(slug=tenant, defaults={"name": tenant})  # keys name existing tenants
        keyset[tenant] = keys.create_key(tenant_id=tenant, name="bench-depth", acting_user="bench")[1]
    # A long poll holds a server thread: at most half of each worker's, the rest serve the
    # releases, acquires and plain polls.
    long_polls = str(max(1, args.http_server_threads // 2))
    return {"url": stack.enter_context(running_server(workers=args.http_workers, threads=args.http_server_threads,
                                                      env={"LEASES_HTTP_LONG_POLLS": long_polls})),
            "keys": keyset}


def main() -> None:
    from contextlib import ExitStack

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", default="threads", help="comma-separated: threads, aio, http")
    parser.add_argument("--depths", default=None, help="comma-separated waiter counts (default 12,96,384,1000)")
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window per run")
    parser.add_argument("--grace", type=float, default=None,
                        help="seconds after the window for the last waits (default 1.5 × FIFO ideal + 5, ≤ 120)")
    parser.add_argument("--no-zk", action="store_true", help="skip the kazoo/ZooKeeper side")
    parser.add_argument("--error-pause", type=float, default=ERROR_PAUSE_S,
                        help="seconds a waiter pauses after a failed acquire before it tries again (default 0.05)")
    parser.add_argument("--idle-waiters", type=int, default=0, help="waiting-alone scenario with N waiters")
    parser.add_argument("--hold-minutes", type=float, default=0.0,
                        help="waiting-alone scenario: minutes the holders hold after the waiters queued "
                             "(default --seconds)")
    parser.add_argument("--resources", type=int, default=0, help="many-resources scenario: R resources")
    parser.add_argument("--per-resource", type=int, default=100, help="many-resources scenario: waiters each")
    parser.add_argument("--http-clients", type=int, default=4, help="http mode: client processes")
    parser.add_argument("--http-threads", type=int, default=None,
                        help="http mode: threads a client process (default: one a ticket it keeps, + 4)")
    parser.add_argument("--http-poll-wait-ms", type=int, default=5000,
                        help="http mode: each ticket poll's waitMs (a long poll; 0: plain polls at Retry-After)")
    parser.add_argument("--http-workers", type=int, default=4, help="http mode: gunicorn workers")
    parser.add_argument("--http-server-threads", type=int, default=8, help="http mode: threads a gunicorn worker")
    args = parser.parse_args()
    os.environ["BENCH_DEPTH_ERROR_PAUSE_S"] = str(args.error_pause)  # the children's pause
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if any(m not in ("threads", "aio", "http") for m in modes):
        parser.error("modes: threads, aio, http")
    scenario = args.idle_waiters > 0 or args.resources > 0
    depth_text = args.depths if args.depths is not None else ("" if scenario else "12,96,384,1000")
    depths = [int(d) for d in depth_text.split(",") if d.strip()]
    if any(d < 1 for d in depths):
        parser.error("depths must be positive")

    external = bool(os.environ.get("MONGODB_URI"))
    setup("bench_depth")
    from leases.store import client as store

    store.client().drop_database(store.database_name())
    register_bench_handler()

    zk: ZooKeeper | None = None
    zk_note = "--no-zk given" if args.no_zk else ("no depths" if not depths else "")
    if not args.no_zk and depths:
        zk = ZooKeeper()
        try:
            zk.start()
        except RuntimeError as exc:
            zk_note = f"ZooKeeper could not start: {exc}"
            zk.stop()
            zk = None
    store_note = "MongoDB: " + ("MONGODB_URI" if external else "embedded server (own process)")
    print(f"hold {HOLD_S * 1000:g} ms; window {args.seconds:g} s a run; modes {', '.join(modes)}; depths "
          f"{depth_text or '—'}; {store_note}; ZooKeeper: {zk.hosts if zk else 'none (' + zk_note + ')'}; "
          f"error pause {args.error_pause:g} s; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
          f"server speed {calibration(store.client_options()[0])}\n")
    sys.stdout.flush()
    try:
        with ExitStack() as stack:
            for mode in modes if depths else []:
                http = _http_server(stack, args) if mode == "http" else None
                rows = []
                for depth in depths:
                    try:
                        rows.append(run_depth(mode, depth, args, zk, http))
                    except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others' table
                        print(f"{mode} depth {depth} failed: {exc!r}", file=sys.stderr, flush=True)
                        rows.append((Figures(depth=depth, layout="failed", errors=Counter({repr(exc)[:80]: 1})), None))
                print_mode(mode, rows, args.seconds, zk_note, store_note + (f"; gunicorn {args.http_workers} workers × "
                           f"{args.http_server_threads} threads, {args.http_clients} client processes × "
                           f"{args.http_threads or 'a thread a ticket + 4'} threads" if mode == "http" else ""))
            if args.idle_waiters > 0:
                run_idle(args)
            if args.resources > 0:
                run_resources(args)
    finally:
        if zk is not None:
            zk.stop()


if __name__ == "__main__":
    main()
