"""Child process: acquire/check/release cycles against the shared test database.

Usage: python -m tests.workers.cycler <worker-index> <cycles> <start-at-epoch> [hold-at-end]
"""

import json
import random
import sys
import time

import django

django.setup()

import leases  # noqa: E402
from leases.revocation import handlers  # noqa: E402


class Handler(handlers.LeaseHandler):
    type = "cycle"

    def on_revoked(self, holder):
        pass


def main() -> None:
    index, cycles, start_at = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    hold_at_end = len(sys.argv) > 4 and sys.argv[4] == "hold"
    handlers.register_handler(Handler())
    rng = random.Random(index)
    stats = {"ok": 0, "busy": 0}
    time.sleep(max(0.0, start_at - time.time()))
    for _ in range(cycles):
        tenant = rng.choice(["t1", "t2"])
        request = leases.LeaseRequest(type="cycle", lease="shared", tenant_id=tenant,
                                      project_id=rng.choice(["p1", "p2"]), user_id=f"u{rng.randint(1, 4)}")
        try:
            with leases.acquire(request) as lease:
                lease.check()
                stats["ok"] += 1
        except leases.LeaseBusy:
            stats["busy"] += 1
    if hold_at_end:
        for _ in range(20):
            try:
                # wait_ms=0: a refused try sleeps 50 ms here instead of the lease's 2 s waitMs, so the
                # workers that cannot hold (project cap 2) give up in 1 s, not 40.
                leases.acquire(leases.LeaseRequest(type="cycle", lease="shared", tenant_id="t1", project_id="p1",
                                                   user_id=f"u{index}", wait_ms=0))
                stats["held"] = 1
                break
            except leases.LeaseBusy:
                time.sleep(0.05)
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main()
