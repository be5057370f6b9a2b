"""Pauses benchmark: the history checker's run for minutes, judged from what the clients were told.

Client processes (``tests.workers.history_client``; default 6: three tenants, two each) loop
acquire → 3 × (hold 30–120 ms, check, use) → release on ``levels: {global: 2, tenant: 1}``,
TTL 2 s, waitMs 15 s, every call recorded with CLOCK_MONOTONIC. Meanwhile the bench injects,
one after another with 2–3 s between them: SIGSTOP of a holder and of a waiter (TTL + 0.6–1.6
s), SIGSTOP of its own store server for ``LEASES_MONGO_TIMEOUT_MS`` + 0.3 s (1.8 s),
``kill -9`` of a client (a replacement starts), ``kill -9`` of its private Redis restarted
after 1 s, and a stop-the-world stall of a client between a successful check and the use.

Then :mod:`tests.checker.rules` decides from the history alone and the bench prints grants,
faults by kind, the maximum proven overlap per level vs its cap, revivals and the liveness
figures (longest wait of a live waiter, busy answers to live waiters whose wait covered the
faults, longest live time without a grant vs W, grants per process), and the first violations.

Run: ``python bench/bench_pauses.py [--seconds 180] [--processes 6] [--per-tenant 2]``
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
    parser.add_argument("--kinds", default="all", help="comma-separated fault kinds, 'all' or 'none'")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--keep", action="store_true", help="keep the history files (their directory is printed)")
    args = parser.parse_args()

    from leases.store.embedded import start_server

    server = start_server(":memory:")
    os.environ["MONGODB_URI"] = server.uri
    from tests.checker import harness, rules  # noqa: E402 - REPO is on sys.path now

    config = harness.RunConfig(seconds=args.seconds, tenants=max(1, args.processes // args.per_tenant),
                               per_tenant=args.per_tenant, seed=args.seed,
                               kinds=harness.KINDS if args.kinds == "all" else
                               () if args.kinds == "none" else tuple(args.kinds.split(",")))
    os.environ["LEASES_MONGO_TIMEOUT_MS"] = str(config.mongo_timeout_ms)
    setup("bench_pauses")
    from leases.store import client as store

    run_dir = tempfile.mkdtemp(prefix="lease-pauses-")
    began = time.monotonic()
    try:
        result = harness.run(config, run_dir=run_dir, store_pid=server.pid, mongo_uri=server.uri,
                             db_name=store.database_name())
    finally:
        server.stop()
    verdict = rules.check(result.history, config.levels, ttl_s=config.ttl_s, slack_s=args.slack,
                          window_s=args.window)
    live = verdict.liveness
    acquires = [c for c in result.history.calls if c.op == "acquire"]
    ok = sum(1 for c in acquires if c.outcome == "ok")
    outcomes: dict[str, int] = {}
    for call in result.history.calls:
        key = f"{call.op} {call.outcome or 'indeterminate'}"
        outcomes[key] = outcomes.get(key, 0) + 1

    print(f"\n{config.tenants * config.per_tenant} processes ({config.tenants} tenants x {config.per_tenant}), "
          f"levels {config.levels}, TTL {config.ttl_s} s, waitMs {config.wait_ms}, "
          f"LEASES_MONGO_TIMEOUT_MS {config.mongo_timeout_ms}; faulted run {result.seconds:.0f} s "
          f"({time.monotonic() - began:.0f} s wall), {result.clients} processes started (replacements included)\n")
    print("| grants (acquire ok) | proven held | faults by kind | max proven overlap vs cap | revivals "
          "| longest live wait | busy to live waiters (bound) | longest live gap (W) |")
    print("|---:|---:|---|---|---:|---:|---:|---:|")
    faults = ", ".join(f"{kind} {n}" for kind, n in sorted(result.faults.items())) or "none"
    overlap = ", ".join(f"{level} {verdict.max_overlap[level][0]}/{cap}" for level, cap in config.levels.items())
    print(f"| {ok} | {len(verdict.grants)} | {faults} | {overlap} | {len(verdict.revivals)} "
          f"| {live.longest_live_wait_s:.2f} s | {live.busy_to_live} ({live.wait_bound_ms / 1000:.1f} s) "
          f"| {live.longest_live_gap_s:.2f} s ({live.window_s:.0f} s) |")
    print("\ngrants per process: " + ", ".join(f"{p} {n}" for p, n in sorted(live.grants.items())))
    print("outcomes: " + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items())))
    violations = verdict.violations
    print(f"\nviolations: {len(violations)} (overlap {len(verdict.overlaps)}, revival {len(verdict.revivals)}, "
          f"liveness {len(live.violations)})")
    for line in violations[:10]:
        print("  " + line)
    if args.keep:
        print(f"history files: {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
