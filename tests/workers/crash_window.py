"""Child process for the crash-window tests: cycle on lease ``cw``, or stop inside a window.

Usage: python -m tests.workers.crash_window cycle <stop-file> <tenant>
       python -m tests.workers.crash_window arrive <stop-file> <tenant>
       python -m tests.workers.crash_window victim <acquire|release|rollback> <tenant>

``cycle`` loops acquire → hold 30 ms → release until the stop file exists, printing ``C``
per cycle. ``arrive`` is a stream of fresh requests that do not wait (one every 200 ms),
as a busy service sees them. ``victim`` sets ``LEASES_TEST_PAUSE`` so the engine blocks between the two
commands of the named step (the test then sends ``kill -9``); for ``rollback`` the gate's
bookings answer a store error after they were made, which is what makes an acquire roll back.
For ``acquire`` and ``rollback`` the victim books its slots itself: its ticket carries no
attempt, so a release wakes it instead of granting it directly (as for a ticket queued by a
process without the direct hand-off).
"""

import os
import sys
import time

import django

django.setup()

import pymongo.errors  # noqa: E402
from django.conf import settings  # noqa: E402

import leases  # noqa: E402
from leases.engine import funnel, pausepoints  # noqa: E402
from leases.queue import slots  # noqa: E402
from leases.revocation import handlers  # noqa: E402


class Handler(handlers.LeaseHandler):
    type = "cw"

    def on_revoked(self, holder):
        pass


def request(tenant: str, user: str) -> leases.LeaseRequest:
    return leases.LeaseRequest(type="cw", lease="cw", tenant_id=tenant, project_id="p1", user_id=user, pod="")


def main() -> None:
    handlers.register_handler(Handler())
    mode = sys.argv[1]
    if mode == "cycle":
        stop_file, tenant = sys.argv[2], sys.argv[3]
        print("R", flush=True)
        while not os.path.exists(stop_file):
            try:
                with leases.acquire(request(tenant, f"c{os.getpid()}")):
                    time.sleep(0.03)
            except leases.LeaseBusy:
                continue
            print("C", flush=True)
        return
    if mode == "arrive":
        stop_file, tenant = sys.argv[2], sys.argv[3]
        print("R", flush=True)
        while not os.path.exists(stop_file):
            try:
                leases.acquire(leases.LeaseRequest(type="cw", lease="cw", tenant_id=tenant, project_id="p1",
                                                   user_id="arrival", pod="", wait_ms=0)).release()
                print("C", flush=True)
            except leases.LeaseBusy:
                pass
            time.sleep(0.2)
        return
    window, tenant = sys.argv[2], sys.argv[3]
    if window == "rollback":
        real = slots.take

        def failing(specs, booking, resource, **kw):
            booked = real(specs, booking, resource, **kw)
            if booked == len(specs):  # booked, but the answer is lost: the attempt rolls back
                raise pymongo.errors.AutoReconnect("injected: the bookings' answer was lost")
            return booked

        slots.take = failing
    if window in ("acquire", "rollback"):
        real_ticket = funnel.Attempt.ticket

        def self_booking(self, *args, **kw):
            ticket = real_ticket(self, *args, **kw)
            ticket["a"] = None  # not directly grantable: woken, it books itself
            return ticket

        funnel.Attempt.ticket = self_booking
    # Pause points are inert unless the settings arm them (this child runs config.settings).
    settings.LEASES_TEST_PAUSE_POINTS = True
    os.environ[pausepoints.PAUSE_ENV] = window
    lease = leases.acquire(request(tenant, "victim"))
    lease.release()


if __name__ == "__main__":
    main()
