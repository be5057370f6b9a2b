"""Pauses benchmark: the history checker's run for minutes, judged from what the clients were told.

Client processes (``tests.workers.history_client``; default 6: three tenants, two each) loop
acquire → 3 × (hold 30–120 ms, check, use) → release on ``levels: {global: 2, tenant: 1}``,
TTL 2 s, waitMs 15 s, every call recorded with CLOCK_MONOTONIC. Meanwhile the bench injects,
one after another with 2–3 s between them: SIGSTOP of a holder and of a waiter (TTL + 0.6–1.6
s), SIGSTOP of its own store server for ``LEASES_MONGO_TIMEOUT_MS`` + 0.3 s (1.8 s),
``kill -9`` of a client (a replacement starts), ``kill -9`` of its private Redis restarted
after 1 s, and a stop-the-world stall of a client between a successful check and the use.

The faults of issue 34 (``--kinds new`` or ``all``; ``tests/checker/faults.py``): a write's
reply lost after the server applied it (``reply-lost``: the clients reach the store through
a proxy that, for 2 s bursts, swallows each write's reply with probability 0.3 and drops
the connection), a holder keeping its lease 2.5 TTLs (``long-hold``: others wait past the
TTL while the operator's sweep runs every ``--sweep`` s), Redis SIGSTOPped for
``--redis-stop`` s (minutes) beside the other faults; ``--fenced N`` adds N tenants on a
definition with ``fence: project`` on a project level of cap 2.

Then :mod:`tests.checker.rules` decides from the history alone, per group of clients (one
lease definition each), and the bench prints grants, faults by kind, the maximum proven
overlap per level vs its cap, revivals, losses without a cause and the liveness figures
(longest wait of a live waiter, busy answers to live waiters whose wait covered the
faults, longest live time without a grant vs W, grants per process), then "every slot
comes back" (:mod:`tests.checker.slots`: the counters read every 0.5 s, and after the run a
sweep and the audit), the proxy's figures, and the first violations.

Run: ``python bench/bench_pauses.py [--seconds 180] [--processes 6] [--per-tenant 2]
[--kinds all|old|new|none|holder-stop,...] [--fenced 2] [--sweep 1] [--redis-stop 120]``
(always its own embedded store server: it gets SIGSTOPped). Not a test: it measures; the
exit status is 1 when a property was violated.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _setup import REPO, setup  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="faulted run length (after start-up)")
    parser.add_argument("--processes", type=int, default=6, help="client processes (tenants = processes / per-tenant)")
    parser.add_argument("--per-tenant", type=int, default=2)
    parser.add_argument("--window", type=float, default=12.0, help="W: a live process is granted once per W s")
    parser.add_argument("--slack", type=float, default=5.0, help="busy bound: longest fault + TTL + slack")
    parser.add_argument("--kinds", default="all",
                        help="comma-separated fault kinds, 'all', 'old' (issue 19's six), 'new' (issue 34's) or 'none'")
    parser.add_argument("--fenced", type=int, default=2, help="tenants on the fence: project (cap 2) definition")
    parser.add_argument("--sweep", type=float, default=1.0, help="the operator's sweep every this many s (0: never)")
    parser.add_argument("--redis-stop", type=float, default=120.0, help="seconds Redis stays SIGSTOPped")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--keep", action="store_true", help="keep the history files (their directory is printed)")
    args = parser.parse_args()

    from leases.store.embedded import start_server

    server = start_server(":memory:")
    os.environ["MONGODB_URI"] = server.uri
    from tests.checker import harness, rules  # noqa: E402 - REPO is on sys.path now

    named = {"all": harness.ALL_KINDS, "old": harness.KINDS, "new": harness.NEW_KINDS, "none": ()}
    config = harness.RunConfig(seconds=args.seconds, tenants=args.processes // args.per_tenant,
                               per_tenant=args.per_tenant, seed=args.seed,
                               kinds=named[args.kinds] if args.kinds in named else tuple(args.kinds.split(",")),
                               fenced_tenants=args.fenced, sweep_s=args.sweep or None, redis_stop_s=args.redis_stop)
    os.environ["LEASES_MONGO_TIMEOUT_MS"] = str(config.mongo_timeout_ms)
    setup("bench_pauses")
    import logging

    logging.getLogger("leases").setLevel(logging.WARNING)  # the sweeps of this process log every round
    from leases.store import client as store

    run_dir = tempfile.mkdtemp(prefix="lease-pauses-")
    began = time.monotonic()
    try:
        result = harness.run(config, run_dir=run_dir, store_pid=server.pid, mongo_uri=server.uri,
                             db_name=store.database_name())
    finally:
        server.stop()
    groups = [("t", harness.LEASE, config.levels)] if config.tenants else []
    if config.fenced_tenants:
        groups.append(("f", harness.FENCED_LEASE, harness.FENCED_LEVELS))
    outcomes: dict[str, int] = {}
    for call in result.history.calls:
        key = f"{call.op} {call.outcome or 'indeterminate'}"
        outcomes[key] = outcomes.get(key, 0) + 1

    processes = (config.tenants + config.fenced_tenants) * config.per_tenant
    print(f"\n{processes} processes ({config.tenants} + {config.fenced_tenants} fenced tenants x {config.per_tenant}), "
          f"TTL {config.ttl_s} s, waitMs {config.wait_ms}, LEASES_MONGO_TIMEOUT_MS {config.mongo_timeout_ms}, "
          f"sweep every {config.sweep_s or '-'} s; faulted run {result.seconds:.0f} s "
          f"({time.monotonic() - began:.0f} s wall), {result.clients} processes started (replacements included)")
    faults = ", ".join(f"{kind} {n}" for kind, n in sorted(result.faults.items())) or "none"
    print(f"faults: {faults}\n")
    print("| lease | grants (acquire ok) | proven held | max proven overlap vs cap | revivals | losses without a cause "
          "| longest live wait | busy to live waiters (bound) | longest live gap (W) |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    violations: list[str] = []
    grants_per_process: dict[str, int] = {}
    for prefix, lease, levels in groups:
        verdict = rules.check(result.history.only(prefix), levels, ttl_s=config.ttl_s, slack_s=args.slack,
                              window_s=args.window)
        live = verdict.liveness
        ok = sum(1 for c in result.history.only(prefix).calls if c.op == "acquire" and c.outcome == "ok")
        overlap = ", ".join(f"{level} {verdict.max_overlap[level][0]}/{cap}" for level, cap in levels.items())
        print(f"| {lease} | {ok} | {len(verdict.grants)} | {overlap} | {len(verdict.revivals)} | {len(verdict.losses)} "
              f"| {live.longest_live_wait_s:.2f} s | {live.busy_to_live} ({live.wait_bound_ms / 1000:.1f} s) "
              f"| {live.longest_live_gap_s:.2f} s ({live.window_s:.0f} s) |")
        violations += [f"[{lease}] {v}" for v in verdict.violations]
        grants_per_process.update(live.grants)
    violations += [str(p) for p in result.slot_problems]
    print("\ngrants per process: " + ", ".join(f"{p} {n}" for p, n in sorted(grants_per_process.items())))
    print("outcomes: " + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items())))
    if result.drops is not None:
        d = result.drops
        print(f"reply-lost proxy: {d.writes} writes forwarded, {d.dropped} replies lost {d.dropped_by_command}, "
              f"{d.retryable} of them retryable (txnNumber), {d.retried} retried by the driver")
    print(f"every slot comes back: {len(result.slot_problems)} problems; operator sweeps during the run "
          f"{result.sweeps}; final {result.audit}")
    print(f"\nviolations: {len(violations)}")
    for line in violations[:12]:
        print("  " + line)
    if args.keep:
        print(f"history files: {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
