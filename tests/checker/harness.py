"""One checker run: real client processes on this run's own store and Redis, faults, the history.

The caller starts the store server (``leases.store.embedded.start_server``: its own, never the
session's shared one, since it gets SIGSTOPped) and points this process's Django at it; this
module writes the lease definition, starts a private redis-server, the clients
(``tests.workers.history_client``, ``per_tenant`` per tenant, one user each), injects the
faults of :mod:`tests.checker.faults` one after another with a pause between them, stops the
clients and returns the merged history. Used by tests/test_checker_run.py (short) and
bench/bench_pauses.py (minutes).

Groups of clients, each on a lease definition of its own (a process's name starts with its
group's prefix, and :meth:`tests.checker.history.History.only` judges one group):

* ``t`` — ``pauses``: ``levels`` (``{global: 2, tenant: 1}``), ``tenants`` x ``per_tenant``;
* ``f`` — ``pauses-fenced`` (``fenced_tenants`` > 0): ``{global: 2, project: 2}`` with
  ``fence: project``, a narrower fence counter of cap 2 (each tenant one project), so a
  booking that finds the gate full gives the project level back and books it again at its
  turn — where one booking could be recorded on two fence slots;
* ``h`` — with ``http-vanish`` among the kinds: HTTP clients (``tests.workers.http_ticket_client``
  through a gunicorn of this run) on ``pauses-kept`` (``{global: 1}``, TTL ``KEPT_TTL_S``,
  longer than a kept ticket's poll deadline) that take a ticket and vanish before or after
  its grant; not judged by the history rules (they hold nothing they check), but by
  :func:`tests.checker.slots.kept_past_deadline` (the slot comes back at the poll deadline).

With ``reply-lost`` among the kinds the clients reach the store through
:class:`tests.checker.proxy.ReplyDropper`; with ``sweep_s`` the run sweeps like the beat
does (``lease sweep --force`` every ``sweep_s``), so an idle reap meets waiters that wait
longer than the TTL; at the end (``audit_slots``) :mod:`tests.checker.slots` sweeps and
judges "every slot comes back".
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.checker import faults as f, slots
from tests.checker.history import CLIENT_SUFFIX, History, load
from tests.checker.proxy import DropStats, ReplyDropper

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LEASE = "pauses"
FENCED_LEASE = "pauses-fenced"
FENCED_LEVELS = {"global": 2, "project": 2}
KEPT_LEASE = "pauses-kept"
KEPT_TTL_S = 8  # well past a kept ticket's poll deadline (3 x HTTP_POLL_SECONDS): the two are told apart
HTTP_POLL_SECONDS = 1
#: In turn (tests.workers.http_ticket_client): hold 3 s and release (the release grants the
#: next ticket in its own command), vanish right after queueing (a grant between polls that
#: never come: back by the poll deadline), vanish once granted (a lease: back after its TTL),
#: vanish at position 1.
HTTP_MODES = ("hold", "before", "granted", "after")
#: One of each, in this order, then again (the short run in the suite does each once).
KINDS = ("holder-stop", "store-stop", "waiter-stop", "kill", "redis-restart", "stall")
#: The faults of issue 34: a write applied and its answer lost, a holder keeping its slot
#: long enough that others wait past the TTL, Redis stopped (SIGSTOP) for ``redis_stop_s``.
NEW_KINDS = ("reply-lost", "long-hold", "redis-stop", "http-vanish")
ALL_KINDS = KINDS + NEW_KINDS
# Clients finish their cycle after the stop file; the history ends at the stop file, so a
# client still busy after this is killed (its call in flight stays indeterminate, harmless).
STOP_TIMEOUT_S = 2.0


class HarnessError(AssertionError):
    """The run itself went wrong (a client crashed, never started): not a verdict on the engine."""


@dataclass
class RunConfig:
    """What one run does; the defaults are the issue's setting (a starving tenant was seen there)."""

    seconds: float = 40.0  # from the moment every first client is ready
    tenants: int = 3
    per_tenant: int = 2
    levels: dict[str, int] = field(default_factory=lambda: {"global": 2, "tenant": 1})
    ttl_s: int = 2
    wait_ms: int = 15000
    mongo_timeout_ms: int = 1500
    redis_down_s: float = 1.0
    fault_gap_s: tuple[float, float] = (2.0, 3.0)  # quiet time between two faults
    kinds: tuple[str, ...] = KINDS
    seed: int = 19
    ready_timeout_s: float = 90.0
    fenced_tenants: int = 0  # tenants of the fenced group (per_tenant clients each)
    reply_lost_s: float = 2.0  # a reply-lost burst: each write's answer lost with reply_lost_rate
    reply_lost_rate: float = 0.3
    hold_ttls: float = 2.5  # a long hold: this many TTLs
    redis_stop_s: float = 5.0  # SIGSTOP of Redis (runs beside the other faults)
    sweep_s: float | None = None  # the operator's sweep this often during the run (None: never)
    http_modes: tuple[str, ...] = HTTP_MODES  # http-vanish: the HTTP clients' modes, in turn
    fault_margin_s: float | None = None  # a fault starts only this long before the end (None: TTL + 2.6 s)
    check_after_failed_release: bool = True  # a client checks its lease after a release that failed
    audit_slots: bool = True  # "every slot comes back": the counters read every 0.5 s ...
    final_audit: bool = True  # ... and, once what the clients left has expired, a sweep and the audit

    def stop_seconds(self, rng: random.Random) -> float:
        """A holder, waiter or stall stop: longer than the TTL (the issue's 2.6–3.6 s for TTL 2 s)."""
        return rng.uniform(self.ttl_s + 0.6, self.ttl_s + 1.6)

    def waiter_stop_seconds(self, rng: random.Random) -> float:
        """A whole waiting process stopped past the ticket TTL too (its process's heartbeat
        lapses, so all its tickets go stale and it must queue again when continued)."""
        from leases.conf import lease_settings

        longest = max(self.ttl_s, int(lease_settings.TICKET_TTL_MS) / 1000)
        return rng.uniform(longest + 0.5, longest + 1.5)


@dataclass
class RunResult:
    history: History
    faults: dict[str, int]  # injected, by kind
    clients: int  # processes started, replacements included
    seconds: float  # the faulted run, from ready to the stop file
    startup_s: float  # from the first spawn to every first client ready
    shutdown_s: float  # from the stop file to the last client gone
    slot_problems: list[slots.SlotProblem] = field(default_factory=list)  # "every slot comes back"
    audit: dict = field(default_factory=dict)  # the final sweep's tallies, the monitor's reads
    drops: DropStats | None = None  # the proxy's figures (reply-lost)
    sweeps: int = 0  # operator sweeps during the run


class Clients:
    """The client processes; a killed one is replaced under a new name (``t1-a.1`` after ``t1-a.0``)."""

    def __init__(self, run_dir: str, env: dict[str, str], config: RunConfig) -> None:
        self.run_dir, self.env, self.config = run_dir, env, config
        self.procs: dict[str, subprocess.Popen] = {}
        self.live: list[str] = []
        self.killed: set[str] = set()

    def spawn(self, tenant: int, member: int, generation: int = 0, group: str = "t") -> str:
        name = f"{group}{tenant}-{'abcdefghij'[member]}.{generation}"
        lease = FENCED_LEASE if group == "f" else LEASE
        with open(os.path.join(self.run_dir, name + ".err"), "w") as err:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "tests.workers.history_client", name, self.run_dir, lease, f"{group}{tenant}",
                 "p1", f"u{tenant}{member}", str(self.config.wait_ms), str(self.config.seed * 1000 + len(self.procs))],
                cwd=REPO, env=self.env, stdout=subprocess.DEVNULL, stderr=err)
        self.live.append(name)
        return name

    def ready(self, name: str) -> bool:
        path = os.path.join(self.run_dir, name + CLIENT_SUFFIX)
        return os.path.exists(path) and os.path.getsize(path) > 0

    def kill(self, name: str) -> float:
        """``kill -9`` ``name``, start its replacement; returns the kill's instant."""
        proc = self.procs[name]
        at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.live.remove(name)
        self.killed.add(name)
        base, generation = name.rsplit(".", 1)
        self.spawn(int(base[1:base.index("-")]), "abcdefghij".index(base[-1]), int(generation) + 1, base[0])
        return at

    def crashed(self) -> list[str]:
        return [n for n in self.live if self.procs[n].poll() is not None]

    def stderr(self, name: str) -> str:
        with open(os.path.join(self.run_dir, name + ".err"), errors="replace") as err:
            return err.read()[-3000:]

    def shutdown(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # never leave one stopped
                proc.kill()
                proc.wait(10)


@dataclass
class _Faulting:
    """What the injector acts on besides the clients."""

    store_pid: int
    redis: f.RestartableRedis
    proxy: ReplyDropper | None = None
    freeze: f.RedisFreeze | None = None
    http: tuple[str, str] | None = None  # (base URL, API key) of this run's HTTP server
    long_holds: dict[str, float] = field(default_factory=dict)  # client -> when its long hold ends
    vanishers: list[subprocess.Popen] = field(default_factory=list)


def _inject(kind: str, clients: Clients, log: f.FaultLog, rng: random.Random, config: RunConfig,
            on: _Faulting) -> bool:
    """Inject one fault of ``kind``; False if no suitable target showed up in a few seconds."""
    if kind == "store-stop":
        f.stop_store(log, on.store_pid, config.mongo_timeout_ms / 1000 + 0.3)
        return True
    frozen = on.freeze is not None and on.freeze.active()
    if kind == "redis-restart":
        if frozen:
            return False  # Redis is stopped right now: a restart would end that fault early
        f.restart_redis(log, on.redis, config.redis_down_s)
        return True
    if kind == "redis-stop":
        if frozen:
            return False
        on.freeze = f.RedisFreeze(log, on.redis, config.redis_stop_s)
        return True
    if kind == "reply-lost":
        if on.proxy is None:
            return False
        f.lose_replies(log, on.proxy, config.reply_lost_s, config.reply_lost_rate)
        return True
    if kind == "http-vanish":
        if on.http is None:
            return False
        n = len(on.vanishers)
        mode = config.http_modes[n % len(config.http_modes)]
        name = f"h{n}.{mode}"
        on.vanishers.append(subprocess.Popen(
            [sys.executable, "-m", "tests.workers.http_ticket_client", mode, os.path.join(clients.run_dir, name + ".log"),
             *on.http, KEPT_LEASE, "p1", f"hu{n}"], cwd=REPO, env=clients.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        log.record("http-vanish", name, time.monotonic(), None)
        return True
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        states = {n: f.refresh(clients.run_dir, n, f.ClientState()) for n in clients.live if clients.ready(n)}
        holding = [n for n, s in states.items() if s.holding]
        waiting = [n for n, s in states.items()
                   if s.waiting_since is not None and time.monotonic() - s.waiting_since > 0.2]
        if kind == "kill" and (holding or states):
            victim = rng.choice(holding or sorted(states))
            log.record("kill", victim, clients.kill(victim), None)
            return True
        if kind == "stall" and holding:
            name = rng.choice(holding)
            if f.stall_client(log, clients.run_dir, name, clients.procs[name].pid, config.stop_seconds(rng)):
                return True
        # One long hold at a time: two at once on a level of cap 2 leave the others no slot
        # for 5 s at a stretch, again and again, and the liveness window (W) would measure
        # the fault's own load, not the engine.
        free = holding if max(on.long_holds.values(), default=0.0) < time.monotonic() else []
        if kind == "long-hold" and free:
            name = rng.choice(free)
            seconds = config.hold_ttls * config.ttl_s
            f.ask_long_hold(log, clients.run_dir, name, seconds)
            on.long_holds[name] = time.monotonic() + seconds + 1.0
            return True
        if kind in ("holder-stop", "waiter-stop"):
            pool = holding if kind == "holder-stop" else waiting
            if pool:
                name = rng.choice(pool)
                want = kind.split("-")[0]
                seconds = config.stop_seconds(rng) if want == "holder" else config.waiter_stop_seconds(rng)
                if f.stop_client(log, clients.run_dir, name, clients.procs[name].pid, seconds, want) == kind:
                    return True
        time.sleep(0.05)
    return False


class _Sweeper:
    """The operator's sweep (``lease sweep --force``: idle reap, dead-pod reap, reconcile) every
    ``period`` seconds in a thread, straight to the store (never through the proxy), as the
    beat runs it; a round that meets a stopped store is skipped."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.rounds = 0
        self.errors: list[str] = []  # the rounds that failed (a stopped store), for the report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sweeper", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from leases.upkeep import rounds

        while not self._stop.wait(self.period):
            try:
                rounds.sweep_without_handlers()
                self.rounds += 1
            except Exception as exc:  # noqa: BLE001 - the store stopped: the next round tries again
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def put_definitions(config: RunConfig) -> None:
    """Write the run's lease definitions (the main one, and the fenced one when it has clients)."""
    from leases.definitions import layers as lease_config
    from leases.definitions.model import document_path

    def put(name: str, levels: dict[str, int], extra: str = "", ttl_s: int = config.ttl_s) -> None:
        caps = ", ".join(f"{level}: {cap}" for level, cap in levels.items())
        lease_config.put_document("_vance", "_tenant", document_path(name),
                                  f"levels: {{{caps}}}\nttlSeconds: {ttl_s}\nwaitMs: {config.wait_ms}{extra}")

    put(LEASE, config.levels)
    if config.fenced_tenants:
        put(FENCED_LEASE, FENCED_LEVELS, "\nfence: project")
    if "http-vanish" in config.kinds:
        put(KEPT_LEASE, {"global": 1}, ttl_s=KEPT_TTL_S)


def _kill_if_running(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def _start_http(stack: ExitStack, env: dict[str, str], direct_uri: str) -> tuple[str, str]:
    """This run's gunicorn (one worker, four threads) and an API key of tenant ``h1`` on its store
    (made by a child process while the server starts: both set Django up)."""
    from tests.http_server import running_server

    maker = subprocess.Popen([sys.executable, "-m", "tests.workers.http_ticket_client", "key", "h1", "p1"],
                             cwd=REPO, env={**env, "MONGODB_URI": direct_uri}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    stack.callback(_kill_if_running, maker)
    keys = {k: env[k] for k in ("MONGODB_URI", "MONGODB_DB", "LEASES_REDIS_URL", "LEASES_MONGO_TIMEOUT_MS")}
    base = stack.enter_context(running_server(workers=1, threads=4, env={
        **keys, "LEASES_TICKET_POLL_SECONDS": str(HTTP_POLL_SECONDS)}))
    out, err = maker.communicate(timeout=60)
    if maker.returncode != 0:
        raise HarnessError(f"no API key: {err[-2000:]}")
    return base, out.strip().splitlines()[-1]


def _end_vanishers(on: _Faulting) -> None:
    for proc in on.vanishers:
        _kill_if_running(proc)


def settle_seconds(config: RunConfig) -> float:
    """How long a client gone leaves anything behind legitimately: a holder's TTL (an HTTP
    client that vanished after hearing its grant holds a lease of ``KEPT_TTL_S``), a ticket's
    TTL (``LEASES_TICKET_TTL_MS``), and a second of slack."""
    from leases.conf import lease_settings

    kept = KEPT_TTL_S if "http-vanish" in config.kinds else 0
    return max(config.ttl_s, int(lease_settings.TICKET_TTL_MS) / 1000, kept) + 1.0


def run(config: RunConfig, *, run_dir: str, store_pid: int, mongo_uri: str, db_name: str) -> RunResult:
    """Run the clients under faults for ``config.seconds``; the merged history of ``run_dir``.

    Django in this process must already point at the store ``mongo_uri`` (server ``store_pid``).

    Raises:
        HarnessError: a client crashed or did not start in time.
    """
    from leases.store.embedded import free_port

    put_definitions(config)
    rng = random.Random(config.seed)
    redis_server = f.RestartableRedis(free_port())
    redis_server.start()
    proxy = None
    if "reply-lost" in config.kinds:
        parts = urlsplit(mongo_uri)
        proxy = ReplyDropper((parts.hostname or "127.0.0.1", parts.port or 27017), seed=config.seed)
    on = _Faulting(store_pid=store_pid, redis=redis_server, proxy=proxy)
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": "config.settings", "MONGODB_URI": proxy.uri if proxy else mongo_uri,
        "MONGODB_DB": db_name,
        "PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", ""), "LEASES_REDIS_URL": redis_server.url,
        "LEASES_MONGO_TIMEOUT_MS": str(config.mongo_timeout_ms), "LEASES_POD_AUTOSTART": "0",
        "DJANGO_LOG_LEVEL": "ERROR", "PYTHONUNBUFFERED": "1",
        "HISTORY_CHECK_AFTER_FAILED_RELEASE": "1" if config.check_after_failed_release else "0",
    })
    clients = Clients(run_dir, env, config)
    log = f.FaultLog(run_dir)
    monitor = slots.Monitor() if config.audit_slots else None
    sweeper: _Sweeper | None = None
    stack = ExitStack()
    spawned = time.monotonic()
    try:
        if "http-vanish" in config.kinds:
            on.http = _start_http(stack, env, mongo_uri)
        for group, tenants in (("t", config.tenants), ("f", config.fenced_tenants)):
            for tenant in range(1, tenants + 1):
                for member in range(config.per_tenant):
                    clients.spawn(tenant, member, group=group)
        deadline = time.monotonic() + config.ready_timeout_s
        while not all(clients.ready(n) for n in clients.live):
            if clients.crashed() or time.monotonic() > deadline:
                bad = clients.crashed() or [n for n in clients.live if not clients.ready(n)]
                raise HarnessError(f"client {bad[0]} did not start: {clients.stderr(bad[0])}")
            time.sleep(0.05)
        started = time.monotonic()
        if monitor is not None:
            monitor.start()
        if config.sweep_s:
            sweeper = _Sweeper(config.sweep_s)
        end = started + config.seconds
        next_fault = started + rng.uniform(*config.fault_gap_s)
        index = 0
        while time.monotonic() < end:
            if clients.crashed():
                name = clients.crashed()[0]
                raise HarnessError(f"client {name} exited: {clients.stderr(name)}")
            # a fault starts only if it ends (longest: a stop) with a quiet second left in the run
            margin = config.ttl_s + 2.6 if config.fault_margin_s is None else config.fault_margin_s
            if config.kinds and time.monotonic() >= next_fault and time.monotonic() + margin < end:
                _inject(config.kinds[index % len(config.kinds)], clients, log, rng, config, on)
                index += 1
                next_fault = time.monotonic() + rng.uniform(*config.fault_gap_s)
            time.sleep(0.05)
        ended = time.monotonic()
        open(os.path.join(run_dir, "stop"), "w").close()
        stop_deadline = time.monotonic() + STOP_TIMEOUT_S
        for name in list(clients.live):
            try:
                clients.procs[name].wait(max(0.1, stop_deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass  # killed below; its last call stays indeterminate
        clients.shutdown()
        _end_vanishers(on)
        gone = time.monotonic()  # what a client left behind is dated from here
        if on.freeze is not None:
            on.freeze.end()
        if monitor is not None and on.http is not None:
            # A ticket left at its poll deadline must not be seen booked past it (+ slack); the
            # beat's sweep goes on meanwhile (it does not stop because the clients did).
            time.sleep(max(0.0, 3.0 * HTTP_POLL_SECONDS + 1.5 - (time.monotonic() - gone)))
        if sweeper is not None:
            sweeper.stop()
        history = load(run_dir, ended=ended)
        shutdown_s = time.monotonic() - ended
        problems: list[slots.SlotProblem] = []
        audit: dict = {}
        if monitor is not None:
            monitor.stop()
            problems.extend(monitor.problems)
            audit = {"monitor_reads": monitor.reads}
            if config.final_audit:
                # Every client is gone: once what they leave legitimately has expired, the sweep
                # must bring every slot back.
                time.sleep(max(0.0, settle_seconds(config) - (time.monotonic() - gone)))
                audit.update(slots.final_sweep())
                problems.extend(slots.final_audit(all_gone=True))
            problems.extend(slots.kept_past_deadline(run_dir, monitor.last_booked, keep_s=3.0 * HTTP_POLL_SECONDS,
                                                     ttl_s=KEPT_TTL_S))
        return RunResult(history=history, faults=dict(log.counts), clients=len(clients.procs),
                         seconds=ended - started, startup_s=started - spawned, shutdown_s=shutdown_s,
                         slot_problems=problems, audit=audit, drops=proxy.stats if proxy else None,
                         sweeps=sweeper.rounds if sweeper else 0)
    finally:
        clients.shutdown()
        _end_vanishers(on)
        stack.close()
        if on.freeze is not None:
            on.freeze.end()
        if sweeper is not None:
            sweeper.stop()
        if monitor is not None:
            monitor.stop()
        if proxy is not None:
            proxy.close()
        redis_server.stop()
