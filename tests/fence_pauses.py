"""Paused holders against a fenced resource, in real OS processes (test_fence_pauses, bench_fencing).

Each client process loops: acquire → ``steps`` × (``check()``, sometimes a pause longer
than the TTL, then a *use*: ``FenceGuard.admit(lease.fence)`` and a short piece of work) →
release. A paused holder is reaped meanwhile (the parent sweeps every 100 ms) and its slot
goes to a waiting process, whose first use follows its grant at once. Every process prints
one JSON line per event (wall-clock times; the store's clock is the same host's).

:func:`judge` decides from those lines and the store's tombstones (when each lease ended):

* an admitted use is *stale* when its lease had ended (its tombstone written) before the
  admit began, *live* when it was still held after the admit returned (in between:
  undecided, counted apart); a refused use is live when ``check()`` right after the
  refusal still succeeds, else stale;
* a stale use admitted while ``cap`` other holders were live and using the resource
  (granted, their first use admitted, not yet ended) is a violation, as is any live use
  refused; both must be 0.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

CHILD = [sys.executable, "-m", "tests.fence_pauses", "child"]
DEFINITION = "levels: {global: 2, tenant: 1}\nttlSeconds: 1\nwaitMs: 15000"
CAP = 2
TTL_S = 1.0
GUARD_COLLECTION = "resource_fences"
TOMBSTONE_SLACK_S = 0.1


def child(argv: list[str]) -> None:
    """One client process (``python -m tests.fence_pauses child --tenant t --user u ...``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--pauses", type=int, default=4, help="stop after this many pauses")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pause-probability", type=float, default=0.3)
    parser.add_argument("--pause", type=float, default=TTL_S + 0.6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import django

    django.setup()
    import pymongo
    from pymongo import monitoring

    import leases
    from leases.fencing import FenceGuard
    from leases.revocation import handlers

    class Quiet(handlers.LeaseHandler):
        type = "fence"

        def on_revoked(self, holder: Any) -> None:
            pass

    class Count(monitoring.CommandListener):
        n = 0

        def started(self, event: monitoring.CommandStartedEvent) -> None:
            if event.command_name != "endSessions":
                Count.n += 1

        def succeeded(self, event: Any) -> None:
            pass

        def failed(self, event: Any) -> None:
            pass

    handlers.register_handler(Quiet())
    # The resource's own store: a client of its own (here on the same server), counted apart.
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        os.environ["MONGODB_URI"], event_listeners=[Count()])
    guard = FenceGuard(client[os.environ["MONGODB_DB"]][GUARD_COLLECTION], resource="fenced")
    rng = random.Random(args.seed)
    paused = 0
    deadline = time.time() + args.seconds

    def emit(**event: Any) -> None:
        print(json.dumps(event), flush=True)

    print(json.dumps({"event": "ready"}), flush=True)
    while time.time() < deadline and paused < args.pauses:
        request = leases.LeaseRequest(type="fence", lease="fenced", tenant_id=args.tenant, project_id="p1",
                                      user_id=args.user, pod="")
        try:
            lease = leases.acquire(request)
        except leases.LeaseBusy:
            continue
        emit(event="grant", token=lease.token, fence=lease.fence, t=time.time())
        for _ in range(3):
            try:
                lease.check()
            except leases.LeaseLost:
                emit(event="lost", token=lease.token, t=time.time())
                break
            pause = paused < args.pauses and rng.random() < args.pause_probability
            if pause:
                paused += 1
                emit(event="pause", token=lease.token, t=time.time())
                time.sleep(args.pause)  # the stop-the-world stall between check() and use
            before, t0 = Count.n, time.time()
            try:
                guard.admit(lease.fence)
                admitted = True
            except leases.LeaseError as exc:
                if getattr(exc, "code", "") != "STALE_FENCE":
                    raise
                admitted = False
            t1 = time.time()
            alive_after = None
            if not admitted:
                # Ground truth for a refusal: is the lease still held? (It cannot be: a refusal
                # means its slot was granted again, which needs its holder gone first.)
                try:
                    lease.check()
                    alive_after = True
                except leases.LeaseLost:
                    alive_after = False
            emit(event="use", token=lease.token, fence=lease.fence, t0=t0, t1=t1, admitted=admitted,
                 paused=pause, commands=Count.n - before, alive_after=alive_after)
            if not admitted:
                break  # the resource said the lease is gone: stop using it
            time.sleep(0.02)
        try:
            lease.release()
        except leases.LeaseError:
            pass
        emit(event="end", token=lease.token, t=time.time())
    emit(event="done", pauses=paused)


@dataclass
class Verdict:
    """What :func:`judge` found."""

    pauses: int = 0
    uses: int = 0
    stale_attempted: int = 0
    stale_refused: int = 0
    stale_at_cap: int = 0  # stale attempts made while cap others were live and using: over cap without a guard
    stale_admitted: int = 0  # admitted while cap other holders were live and using: must be 0
    stale_admitted_below_cap: int = 0  # the slot's new holder had not used it yet: harmless
    live_refused: int = 0  # must be 0
    undecided: int = 0  # the lease ended during the admit itself
    admit_commands: list[int] = field(default_factory=list)
    admit_ms: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


def _epoch(at: Any) -> float:
    return calendar.timegm(at.utctimetuple()) + at.microsecond / 1e6


def judge(events: list[dict[str, Any]], ended_at: dict[str, float], cap: int = CAP) -> Verdict:
    """Judge the events of every process against the leases' end times (token → epoch s)."""
    verdict = Verdict()
    uses = [e for e in events if e["event"] == "use"]
    verdict.pauses = sum(1 for e in events if e["event"] == "pause")
    first_use: dict[str, float] = {}
    for use in sorted(uses, key=lambda u: u["t1"]):
        if use["admitted"]:
            first_use.setdefault(use["token"], use["t1"])
    for use in uses:
        verdict.uses += 1
        verdict.admit_commands.append(use["commands"])
        verdict.admit_ms.append((use["t1"] - use["t0"]) * 1000)
        end = ended_at.get(use["token"])
        if not use["admitted"] and use.get("alive_after"):
            verdict.live_refused += 1
            verdict.violations.append(f"live use of {use['token'][:8]} refused: {use}")
        elif not use["admitted"] or (end is not None and end <= use["t0"]):
            verdict.stale_attempted += 1
            # Others live and using throughout the admit. A tombstone is written just after its
            # holder's delete and pull: only an end TOMBSTONE_SLACK_S past the admit counts as live.
            live = [t for t, first in first_use.items()
                    if t != use["token"] and first <= use["t0"]
                    and ended_at.get(t, float("inf")) - TOMBSTONE_SLACK_S >= use["t1"]]
            verdict.stale_at_cap += len(live) >= cap
            if not use["admitted"]:
                verdict.stale_refused += 1
                continue
            if len(live) >= cap:
                verdict.stale_admitted += 1
                verdict.violations.append(f"stale use of {use['token'][:8]} admitted while {len(live)} others "
                                          f"were live: {use}")
            else:
                verdict.stale_admitted_below_cap += 1
        elif end is None or end >= use["t1"]:
            pass  # a live use, admitted
        else:
            verdict.undecided += 1
    return verdict


def sweep_until(stop: threading.Event) -> None:
    """Reap idle holders every 100 ms (beat's sweep, made frequent)."""
    from leases.upkeep import reaper

    while not stop.wait(0.1):
        try:
            reaper.reap_idle()
        except Exception:  # noqa: BLE001 - a sweep that fails is retried on the next tick
            pass


def run(env: dict[str, str], *, processes: int = 6, pauses_each: int = 4, seconds: float = 60.0,
        seed: int = 20) -> tuple[Verdict, list[dict[str, Any]]]:
    """Define the lease, start ``processes`` clients (three tenants), sweep, collect, judge.

    The caller has set up Django for the store of ``env`` (``MONGODB_URI``/``MONGODB_DB``).
    """
    from leases.definitions import layers as config
    from leases.definitions.model import document_path
    from leases.revocation import handlers
    from leases.store import client as store

    class Quiet(handlers.LeaseHandler):
        type = "fence"

        def on_revoked(self, holder: Any) -> None:
            pass

    # The parent's sweep reaps the paused holders: their type needs a handler here too.
    handlers.register_handler(Quiet(), replace=True)
    config.put_document("_vance", "_tenant", document_path("fenced"), DEFINITION)
    tenants = ["acme", "beta", "gamma"]
    procs = [subprocess.Popen(
        [*CHILD, "--tenant", tenants[i % len(tenants)], "--user", f"u{i}", "--pauses", str(pauses_each),
         "--seconds", str(seconds), "--seed", str(seed + i)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(processes)]
    stop = threading.Event()
    sweeper = threading.Thread(target=sweep_until, args=(stop,), daemon=True)
    sweeper.start()
    events: list[dict[str, Any]] = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=seconds + 60)
            if proc.returncode != 0:
                raise RuntimeError(f"client exited {proc.returncode}: {err[-2000:]}")
            events.extend(json.loads(line) for line in out.splitlines() if line.startswith("{"))
    finally:
        stop.set()
        sweeper.join(5)
        handlers.unregister_handler("fence")
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
    ended = {d["_id"]: _epoch(d["at"]) for d in store.tombstones().find({}, {"at": 1})}
    return judge(events, ended), events


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    child(sys.argv[2:])
