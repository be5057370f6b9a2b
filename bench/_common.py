"""Pieces shared by the multi-process benchmarks (``bench_contention``, ``bench_depth``): the
server-CPU sampler read from ``/proc``, percentiles and Jain's index, the standalone ZooKeeper
server for the kazoo side, and the server-speed line of a table's header."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import _setup
from _setup import cpu_seconds


class CpuSampler:
    """Reads the CPU time of server processes (the embedded server, ZooKeeper's JVM, gunicorn's
    workers) at given wall-clock times (the children's clock), from a thread of its own: the
    server is what short holds wait on, so a table shows how busy it was and what a grant
    cost it.

    ``at_mark(i)`` (optional) is called right after the ``i``-th reading, from the sampler's
    thread (a benchmark reads the store there at the window's end).
    """

    def __init__(self, pids: list[int], marks: list[float],
                 at_mark: Callable[[int], None] | None = None) -> None:
        self.readings: list[float | None] = [None] * len(marks)
        self._pids = list(pids)
        self._last: dict[int, float] = {}
        self._thread = threading.Thread(target=self._run, args=(list(marks), at_mark), daemon=True)
        self._thread.start()

    def _read(self) -> float | None:
        """The pids' CPU seconds summed; a pid gone since an earlier reading (a gunicorn worker
        restarted) counts with its last reading, one never read makes the figure unknown."""
        if not self._pids:
            return None
        total = 0.0
        for pid in self._pids:
            used = cpu_seconds(pid)
            if used is None:
                used = self._last.get(pid)
                if used is None:
                    return None
            self._last[pid] = used
            total += used
        return total

    def _run(self, marks: list[float], at_mark: Callable[[int], None] | None) -> None:
        for i, mark in enumerate(marks):
            time.sleep(max(0.0, mark - time.time()))
            self.readings[i] = self._read()
            if at_mark is not None:
                try:
                    at_mark(i)
                except Exception:  # noqa: BLE001 - a failed side reading must not lose the CPU figures
                    pass

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def used(self, first: int, last: int) -> float | None:
        """CPU seconds between mark ``first`` and mark ``last`` (waits for the last one)."""
        self.join()
        a, b = self.readings[first], self.readings[last]
        return None if a is None or b is None else b - a


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def jain(values: list[float]) -> float | None:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all equal, 1/n when one takes all."""
    squares = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * squares) if squares else None


class ZooKeeper:
    """A standalone ZooKeeper server on a free port with a throw-away data dir."""

    CLASSPATHS = ("/usr/share/java/zookeeper.jar",)  # Debian: the jar's manifest lists its deps

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.dir = tempfile.mkdtemp(prefix="bench-zk-")
        self.port = 0

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Raises: RuntimeError with the reason when ZooKeeper cannot be started."""
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("no java on PATH")
        jar = os.environ.get("ZK_CLASSPATH") or next((p for p in self.CLASSPATHS if os.path.exists(p)), None)
        if jar is None:
            raise RuntimeError("no ZooKeeper jar (apt-get install -y zookeeper, or set ZK_CLASSPATH)")
        try:
            import kazoo  # noqa: F401
        except ImportError:
            raise RuntimeError("kazoo is not installed (pip install -e '.[bench]')") from None
        from leases.store.embedded import free_port

        self.port = free_port()
        data = os.path.join(self.dir, "data")
        os.makedirs(data)
        cfg = os.path.join(self.dir, "zoo.cfg")
        with open(cfg, "w") as f:
            f.write(f"tickTime=2000\ndataDir={data}\nclientPort={self.port}\nclientPortAddress=127.0.0.1\n"
                    "maxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=ruok\n")
        log = open(os.path.join(self.dir, "server.log"), "ab")  # noqa: SIM115 - closed in stop()
        self._log = log
        log4j = [p for p in ("/usr/share/java/log4j-1.2.jar",) if os.path.exists(p)]
        self.process = subprocess.Popen(
            [java, "-Xmx256m", "-cp", ":".join([jar, *log4j]),
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.process.returncode}: {self._tail()}")
            if self._ruok():
                return
            time.sleep(0.2)
        raise RuntimeError(f"ZooKeeper did not answer ruok within {timeout:.0f}s: {self._tail()}")

    def _ruok(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"ruok")
                return sock.recv(16) == b"imok"
        except OSError:
            return False

    def _tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "server.log"), errors="replace") as f:
                return f.read()[-1500:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if getattr(self, "_log", None) is not None and not self._log.closed:
            self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def calibration(uri: str) -> str:
    """The server's speed as :func:`_setup.calibrate_server` finds it, for the header."""
    wall, cpu = _setup.calibrate_server(uri, _setup.SERVER_PID)
    return (f"{wall:.2f} ms a fixed cycle of 4 writes by one client"
            + (f", {cpu:.2f} ms of the server's CPU" if cpu is not None else ""))


class Spawned(NamedTuple):
    """Client processes started together: they report on ``ready_q`` once warmed up, wait
    for ``start_event``, read the common start time from ``start_value`` and put their
    results on ``result_q``."""

    procs: list[Any]
    ready_q: Any
    result_q: Any
    start_event: Any
    start_value: Any


def spawn_clients(target: Any, argsets: list[tuple], seconds: float) -> Spawned:
    """Start ``target(*args, seconds, ready_q, start_event, start_value, result_q)`` for each
    of ``argsets`` in its own spawned process (daemons), as every multi-process bench does."""
    ctx = multiprocessing.get_context("spawn")
    ready_q, result_q = ctx.Queue(), ctx.Queue()
    start_event, start_value = ctx.Event(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=target, args=(*args, seconds, ready_q, start_event, start_value, result_q),
                         daemon=True) for args in argsets]
    for proc in procs:
        proc.start()
    return Spawned(procs, ready_q, result_q, start_event, start_value)
