"""Bench bootstrap: Django settings and an embedded server when MONGODB_URI is unset."""

from __future__ import annotations

import atexit
import os
import sys
import time

from pymongo import monitoring

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

#: The pid of the embedded server :func:`setup` started (None: MONGODB_URI named a server), so
#: that a benchmark can read its CPU time.
SERVER_PID: int | None = None


def setup(db_name: str = "bench") -> None:
    """Start an embedded server if needed, point Django at a bench database, django.setup()."""
    if not os.environ.get("MONGODB_URI"):
        from leases.store.embedded import start_server

        global SERVER_PID
        server = start_server(":memory:")
        atexit.register(server.stop)
        SERVER_PID = server.pid
        os.environ["MONGODB_URI"] = server.uri
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["MONGODB_DB"] = db_name
    import django

    django.setup()


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system, seconds) process ``pid`` has used so far, from ``/proc``
    (Linux); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def calibrate_server(uri: str, pid: int | None, cycles: int = 500) -> tuple[float, float | None]:
    """How fast the MongoDB server is right now: one client runs ``cycles`` fixed cycles of
    four writes by ``_id`` (insert, update, delete, upsert) on a scratch collection.

    The same machine ran this twice as slow in one hour as in the hour before, so a table is
    only comparable with another one printed beside the same figure.

    Returns:
        (wall ms a cycle, server CPU ms a cycle — None without ``pid`` or ``/proc``).
    """
    import pymongo

    client = pymongo.MongoClient(uri)
    try:
        scratch = client["bench_calibration"]["cycles"]
        scratch.drop()
        scratch.insert_one({"_id": "warm"})
        used = cpu_seconds(pid) if pid is not None else None
        started = time.perf_counter()
        for i in range(cycles):
            scratch.insert_one({"_id": i, "n": 0})
            scratch.update_one({"_id": i}, {"$inc": {"n": 1}})
            scratch.delete_one({"_id": i})
            scratch.update_one({"_id": f"t{i}"}, [{"$set": {"at": "$$NOW"}}], upsert=True)
        wall = (time.perf_counter() - started) * 1000 / cycles
        after = cpu_seconds(pid) if pid is not None else None
        cpu = (after - used) * 1000 / cycles if used is not None and after is not None else None
        client.drop_database("bench_calibration")
        return wall, cpu
    finally:
        client.close()


class CommandCounter(monitoring.CommandListener):
    """Names of the commands a client sends (pymongo command monitoring is exact).

    With ``timed=True`` it also keeps ``(time.time(), "name collection")`` of every command when it is
    started (any thread), so that a benchmark can count the commands inside an interval timed
    with the same clock, across processes.
    """

    def __init__(self, *, timed: bool = False) -> None:
        self.names: list[str] = []
        self.timed: list[tuple[float, str]] | None = [] if timed else None

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name != "endSessions":  # client clean-up, not work
            self.names.append(event.command_name)
            if self.timed is not None:
                # The collection too: an update of the counters and one of the holders are
                # different steps of a grant.
                target = event.command.get(event.command_name)
                name = f"{event.command_name} {target}" if isinstance(target, str) else event.command_name
                self.timed.append((time.time(), name))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def register_bench_handler() -> None:
    """Register the no-op handler of the benchmarks' lease type ``bench``."""
    from leases.revocation import handlers

    class BenchHandler(handlers.LeaseHandler):
        type = "bench"

        def on_revoked(self, holder):
            pass

    handlers.register_handler(BenchHandler())
