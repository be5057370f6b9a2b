"""Child process: chaos cycles (acquire/check/release on 4 levels) until killed or done.

Usage: python -m tests.workers.chaos <index> <stop-file>

Cycles until ``<stop-file>`` exists (checked between cycles). Prints ``C`` per finished
cycle, ``B`` per busy attempt (the test counts them even after ``kill -9``). Its
``chaos`` handler records every run in ``chaos_handler_runs`` (at-most-once check).
"""

import os
import random
import sys
import time

import django

django.setup()

import leases  # noqa: E402
from leases.revocation import handlers  # noqa: E402
from leases.store import client as store  # noqa: E402


class RecordingHandler(handlers.LeaseHandler):
    type = "chaos"

    def on_revoked(self, holder):
        store.db()["chaos_handler_runs"].insert_one({"token": holder.token, "reason": holder.reason})


def main() -> None:
    index, stop_file = int(sys.argv[1]), sys.argv[2]
    handlers.register_handler(RecordingHandler())
    rng = random.Random(index * 7919)
    while not os.path.exists(stop_file):
        request = leases.LeaseRequest(type="chaos", lease="chaos", tenant_id=rng.choice(["t1", "t2"]),
                                      project_id=rng.choice(["p1", "p2"]), user_id=f"u{rng.randint(1, 3)}",
                                      pod_bound=rng.random() < 0.5)
        try:
            lease = leases.acquire(request)
        except leases.LeaseBusy:
            print("B", flush=True)
            time.sleep(rng.uniform(0.01, 0.05))  # back off: a busy storm only loads the server
            continue
        try:
            lease.check()
        except leases.LeaseLost:
            pass
        lease.release()
        print("C", flush=True)


if __name__ == "__main__":
    main()
