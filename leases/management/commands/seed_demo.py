"""``python manage.py seed_demo``: two demo tenants with admins, members, projects, config
documents and live holders, for trying Insights → Leases and the ``lease`` CLI.

Idempotent: users, tenants and documents are updated in place; the demo tenants' holders
are released and acquired afresh on every run.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

import leases
from leases import service
from leases.definitions import layers as config
from leases.definitions.model import TENANT_PROJECT, document_path
from leases.errors import LeaseError
from leases.ids import validation
from leases.store import client as store, entries

DEFAULT_PASSWORD = "demo-pass-123"

TENANTS = {
    "acme": {"name": "Acme Corp", "projects": ["docs", "web"], "users": ["alice", "bob", "carol"]},
    "globex": {"name": "Globex Inc", "projects": ["research"], "users": ["dave", "erin"]},
}

# (tenant, project, path, YAML). Long TTLs keep the demo holders alive for a day; the
# project layer of acme/docs shows a field coming from a deeper layer.
DOCUMENTS = [
    ("acme", TENANT_PROJECT, document_path("tex"), "levels:\n  tenant: 3\nttlSeconds: 86400\n"),
    ("acme", "docs", document_path("tex"), "levels:\n  project: 2\n"),
    ("acme", TENANT_PROJECT, document_path("browser"), "ttlSeconds: 86400\n"),
    ("globex", TENANT_PROJECT, document_path("tex"), "levels:\n  tenant: 2\nttlSeconds: 86400\n"),
    ("globex", TENANT_PROJECT, document_path("browser"), "ttlSeconds: 86400\n"),
]

# (type, lease, tenant, project, user, holder_ref, payload)
HOLDERS = [
    ("tex", "tex", "acme", "docs", "alice", "compile:handbook.tex", {"jobId": "job-7f3a"}),
    ("tex", "tex", "acme", "docs", "bob", "compile:release-notes.tex", {"jobId": "job-7f3b"}),
    ("tex", "tex", "acme", "web", "carol", "compile:landing.tex", {"jobId": "job-81c0"}),
    ("browser", "browser", "acme", "docs", "alice", "mcp:playwright",
     {"tool": "browser", "endpoint": "http://127.0.0.1:9/mcp", "sessionId": "sess-acme-1"}),
    ("browser", "browser", "acme", "web", "bob", "mcp:playwright",
     {"tool": "browser", "endpoint": "http://127.0.0.1:9/mcp", "sessionId": "sess-acme-2"}),
    ("tex", "tex", "globex", "research", "dave", "compile:paper.tex", {"jobId": "job-g001"}),
    ("browser", "browser", "globex", "research", "erin", "mcp:playwright",
     {"tool": "browser", "endpoint": "http://127.0.0.1:9/mcp", "sessionId": "sess-globex-1"}),
]


class Command(BaseCommand):
    help = "Create demo tenants acme and globex (admins, members, projects, config documents, live holders)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--password", default=DEFAULT_PASSWORD, help=f"Password of every demo user (default {DEFAULT_PASSWORD}).")
        parser.add_argument("--pod", default="",
                            help="Pod id the demo holders belong to (default: detached, so only the idle reap applies).")
        parser.add_argument("--no-drift", action="store_true", help="Do not plant one drifted counter.")

    def handle(self, *args: Any, **options: Any) -> None:
        from insights.models import Membership, Project, Tenant

        password = options["password"]
        if not isinstance(password, str) or len(password) < 8:
            raise CommandError("--password must have at least 8 characters")
        pod = options["pod"]
        if pod:
            try:
                validation.pod_id(pod)
            except LeaseError as exc:
                raise CommandError(str(exc)) from None

        User = get_user_model()

        def user(username: str, *, staff: bool = False) -> Any:
            account, _ = User.objects.get_or_create(username=username)
            account.set_password(password)
            account.is_staff = account.is_superuser = staff
            account.save()
            return account

        user("ops-admin", staff=True)
        for slug, spec in TENANTS.items():
            tenant, _ = Tenant.objects.update_or_create(slug=slug, defaults={"name": spec["name"]})
            for project in spec["projects"]:
                Project.objects.get_or_create(tenant=tenant, slug=project, defaults={"name": project.title()})
            for username, role in ((f"{slug}-admin", Membership.Role.ADMIN), (f"{slug}-member", Membership.Role.MEMBER)):
                Membership.objects.update_or_create(user=user(username), tenant=tenant, defaults={"role": role})

        for tenant_id, project_id, path, text in DOCUMENTS:
            config.put_document(tenant_id, project_id, path, text)

        # Fresh holders on every run: release what an earlier run left.
        for old in store.holders().find({"tenantId": {"$in": list(TENANTS)}}, {"_id": 1}):
            service.release_token(old["_id"])
        acquired = []
        for type_, lease, tenant_id, project_id, user_id, ref, payload in HOLDERS:
            try:
                held = leases.acquire(leases.LeaseRequest(
                    type=type_, lease=lease, tenant_id=tenant_id, project_id=project_id, user_id=user_id,
                    holder_ref=ref, pod=pod, pod_bound=type_ == "tex", wait_ms=0,
                ))
            except LeaseError as exc:
                self.stderr.write(f"  {tenant_id}/{project_id}/{user_id} {lease}: {exc.code} ({exc})")
                continue
            held.update_payload(payload)
            acquired.append(held)

        drift = ""
        if not options["no_drift"]:
            key = "browser|tenant|acme"
            # What a crash between a release's delete and its pull leaves: an entry whose
            # holder is gone. Repair returns it when the counter is next found full.
            leaked = entries.entry("acme", "docs", "crashed", "demo-leaked-slot")
            current = store.counters().find_one({"_id": key}, {"cap": 1}) or {}
            if current and store.counters().update_one(
                    {"_id": key, "holders": {"$ne": leaked}, "count": {"$lt": int(current.get("cap", 0))}},
                    {"$push": {"holders": leaked}, "$inc": {"count": 1}}).matched_count:
                drift = (f"  Planted drift: counter {key} books a slot for a holder that is gone "
                         "(repair or `lease reconcile` returns it).\n")

        self.stdout.write(
            "Demo data ready.\n"
            f"  Users (password {password!r}): acme-admin, acme-member, globex-admin, globex-member; "
            "ops-admin is a Django-admin superuser.\n"
            f"  Tenants: acme (docs, web), globex (research); {len(acquired)} live holders "
            f"({'detached' if not pod else 'pod ' + pod}, TTL 1 day).\n"
            f"{drift}"
            "  Open /t/acme/insights/leases after logging in as acme-admin."
        )
