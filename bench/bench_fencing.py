"""Fencing benchmark: holders paused past their TTL between check() and use, every use admitted
by a FenceGuard (tests.fence_pauses), for a fixed time.

Client processes (default 6, three tenants) loop acquire → 3 × (check, sometimes a pause of
TTL + 0.6 s, admit the fence, work 20 ms) → release on ``levels: {global: 2, tenant: 1}``,
TTL 1 s; the bench reaps every 100 ms. It prints the pauses, the stale uses attempted (the
lease had ended before the admit), how many of those came while cap other holders were live
and using the resource (each one a use over the cap without a guard), stale uses admitted
while cap others were live (target 0), live uses refused (target 0), and what an admit
costs: commands of the resource's store and milliseconds per use.

Run: ``python bench/bench_fencing.py [--seconds 60] [--processes 6]`` (its own embedded
server). Not a test: it measures; the exit status is 1 when a property was violated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _setup import REPO, setup  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args()

    setup("bench_fencing")
    from tests import fence_pauses

    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    verdict, _ = fence_pauses.run(env, processes=args.processes, pauses_each=10**6, seconds=args.seconds,
                                  seed=args.seed)
    ms = sorted(verdict.admit_ms)
    rows = [
        ("pauses (TTL 1 s, each 1.6 s between check() and use)", verdict.pauses),
        ("uses", verdict.uses),
        ("stale uses attempted", verdict.stale_attempted),
        ("  of them while cap others were live (over cap without a guard)", verdict.stale_at_cap),
        ("  refused (STALE_FENCE)", verdict.stale_refused),
        ("stale uses admitted while cap others were live (target 0)", verdict.stale_admitted),
        ("stale uses admitted before the slot's new holder used it", verdict.stale_admitted_below_cap),
        ("live uses refused (target 0)", verdict.live_refused),
        ("undecided (the lease ended during the admit)", verdict.undecided),
        ("admit: commands per use, mean / max",
         f"{statistics.mean(verdict.admit_commands):.2f} / {max(verdict.admit_commands)}"),
        ("admit: ms per use, p50 / p95 / max",
         f"{ms[len(ms) // 2]:.2f} / {ms[int(len(ms) * 0.95)]:.2f} / {ms[-1]:.2f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"bench_fencing: {args.processes} processes, {args.seconds:.0f} s, levels {{global: 2, tenant: 1}}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    for violation in verdict.violations[:5]:
        print("  VIOLATION", violation)
    return 1 if verdict.violations else 0


if __name__ == "__main__":
    sys.exit(main())
