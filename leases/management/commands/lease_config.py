"""``manage.py lease_config put|delete|list|show``: the stored lease definition layers."""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from leases.definitions import layers as config, model as definitions
from leases.errors import LeaseError


class Command(BaseCommand):
    help = "Write, delete, list or show lease config documents (_vance/config/lease/<name>.yaml)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        put = sub.add_parser("put", help="create or replace a layer document")
        delete = sub.add_parser("delete", help="delete a layer document")
        for p in (put, delete):
            p.add_argument("tenant", help="tenant id (_vance for the System layer)")
            p.add_argument("project", help="project id (_tenant for the System/Tenant layers)")
            p.add_argument("name", help="lease name")
        put.add_argument("--file", default="-", help="YAML file to store ('-' reads standard input)")
        listing = sub.add_parser("list", help="list stored documents")
        listing.add_argument("--tenant")
        listing.add_argument("--json", action="store_true")
        show = sub.add_parser("show", help="print one stored document")
        show.add_argument("tenant")
        show.add_argument("project")
        show.add_argument("name")

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"_{action}")(**options)
        except LeaseError as exc:
            raise CommandError(f"{exc.code}: {exc}") from None

    def _put(self, tenant, project, name, file, **_):
        text = sys.stdin.read() if file == "-" else open(file, encoding="utf-8").read()
        path = definitions.document_path(name)
        config.put_document(tenant, project, path, text)
        self.stdout.write(f"stored {path} for {tenant}/{project}")
        note = config.ignored_note(tenant, project, path, text)
        if note:
            self.stdout.write(self.style.WARNING(f"warning: {note}"))

    def _delete(self, tenant, project, name, **_):
        existed = config.delete_document(tenant, project, definitions.document_path(name))
        self.stdout.write(("deleted " if existed else "no such document ") + f"{definitions.document_path(name)} for {tenant}/{project}")
        if not existed:
            raise CommandError("nothing deleted")

    def _list(self, tenant=None, json=False, **_):  # noqa: A002 - mirrors the flag
        rows = config.list_documents(tenant)
        if json:
            self.stdout.write(_json_dumps([{k: r.get(k) for k in ("tenantId", "projectId", "path")} for r in rows]))
            return
        for row in rows:
            self.stdout.write(f"{row['tenantId']:<20} {row['projectId']:<20} {row['path']}")

    def _show(self, tenant, project, name, **_):
        for row in config.list_documents(tenant):
            if row["projectId"] == project and row["path"] == definitions.document_path(name):
                self.stdout.write(row["text"])
                return
        raise CommandError(f"no document {definitions.document_path(name)} for {tenant}/{project}")


def _json_dumps(value) -> str:
    return json.dumps(value, indent=2)
