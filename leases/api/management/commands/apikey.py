"""``manage.py apikey create|list|revoke``: API keys for the HTTP lease API.

    manage.py apikey create --tenant acme [--project docs] --name "mcp prod"
    manage.py apikey list [--tenant acme] [--active]
    manage.py apikey revoke <prefix> [--tenant acme]

``create`` prints the plaintext key once (stdout, last line) — it is not stored.
"""

from __future__ import annotations

import getpass
import os

from django.core.management.base import BaseCommand, CommandError

from leases.api import keys
from leases.errors import LeaseError


def _cli_actor(explicit: str | None) -> str:
    if explicit:
        return explicit
    try:
        who = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        who = os.environ.get("USER", "unknown")
    return f"cli:{who}"


class Command(BaseCommand):
    help = "Create, list or revoke API keys of the HTTP lease API."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key and print it once")
        create.add_argument("--tenant", required=True)
        create.add_argument("--project", default=None, help="bind the key to this project")
        create.add_argument("--name", required=True)
        create.add_argument("--by", default=None, help="who acts (default cli:<os user>)")
        listing = sub.add_parser("list", help="list keys (never their secrets)")
        listing.add_argument("--tenant", default=None)
        listing.add_argument("--active", action="store_true", help="hide revoked keys")
        revoke = sub.add_parser("revoke", help="revoke a key by its prefix")
        revoke.add_argument("prefix")
        revoke.add_argument("--tenant", default=None, help="only if the key belongs to this tenant")
        revoke.add_argument("--by", default=None)

    def handle(self, *args, **options):
        try:
            getattr(self, f"_{options['action']}")(options)
        except LeaseError as exc:
            raise CommandError(f"{exc.code}: {exc}") from None

    def _create(self, options):
        key, plaintext = keys.create_key(tenant_id=options["tenant"], project_id=options["project"],
                                         name=options["name"], acting_user=_cli_actor(options["by"]))
        scope = f"{key.tenant_id}/{key.project_id}" if key.project_id else key.tenant_id
        self.stderr.write(f"created API key {key.prefix} ({key.name}) for {scope}; it is shown only once:")
        self.stdout.write(plaintext)

    def _list(self, options):
        rows = keys.list_keys(tenant_id=options["tenant"], include_revoked=not options["active"])
        self.stdout.write(f"{'PREFIX':<13} {'TENANT':<20} {'PROJECT':<20} {'STATUS':<8} {'CREATED':<17} {'BY':<16} NAME")
        for key in rows:
            status = "revoked" if key.revoked_at else "active"
            created = key.created_at.strftime("%Y-%m-%d %H:%M") if key.created_at else "-"
            self.stdout.write(f"{key.prefix:<13} {key.tenant_id:<20} {key.project_id or '*':<20} {status:<8} "
                              f"{created:<17} {key.created_by:<16} {key.name}")

    def _revoke(self, options):
        key = keys.revoke_key(tenant_id=options["tenant"], prefix=options["prefix"],
                              acting_user=_cli_actor(options["by"]))
        self.stdout.write(f"revoked API key {key.prefix} ({key.name}) of {key.tenant_id} at {key.revoked_at:%Y-%m-%d %H:%M:%S} UTC")
