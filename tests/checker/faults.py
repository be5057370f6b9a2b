"""The fault injector of the test process; every fault window is recorded in monotonic time.

Kinds (the ``kind`` of a :class:`tests.checker.history.Fault`):

* ``holder-stop`` / ``waiter-stop`` — SIGSTOP of a client process that holds a lease / waits
  in ``acquire``, for longer than the TTL (a waiter: also than the ticket TTL, so its
  process's heartbeat lapses, its tickets are dropped and it queues again), then SIGCONT. Whether it held or waited is read
  from its own history file *after* it stopped (the file cannot move then); a stop that found
  it doing neither is recorded as ``client-stop`` and ended at once.
* ``stall`` — the stop-the-world pause between a successful check and the use: the client
  stops itself (``<name>.stall`` asks it to); the window runs from when the injector sees it
  stopped to the SIGCONT.
* ``store-stop`` — SIGSTOP of this run's own store server for just over
  ``LEASES_MONGO_TIMEOUT_MS``.
* ``kill`` — ``kill -9`` of a client (a holder if one can be found); ``end`` is None. The
  harness starts a replacement under a new name.
* ``redis-restart`` — ``kill -9`` of this run's private redis-server, restarted on the same
  port; the window ends when it answers again.
* ``reply-lost`` — for a burst, each write command's reply is lost with a probability (the
  server applied it; the client's connection drops): :mod:`tests.checker.proxy`.
* ``long-hold`` — a holder keeps its lease for a few TTLs, renewing it, so the others wait
  longer than the TTL (with the run's sweeps reaping what is idle meanwhile). The holder
  stays live: nothing is excused by it.
* ``redis-stop`` — SIGSTOP of the private redis-server for ``redis_stop_s`` (minutes in the
  bench), beside the other faults; its connections hang rather than being refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

import redis

from tests.checker.history import CLIENT_SUFFIX, FAULTS_FILE

STALL_SEEN_TIMEOUT_S = 10.0  # a client asked to stall stops at its next successful check


class RestartableRedis:
    """A redis-server of this run alone on a fixed free port (no persistence), killable and restartable."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> None:
        """Start it and wait until it answers a PING.

        Raises:
            redis.ConnectionError: it did not answer within ``timeout`` seconds.
        """
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                redis.Redis.from_url(self.url, socket_timeout=1).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.02)  # redis-server gives no readiness event but its port

    def kill(self) -> None:
        """``kill -9`` it (what a crash of the host or the OOM killer does)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@dataclass
class ClientState:
    """What a client's own history says it is doing (the injector's target choice only)."""

    holding: bool = False
    waiting_since: float | None = None  # invocation of an acquire not completed yet
    offset: int = 0
    pending: dict[int, str] = field(default_factory=dict)  # call number -> op, invoked not completed


def refresh(run_dir: str, name: str, state: ClientState) -> ClientState:
    """Read the complete lines ``name`` appended since the last call into ``state``."""
    path = os.path.join(run_dir, name + CLIENT_SUFFIX)
    try:
        with open(path, encoding="utf-8") as handle:
            handle.seek(state.offset)
            chunk = handle.read()
    except FileNotFoundError:
        return state
    complete = chunk[:chunk.rfind("\n") + 1]
    state.offset += len(complete.encode("utf-8"))
    for raw in complete.splitlines():
        line = json.loads(raw)
        if line["ev"] == "invoke":
            state.pending[line["n"]] = line["op"]
            if line["op"] == "acquire":
                state.waiting_since = line["at"]
            elif line["op"] == "release":
                state.holding = False
        elif line["ev"] == "complete":
            op = state.pending.pop(line["n"], "")
            if op == "acquire":
                state.waiting_since = None
                state.holding = line["outcome"] == "ok"
            elif op == "check" and line["outcome"] == "lost":
                state.holding = False
    return state


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is in the stopped state (``T`` in /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "T"
    except (FileNotFoundError, IndexError):
        return False


class FaultLog:
    """Appends fault windows to ``<run_dir>/faults.jsonl`` (flushed per window)."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, FAULTS_FILE)
        self.counts: dict[str, int] = {}

    def record(self, kind: str, target: str, start: float, end: float | None) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"kind": kind, "target": target, "start": start, "end": end}) + "\n")
        self.counts[kind] = self.counts.get(kind, 0) + 1


def stop_client(log: FaultLog, run_dir: str, name: str, pid: int, seconds: float, want: str) -> str:
    """SIGSTOP client ``name`` for ``seconds`` if it is doing ``want`` (``holder``/``waiter``) once stopped.

    Returns:
        The kind recorded: ``holder-stop``, ``waiter-stop`` or ``client-stop`` (neither: continued at once).
    """
    os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    state = refresh(run_dir, name, ClientState())  # the whole file: it cannot move while stopped
    doing = "holder" if state.holding else "waiter" if state.waiting_since is not None else "client"
    if doing == want:
        time.sleep(max(0.0, seconds - (time.monotonic() - start)))
    os.kill(pid, signal.SIGCONT)
    kind = f"{doing}-stop"
    log.record(kind, name, start, time.monotonic())
    return kind


def stall_client(log: FaultLog, run_dir: str, name: str, pid: int, seconds: float) -> bool:
    """Ask ``name`` to stop itself after its next successful check; continue it ``seconds`` later.

    Returns:
        False if it did not stop within :data:`STALL_SEEN_TIMEOUT_S` (the request is withdrawn).
    """
    request = os.path.join(run_dir, name + ".stall")
    open(request, "w").close()
    deadline = time.monotonic() + STALL_SEEN_TIMEOUT_S
    withdrawn = False
    while not is_stopped(pid):
        if time.monotonic() > deadline:
            if withdrawn:
                return False  # took the request but never stopped: nothing to record
            withdrawn = True
            try:
                os.remove(request)
                return False
            except FileNotFoundError:  # taken just now: it is stopping itself, give it a moment
                deadline = time.monotonic() + 1.0
        time.sleep(0.005)
    start = time.monotonic()
    time.sleep(seconds)
    os.kill(pid, signal.SIGCONT)
    log.record("stall", name, start, time.monotonic())
    return True


def stop_store(log: FaultLog, pid: int, seconds: float) -> None:
    """SIGSTOP the store server for ``seconds``."""
    os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    log.record("store-stop", "store", start, time.monotonic())


def restart_redis(log: FaultLog, server: RestartableRedis, down_s: float) -> None:
    """``kill -9`` the private Redis; start it again on its port after ``down_s``."""
    start = time.monotonic()
    server.kill()
    time.sleep(down_s)
    server.start()
    log.record("redis-restart", "redis", start, time.monotonic())


def lose_replies(log: FaultLog, proxy, seconds: float, rate: float) -> None:
    """For ``seconds``, lose each write's reply with probability ``rate`` (the write is applied:
    :class:`tests.checker.proxy.ReplyDropper`); the window is recorded when it ends."""
    start = time.monotonic()
    proxy.arm(seconds, rate)
    time.sleep(seconds)
    log.record("reply-lost", "store", start, time.monotonic())


def ask_long_hold(log: FaultLog, run_dir: str, name: str, seconds: float) -> None:
    """Ask holder ``name`` to keep its lease for ``seconds``, renewing it (``<name>.hold``).

    Not a stop: the holder stays live and renews, so the others' waits are the engine's to
    bear; the window is recorded as asked (the client takes it at its next check, within a
    hold step).
    """
    with open(os.path.join(run_dir, name + ".hold"), "w") as handle:
        handle.write(f"{seconds:.3f}")
    start = time.monotonic()
    log.record("long-hold", name, start, start + seconds)


class RedisFreeze:
    """SIGSTOP of the private Redis for ``seconds``, beside the other faults (a thread continues it).

    Its connections stay open and unanswered, as for a Redis host that hangs: every Redis
    command of the clients runs into its socket timeout instead of being refused.
    """

    def __init__(self, log: FaultLog, server: RestartableRedis, seconds: float) -> None:
        self.log, self.server, self.seconds = log, server, seconds
        self._cancel = threading.Event()
        self.start = time.monotonic()
        self.pid = server.process.pid if server.process is not None else None
        if self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)
        self._thread = threading.Thread(target=self._run, name="redis-freeze", daemon=True)
        self._thread.start()

    def active(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        self._cancel.wait(self.seconds)
        try:
            if self.pid is not None:
                os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.log.record("redis-stop", "redis", self.start, time.monotonic())

    def end(self) -> None:
        """Continue Redis now (the run is over); the window is recorded as it was."""
        self._cancel.set()
        self._thread.join(10)
