"""``manage.py run_demo_consumers``: the two reference consumers against a local demo service.

Starts :class:`leases.contrib.demo.DemoRemoteServer` on 127.0.0.1 (unless ``--remote-url``
points at one), makes this process a pod, and loops the tex job tracker and the browser
session client until Ctrl-C (or ``--rounds``).
"""

from __future__ import annotations

import threading

from django.core.management.base import BaseCommand

from leases.contrib.demo import DemoRemoteServer, run_demo_consumers
from leases.pods import process


class Command(BaseCommand):
    help = "Run the demo consumers (tex job tracker, browser session) against a local demo service."

    def add_arguments(self, parser):
        parser.add_argument("--remote-url", default="", help="An already running demo service (default: start one).")
        parser.add_argument("--rounds", type=int, default=None, help="Stop after this many rounds.")
        parser.add_argument("--pause", type=float, default=1.0, help="Seconds between rounds.")
        parser.add_argument("--tenant", default="demo")
        parser.add_argument("--project", default="docs")
        parser.add_argument("--user", default="alice")

    def handle(self, *args, **options):
        server = None
        remote_url = options["remote_url"]
        if not remote_url:
            from leases.fencing import FenceGuard
            from leases.store import client as store

            # The compile service's own fence records (here in the lease store's database).
            server = DemoRemoteServer(guard=FenceGuard(store.db()["demo_compile_fences"], resource="tex2pdf")).start()
            remote_url = server.url
            self.stdout.write(f"demo remote service at {remote_url}")
        process.start_worker()
        stop = threading.Event()
        try:
            stats = run_demo_consumers(remote_url=remote_url, stop=stop, tenant_id=options["tenant"],
                                       project_id=options["project"], user_id=options["user"],
                                       pause=options["pause"], rounds=options["rounds"])
        except KeyboardInterrupt:
            stop.set()
            stats = {}
        finally:
            process.stop()
            if server is not None:
                server.stop()
        self.stdout.write(f"demo consumers: {stats}")
