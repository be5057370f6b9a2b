"""Demo traffic in tenant acme, next to a running ``bash scripts/dev.sh``: a real queue and
minutes of history, for the Waiting and History screenshots.

Run from the checkout (it finds the stack's server through ``var/devstack.json``, as
``manage.py`` does)::

    .venv/bin/python scripts/demo_queue.py --seconds 420

Threads of this one process, all leases detached (``pod ""``) and released on exit:

* queue: four waiters on ``tex``, whose acme project levels ``seed_demo``'s holders keep
  full; each waits its whole ``waitMs`` and queues again, so the queue is always there;
* traffic: six workers on ``browser`` for three users (user cap 1): grants, queued waits
  that end granted, busy answers.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

WAITERS = [("docs", "dave"), ("docs", "erin"), ("web", "frank"), ("web", "grace")]
BROWSER_USERS = ["carol", "dave", "erin"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=420, help="how long to run")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LEASES_POD_AUTOSTART", "0")
    import django

    django.setup()
    import leases
    from leases.errors import LeaseError
    from leases.telemetry import history

    stop = threading.Event()
    stats = {"granted": 0, "busy": 0, "errors": 0}
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            stats[what] += 1

    def request(lease: str, project: str, user: str, ref: str):
        return leases.LeaseRequest(type=lease, lease=lease, tenant_id="acme", project_id=project,
                                   user_id=user, holder_ref=ref, pod="")

    def waiter(project: str, user: str) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                held = leases.acquire(request("tex", project, user, f"compile:{user}-queued.tex"))
            except leases.LeaseBusy:
                note("busy")
                if time.monotonic() - started < 1:
                    stop.wait(1)  # answered without waiting: no hot loop
                continue  # queue again at once: the queue stays
            except LeaseError:
                note("errors")
                stop.wait(1)
                continue
            note("granted")
            held.release()

    def worker(index: int) -> None:
        rnd = random.Random(index)
        while not stop.is_set():
            user = rnd.choice(BROWSER_USERS)
            try:
                held = leases.acquire(request("browser", "web", user, f"mcp:demo-{index}"))
            except leases.LeaseBusy:
                note("busy")
                stop.wait(rnd.uniform(0.5, 2.0))
                continue
            except LeaseError:
                note("errors")
                stop.wait(1)
                continue
            note("granted")
            try:
                stop.wait(rnd.uniform(1.0, 4.0))  # the session's work
            finally:
                held.release()
            stop.wait(rnd.uniform(0.2, 1.5))

    threads = [threading.Thread(target=waiter, args=w, daemon=True) for w in WAITERS]
    threads += [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(6)]
    for thread in threads:
        thread.start()
    try:
        stop.wait(args.seconds)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=15)  # a waiter's wait ends within its waitMs (10 s for tex)
        history.flush()
    print(f"demo traffic in acme: {stats}")


if __name__ == "__main__":
    main()
