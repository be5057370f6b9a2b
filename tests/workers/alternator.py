"""Child process: one tenant's worker that asks again as soon as it releases.

Usage: python -m tests.workers.alternator <name> <tenant> <seconds> <start-at-epoch> <hold-ms> [stall-every]

Loops ``acquire → hold → release → acquire`` on the lease ``alt`` for ``seconds``; with
``stall-every`` N, every N-th grant stalls past the lease's TTL between its ``check()`` and
its release (the holder is reaped meanwhile, as a paused process's would be). Prints one
JSON line: the grants (``[asked, granted]``, this host's epoch seconds: the workers run on
one host) and the waits that ended in ``LeaseBusy`` (level, position).
"""

import json
import sys
import time

import django

django.setup()

import leases  # noqa: E402
from leases import handlers  # noqa: E402


class Handler(handlers.LeaseHandler):
    type = "alt"

    def on_revoked(self, holder):
        pass


def main() -> None:
    name, tenant, seconds, start_at, hold_ms = (sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]),
                                                float(sys.argv[5]))
    stall_every = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    handlers.register_handler(Handler())
    request = leases.LeaseRequest(type="alt", lease="alt", tenant_id=tenant, project_id="p1", user_id=name)
    grants: list[float] = []
    busy: list[dict] = []
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
            if stall_every and len(grants) % stall_every == 0:
                time.sleep(lease.definition.ttl_seconds + 1.2)  # a stall between check() and use
            else:
                time.sleep(hold_ms / 1000.0)
            lease.release()
        except leases.LeaseLost:
            lease.release()  # reaped during the stall: nothing to give back
    print(json.dumps({"name": name, "tenant": tenant, "grants": grants, "busy": busy}), flush=True)


if __name__ == "__main__":
    main()
