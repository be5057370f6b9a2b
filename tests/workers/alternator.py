"""Child process: one tenant's worker that asks again as soon as it releases.

Usage: python -m tests.workers.alternator <name> <tenant> <seconds> <start-at-epoch> <hold-ms> [<run-dir>]

Loops ``acquire → check → hold → release → acquire`` on the lease ``alt`` for ``seconds``
(user ``name``, project ``p1``), or until the file ``<run-dir>/stop`` exists. With a run
directory, each grant is also appended to ``<run-dir>/<name>.grants`` as it happens
(``asked granted``), so the test can wait for enough turns instead of a fixed time. Prints one JSON line: the grants (``[asked, granted]``, this host's epoch seconds: the workers run on
one host), the waits that ended in ``LeaseBusy`` (level, position) and how many grants were
reaped before their ``check()`` (the process was paused past the TTL).
"""

import json
import os
import sys
import time

import django

django.setup()

import leases  # noqa: E402
from leases.revocation import handlers  # noqa: E402


class Handler(handlers.LeaseHandler):
    type = "alt"

    def on_revoked(self, holder):
        pass


def main() -> None:
    name, tenant, seconds, start_at, hold_ms = (sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]),
                                                float(sys.argv[5]))
    run_dir = sys.argv[6] if len(sys.argv) > 6 else None
    stop = os.path.join(run_dir, "stop") if run_dir else None
    progress = open(os.path.join(run_dir, name + ".grants"), "a", buffering=1) if run_dir else None  # noqa: SIM115
    handlers.register_handler(Handler())
    request = leases.LeaseRequest(type="alt", lease="alt", tenant_id=tenant, project_id="p1", user_id=name)
    grants: list[list[float]] = []
    busy: list[dict] = []
    lost = 0
    time.sleep(max(0.0, start_at - time.time()))
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (stop and os.path.exists(stop)):
        asked = time.time()
        try:
            lease = leases.acquire(request)
        except leases.LeaseBusy as exc:
            busy.append({"level": exc.level, "position": exc.position, "asked": asked, "at": time.time()})
            continue
        grants.append([asked, time.time()])
        if progress is not None:
            progress.write(f"{grants[-1][0]} {grants[-1][1]}\n")  # line-buffered: the test reads it live
        try:
            lease.check()
            time.sleep(hold_ms / 1000.0)
        except leases.LeaseLost:
            lost += 1  # paused past the TTL between the grant and check(): reaped meanwhile
        finally:
            lease.release()
    print(json.dumps({"name": name, "tenant": tenant, "grants": grants, "busy": busy, "lost": lost}), flush=True)


if __name__ == "__main__":
    main()
