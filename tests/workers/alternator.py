"""Child process: one tenant's worker that asks again as soon as it releases.

Usage: python -m tests.workers.alternator <name> <tenant> <seconds> <start-at-epoch> <hold-ms>

Loops ``acquire → check → hold → release → acquire`` on the lease ``alt`` for ``seconds``
(user ``name``, project ``p1``). Prints one JSON line: the grants (``[asked, granted]``, this host's epoch seconds: the workers run on
one host), the waits that ended in ``LeaseBusy`` (level, position) and how many grants were
reaped before their ``check()`` (the process was paused past the TTL).
"""

import json
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
    handlers.register_handler(Handler())
    request = leases.LeaseRequest(type="alt", lease="alt", tenant_id=tenant, project_id="p1", user_id=name)
    grants: list[list[float]] = []
    busy: list[dict] = []
    lost = 0
    time.sleep(max(0.0, start_at - time.time()))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        asked = time.time()
        try:
            lease = leases.acquire(request)
        except leases.LeaseBusy as exc:
            busy.append({"level": exc.level, "position": exc.position, "asked": asked, "at": time.time()})
            continue
        grants.append([asked, time.time()])
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
