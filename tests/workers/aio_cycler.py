"""Child process: asyncio tasks cycling aacquire/acheck/arelease on one capped lease.

Usage: python -m tests.workers.aio_cycler <worker-index> <tasks> <cycles> <start-at-epoch>

Inside each lease a probe document counts the holders in the critical section (incremented
after the grant, decremented before the release), so the count it reports is never above
the real number of holders. Prints one JSON line: grants, busy answers, the highest probe.
"""

import asyncio
import json
import sys
import time

import django

django.setup()

from pymongo import ReturnDocument  # noqa: E402

import leases  # noqa: E402
from leases.revocation import handlers  # noqa: E402
from leases.store import client as store  # noqa: E402


class Handler(handlers.LeaseHandler):
    type = "aiotest"

    def on_revoked(self, holder):
        pass


async def cycle(index: int, task: int, cycles: int, stats: dict) -> None:
    probe = store.async_db()["aio_probe"]
    for n in range(cycles):
        request = leases.LeaseRequest(type="aiotest", lease="aio", tenant_id=f"t{(index + n) % 2}",
                                      project_id="p1", user_id=f"u{index}-{task}")
        try:
            async with leases.aacquire(request) as lease:
                inside = await probe.find_one_and_update({"_id": "inside"}, {"$inc": {"n": 1}},
                                                         return_document=ReturnDocument.AFTER)
                stats["max"] = max(stats["max"], inside["n"])
                await lease.acheck()
                await asyncio.sleep(0.005)
                await probe.update_one({"_id": "inside"}, {"$inc": {"n": -1}})
                stats["ok"] += 1
        except leases.LeaseBusy:
            stats["busy"] += 1


async def main() -> None:
    index, tasks, cycles, start_at = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    handlers.register_handler(Handler())
    stats = {"ok": 0, "busy": 0, "max": 0}
    await asyncio.sleep(max(0.0, start_at - time.time()))
    await asyncio.gather(*(cycle(index, t, cycles, stats) for t in range(tasks)))
    await leases.aio.aclose()
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
