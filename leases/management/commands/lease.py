"""``python manage.py lease …``: the operator CLI, across all tenants (the platform operator's view).

Reads go straight to MongoDB. Revocations go through a live pod's internal admin API
(``/internal/lease/admin/…``, shared secret), because only pods run handlers and know
the pod routing; ``--force`` revokes directly in MongoDB when no pod is reachable, and says
what that leaves behind. ``sweep`` runs on a live pod too (its handlers), ``--force`` runs it
here without any handler; ``reconcile`` runs here (it needs no handler).

Exit status: 0 on success, 1 with a one-line ``CommandError`` on bad input, an unknown
token, pod, tenant or project, an unreachable store or no reachable pod; 2 for unknown
options (argparse). With ``--json`` an error is the JSON object
``{"error": {"code": ..., "message": ...}}`` on stdout instead (still exit 1), so a script
reads one format whatever happens.
"""

from __future__ import annotations

import getpass
import json
import socket
import sys
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import pymongo.errors
from django.core.management.base import BaseCommand, CommandError, CommandParser

from leases import http_client, ids, validation
from leases.conf import lease_settings
from leases.definitions import undefined as undefined_names
from leases.errors import (
    HolderNotFound,
    InvalidLeaseRequest,
    LeaseError,
    LeaseUnavailable,
    PodCallError,
    PodNotFound,
    ProjectNotFound,
    ResourceNotFound,
    TenantNotFound,
)
from leases.ops import actions, reads
from leases.queue import shares
from leases.revocation.dispatch import SECRET_HEADER

ADMIN_PATH = "/internal/lease/admin"


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        # Stored times are naive UTC (MongoDB's clock).
        return value.isoformat() + ("Z" if value.tzinfo is None else "")
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0:
        return f"expired {int(-value)}s"
    return f"{int(value)}s"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Iterable[str] = ()) -> str:
    """Rows as an aligned plain-text table (numbers right-aligned)."""
    rows = [["-" if cell is None or cell == "" else str(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row)]
    right = {i for i, h in enumerate(headers) if h in set(numeric)}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(row) for row in rows)
    return "\n".join(out)


def _operator() -> str:
    try:
        who = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in some containers
        who = "unknown"
    return f"cli:{who}@{socket.gethostname()}"


def _require_tenant(tenant_id: str, project_id: str) -> None:
    """Fail unless (tenant, project) is known somewhere, so a typo is not answered with defaults.

    Known means: a tenant (project) of the tenancy hook (``LEASES_TENANT_ACCESS``), a stored
    config document or a holder with that id; pods may lease for tenants the hook does not list.

    Raises:
        TenantNotFound: the tenant is known nowhere.
        ProjectNotFound: the project is known nowhere in that tenant.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    from leases.definitions.model import SYSTEM_TENANT, TENANT_PROJECT
    from leases.store import client as store
    from leases.tenancy import tenant_access

    if tenant_id == SYSTEM_TENANT:
        return
    access = tenant_access()
    listed = access.tenant_exists(tenant_id)
    if not listed and not (store.config_documents().find_one({"tenantId": tenant_id}, {"_id": 1})
                           or store.holders().find_one({"tenantId": tenant_id}, {"_id": 1})):
        raise TenantNotFound(f"no tenant {tenant_id!r} (not in Insights, no config document, no holder)")
    if project_id == TENANT_PROJECT:
        return
    scope = {"tenantId": tenant_id, "projectId": project_id}
    if not ((listed and access.project_exists(tenant_id, project_id))
            or store.config_documents().find_one(scope, {"_id": 1}) or store.holders().find_one(scope, {"_id": 1})):
        raise ProjectNotFound(f"tenant {tenant_id!r} has no project {project_id!r} (not in Insights, "
                              f"no config document, no holder)")


def _require_pod(pod: str) -> None:
    """Fail unless ``pod`` is registered or named by a holder.

    Raises:
        PodNotFound: no pod registration and no holder names it.
        pymongo.errors.PyMongoError: the store is unreachable.
    """
    from leases.store import client as store

    if store.pods().find_one({"_id": pod}, {"_id": 1}) is None and store.holders().find_one({"pod": pod}, {"_id": 1}) is None:
        raise PodNotFound(f"unknown pod {pod!r}: it is not registered and no holder names it")


class Command(BaseCommand):
    help = ("Operate resource leases across all tenants: list, show, counters, waiters, definition, undefined, "
            "revoke, revoke-pod, sweep, reconcile, stats.")

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        p = sub.add_parser("list", help="Holders, newest first (filters combine).")
        p.add_argument("--tenant")
        p.add_argument("--resource")
        p.add_argument("--pod")
        p.add_argument("--type")
        p.add_argument("--project")
        p.add_argument("--user")
        p.add_argument("--page", type=int, default=1)
        p.add_argument("--per-page", type=int, default=100)
        p.add_argument("--json", action="store_true", help="Machine-readable output.")

        p = sub.add_parser("show", help="One holder in full.")
        p.add_argument("token", help="Lease token (a token starting with '-' is fine).")
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("counters", help="Counters incl. global, with BOOKED and a drift marker.")
        p.add_argument("--tenant", help="Only this tenant's tenant/project/user counters.")
        p.add_argument("--drift-only", action="store_true", help="Only counters that drifted.")
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("waiters", help="Every waiting ticket across tenants: place in the queue, blocking level, stale ones marked.")
        p.add_argument("--tenant", help="Only this tenant's tickets (positions stay those of the whole queue).")
        p.add_argument("--resource")
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("definition", help="Merged definition as an acquisition sees it (caches discarded).")
        p.add_argument("name")
        p.add_argument("--tenant", required=True)
        p.add_argument("--project", default="_tenant", help="Default: _tenant (no project layer).")
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("undefined", help="Lease names acquired in the last hour that no layer defines "
                                             "(typos: NOOP by default, UNKNOWN_LEASE with "
                                             "LEASES_UNDEFINED_LEASE = 'error').")
        p.add_argument("--tenant", help="Only this tenant's names.")
        p.add_argument("--json", action="store_true")

        for name, what in (("revoke", "token"), ("revoke-pod", "pod")):
            p = sub.add_parser(name, help=f"Revoke {'one holder' if what == 'token' else 'every holder of a pod'} through a live pod.")
            p.add_argument(what)
            p.add_argument("--force", action="store_true",
                           help="Revoke directly in MongoDB without a pod: NO handler runs.")
            p.add_argument("--endpoint", help="Use this pod URL instead of the pod registry.")
            p.add_argument("--reason", default=None, help="Recorded in the audit log.")
            p.add_argument("--json", action="store_true")

        p = sub.add_parser("sweep", help="One reaper round now (idle, dead pods, reconcile), run by a live pod with its handlers.")
        p.add_argument("--force", action="store_true",
                       help="Run the round here, directly in MongoDB, without a pod: NO handler runs.")
        p.add_argument("--endpoint", help="Use this pod URL instead of the pod registry.")
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("reconcile", help="Correct counter drift from holder levels (no pod, no handler).")
        p.add_argument("--safety-ms", type=int, default=None,
                       help="Only counters older than this (default LEASES_RECONCILE_SAFETY_MS).")
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("weights", help="Tenant weights per lease (System layer); unlisted tenants weigh 1.")
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("set-weight", help="Set a tenant's weight on a lease in the System layer (audited); "
                                              "'default' removes it (weight 1).")
        p.add_argument("name", help="Lease name.")
        p.add_argument("tenant", help="Tenant id.")
        p.add_argument("weight", help="A positive number, or 'default'.")
        p.add_argument("--json", action="store_true")

        p = sub.add_parser("stats", help="Per-minute history of one resource: grants, busy, waits, occupancy, reaps.")
        p.add_argument("resource")
        p.add_argument("--tenant", help="Only this tenant's minutes (default: all tenants summed).")
        p.add_argument("--since", default="1h", help="Window: 30m, 1h, 2d … (at most LEASES_HISTORY_HOURS).")
        p.add_argument("--json", action="store_true")

    # --- plumbing ----------------------------------------------------------------------

    # Options of this command (and Django's) that take a value: the word after them is theirs.
    VALUE_OPTIONS = frozenset({"--tenant", "--resource", "--pod", "--type", "--project", "--user", "--page",
                               "--per-page", "--endpoint", "--reason", "--safety-ms", "--since", "--settings",
                               "--pythonpath", "-v", "--verbosity"})

    # Set when run from a shell: a --json error then exits 1 after printing the JSON object
    # (call_command callers get the CommandError instead).
    _exit_after_json_error = False

    def run_from_argv(self, argv: list[str]) -> None:
        # Tokens are url-safe base64 and may start with "-", which argparse would take for an
        # option; move such a token behind "--" so `lease revoke -Xy…` just works.
        if "--" not in argv:
            rest, moved = [], []
            for index, arg in enumerate(argv):
                previous = argv[index - 1] if index else ""
                if (index > 2 and arg.startswith("-") and not arg.startswith("--")
                        and validation.TOKEN_RE.fullmatch(arg) and previous not in self.VALUE_OPTIONS):
                    moved.append(arg)
                else:
                    rest.append(arg)
            argv = rest + (["--", *moved] if moved else [])
        self._exit_after_json_error = True
        super().run_from_argv(argv)

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        handler: Callable[[dict[str, Any]], Any] = getattr(self, "do_" + action.replace("-", "_"))
        try:
            handler(options)
        except LeaseError as exc:
            self.fail(options, exc.code, str(exc))
        except pymongo.errors.PyMongoError as exc:
            self.fail(options, LeaseUnavailable.code, f"MongoDB unreachable ({exc.__class__.__name__})")
        except CommandError as exc:
            if not options.get("json"):
                raise
            code, sep, message = str(exc).partition(": ")
            if not sep or not code.replace("_", "").isalpha() or not code.isupper():
                code, message = InvalidLeaseRequest.code, str(exc)
            self.fail(options, code, message)

    def fail(self, options: dict[str, Any], code: str, message: str) -> None:
        """End the command with error ``code``: a JSON error object under ``--json``, else text.

        Raises:
            CommandError: always (exit status 1), unless run from a shell with ``--json``,
                which exits 1 right after printing the JSON object.
        """
        if options.get("json"):
            self.stdout.write(json.dumps({"error": {"code": code, "message": message}}, sort_keys=True))
            if self._exit_after_json_error:
                sys.exit(1)
        raise CommandError(f"{code}: {message}")

    def emit(self, options: dict[str, Any], data: Any, text: Callable[[], str]) -> None:
        if options.get("json"):
            self.stdout.write(json.dumps(data, default=_json_default, indent=2, sort_keys=True))
        else:
            self.stdout.write(text())

    # --- reads -------------------------------------------------------------------------

    def do_list(self, o: dict[str, Any]) -> None:
        page = reads.list_holders(
            tenant_id=o["tenant"], resource=o["resource"], pod=o["pod"], type=o["type"],
            project_id=o["project"], user_id=o["user"], page=o["page"], per_page=o["per_page"],
        )

        def text() -> str:
            if not page.items:
                return "No holders." if page.total == 0 else f"No holders on page {page.page} (of {page.pages})."
            rows = [(h.token, h.tenant_id, h.project_id, h.user_id, h.resource, h.type, h.pod or "(detached)",
                     h.pod_state, "yes" if h.pod_bound else "no", _when(h.acquired_at), _seconds(h.ttl_remaining_seconds))
                    for h in page.items]
            body = table(["TOKEN", "TENANT", "PROJECT", "USER", "RESOURCE", "TYPE", "POD", "POD-STATE", "BOUND",
                          "ACQUIRED", "TTL-LEFT"], rows, numeric=["TTL-LEFT"])
            return f"{body}\n\n{page.total} holder(s), page {page.page} of {page.pages}."

        self.emit(o, page.to_dict(), text)

    def do_show(self, o: dict[str, Any]) -> None:
        holder = reads.get_holder(o["token"])

        def text() -> str:
            data = holder.to_dict()
            lines = []
            for key in ("token", "state", "tenant_id", "project_id", "user_id", "resource", "lease_name", "type",
                        "holder_ref", "pod", "pod_state", "pod_bound", "ttl_seconds", "acquired_at", "last_seen_at",
                        "expires_at"):
                value = data[key]
                lines.append(f"{key:<16} {_when(value) if isinstance(value, datetime) else value}")
            lines.append(f"{'ttl_left':<16} {_seconds(holder.ttl_remaining_seconds)}")
            lines.append(f"{'levels':<16} {', '.join(ids.readable_key(k) for k in holder.levels) or '-'}")
            lines.append(f"{'payload':<16} {json.dumps(holder.payload, sort_keys=True, default=str)}")
            return "\n".join(lines)

        self.emit(o, holder.to_dict(), text)

    def do_counters(self, o: dict[str, Any]) -> None:
        rows = reads.list_counters(tenant_id=o["tenant"], include_global=o["tenant"] is None)
        if o["drift_only"]:
            rows = [r for r in rows if r.drift]

        def text() -> str:
            if not rows:
                return "No counters." if not o["drift_only"] else "No drift."
            body = table(["RESOURCE", "LEVEL", "SCOPE", "COUNT", "CAP", "BOOKED", "DRIFT"],
                         [(r.resource, r.level, r.readable_scope, r.count, r.cap, r.booked,
                           f"DRIFT {r.count - r.booked:+d}" if r.drift else "") for r in rows],
                         numeric=["COUNT", "CAP", "BOOKED"])
            drifted = sum(1 for r in rows if r.drift)
            tail = f"{len(rows)} counter(s), {drifted} drifted"
            if drifted:
                tail += " (BOOKED is what `lease reconcile` corrects to)"
            return f"{body}\n\n{tail}."

        self.emit(o, [r.to_dict() for r in rows], text)

    def do_waiters(self, o: dict[str, Any]) -> None:
        # Operators see every tenant's tickets, stale ones too (a waiter that died and whose
        # ticket nobody has pruned yet); the tenant filter only narrows the rows.
        tenant = None if o["tenant"] is None else validation.entity_id(o["tenant"], "tenant id")
        result = reads.list_waiters(resource=o["resource"])
        if tenant is not None:
            result = reads.WaiterList([w for w in result.items if w.tenant_id == tenant], result.server_now)
        now = result.server_now

        def blocked(w: reads.WaiterView) -> str:
            if w.blocked_cap is None:
                return w.level
            return f"{w.level} {w.blocked_count}/{w.blocked_cap}"

        def estimate(w: reads.WaiterView) -> str:
            if w.estimated_grant_at is None:
                return "-"
            return f"{max(0.0, (w.estimated_grant_at - now).total_seconds()):.1f}s"

        def text() -> str:
            if not result.items:
                return "No waiting tickets."
            rows = [(w.resource, w.tenant_id, w.project_id, w.user_id,
                     "-" if w.position is None else w.position,
                     _when(w.waiting_since),
                     "-" if w.waiting_since is None else f"{int((now - w.waiting_since).total_seconds())}s",
                     w.priority or "-", estimate(w),
                     blocked(w), "STALE" if w.stale else "", w.ticket_id) for w in result.items]
            body = table(["RESOURCE", "TENANT", "PROJECT", "USER", "POS", "WAITING-SINCE", "WAITED", "CLASS",
                          "EST-GRANT-IN", "BLOCKED-AT", "STALE", "TICKET"], rows,
                         numeric=["POS", "WAITED", "EST-GRANT-IN"])
            stale = sum(1 for w in result.items if w.stale)
            tail = f"{len(result.items)} waiting ticket(s), {stale} stale"
            if stale:
                tail += " (waiter gone: no keep-alive within its TTL; the next reader of the queue prunes it)"
            return f"{body}\n\n{tail}. Server time {_when(now)}."

        self.emit(o, result.to_dict(), text)

    def do_weights(self, o: dict[str, Any]) -> None:
        rows = shares.tenant_weights()

        def text() -> str:
            if not rows:
                return "No tenant weights set: every tenant weighs 1."
            body = table(["LEASE", "TENANT", "WEIGHT"], [(r["lease"], r["tenant"], f"{r['weight']:g}") for r in rows],
                         numeric=["WEIGHT"])
            return f"{body}\n\n{len(rows)} weight(s); tenants not listed weigh 1."

        self.emit(o, rows, text)

    def do_set_weight(self, o: dict[str, Any]) -> None:
        raw = o["weight"]
        if raw == "default":
            weight = None
        else:
            try:
                weight = float(raw)
            except ValueError:
                raise InvalidLeaseRequest(f"weight must be a positive number or 'default', got {raw!r}") from None
        after = shares.set_tenant_weight(o["name"], o["tenant"], weight, acting_user=_operator())
        shown = "1 (default)" if weight is None else f"{weight:g}"
        self.emit(o, {"lease": o["name"], "tenant": o["tenant"], "weight": weight, "tenantWeights": after},
                  lambda: f"Tenant {o['tenant']} now weighs {shown} on lease {o['name']} (System layer; audited).")

    def do_undefined(self, o: dict[str, Any]) -> None:
        rows = undefined_names.recent(o["tenant"])
        mode = lease_settings.UNDEFINED_LEASE

        def text() -> str:
            if not rows:
                return "No undefined lease names acquired in the last hour."
            body = table(["NAME", "TENANT", "PROJECT", "LAST-ACQUIRED", "FIRST-SEEN"],
                         [(r.name, r.tenant_id, r.project_id, _when(r.last_at), _when(r.first_at)) for r in rows])
            then = "acquired NOOP (unlimited)" if mode == "noop" else "refused (UNKNOWN_LEASE)"
            return (f"{body}\n\n{len(rows)} undefined name(s) in the last hour, {then}: define them "
                    f"(lease_config put) or fix the caller's spelling.")

        self.emit(o, [r.to_dict() for r in rows], text)

    def do_definition(self, o: dict[str, Any]) -> None:
        validation.lease_name(o["name"])
        validation.entity_id(o["tenant"], "tenant id")
        validation.entity_id(o["project"], "project id")
        # A typo in --tenant/--project would otherwise print the defaults as if they applied.
        _require_tenant(o["tenant"], o["project"])
        view = reads.definition_view(o["name"], o["tenant"], o["project"])
        undefined = all(f.layer in ("default", "unset") for f in view.fields)

        def text() -> str:
            head = f"lease {view.name} as seen from {view.tenant_id}/{view.project_id}"
            if undefined:
                head += f"  (lease {view.name!r} is not defined in any layer: acquisitions are NOOP)"
            elif view.noop:
                head += "  (NOOP: no level has a cap)"
            body = table(["FIELD", "VALUE", "LAYER"],
                         [(f.field, "no cap" if f.value is None else f.value, f.layer) for f in view.fields])
            return f"{head}\n\n{body}"

        self.emit(o, {**view.to_dict(), "defined": not undefined}, text)

    # --- acts --------------------------------------------------------------------------

    def _pod_endpoints(self, o: dict[str, Any]) -> list[tuple[str, str]]:
        if o.get("endpoint"):
            url = o["endpoint"]
            if not url.startswith(("http://", "https://")):
                raise CommandError(f"--endpoint must be an http(s) URL, got {url!r}")
            return [("(--endpoint)", url.rstrip("/"))]
        return reads.live_pod_endpoints()

    def _call_pod(self, o: dict[str, Any], path: str, body: dict[str, Any], *, timeout: float = http_client.OPERATOR_TIMEOUT_SECONDS,
                  force_hint: str = "rerun with --force to revoke directly in MongoDB (no handler runs)") -> tuple[str, dict[str, Any]]:
        """POST ``body`` to the first live pod that answers; returns (pod, answer)."""
        endpoints = self._pod_endpoints(o)
        if not endpoints:
            raise PodCallError(f"no live pod is registered; {force_hint}")
        tried = []
        for pod, endpoint in endpoints:
            try:
                reply = http_client.call_json("POST", endpoint + ADMIN_PATH + path, body=body, timeout=timeout,
                                              headers={SECRET_HEADER: lease_settings.INTERNAL_SECRET})
            except http_client.HttpCallFailed as exc:
                tried.append(f"{pod} ({endpoint}): {exc.reason}")
                continue
            answer = reply.body if isinstance(reply.body, dict) else {}
            if reply.ok:
                return pod, answer
            if reply.status == 404 and answer.get("code") == HolderNotFound.code:
                raise HolderNotFound(answer.get("message") or "no such holder")
            if reply.status == 400:
                code = answer.get("code", InvalidLeaseRequest.code)
                raise CommandError(f"{code}: {answer.get('message', 'bad request')}")
            if reply.status == 403:
                raise PodCallError(f"pod {pod} ({endpoint}) refused the shared secret: check LEASES_INTERNAL_SECRET")
            tried.append(f"{pod} ({endpoint}): HTTP {reply.status}")
        raise PodCallError("no pod reachable (" + "; ".join(tried) + f"); {force_hint}")

    def _force_note(self, holders: list[Any]) -> str:
        lines = ["--force: revoked directly in MongoDB. NO handler ran."]
        lines.append("  The slots are free and each holder gets LEASE_LOST on its next check(),")
        lines.append("  but nothing stopped the resources themselves:")
        for h in holders:
            if not h.pod:
                what = "is detached (no pod, e.g. an HTTP client), so no pod runs its handler; "
                what += ("the client learns of the end on its next renewal (410)" if h.pod_bound else
                         "its resource lives outside any pod (e.g. a remote session) and is left to its own expiration")
            elif h.pod_bound:
                what = f"lives in pod {h.pod}; it keeps running there until it next checks its lease"
            else:
                what = "lives outside the pod (e.g. a remote session); it is left to its own expiration"
            payload = json.dumps(h.payload, sort_keys=True, default=str) if h.payload else "{}"
            lines.append(f"  - {h.token} ({h.type} on {h.resource}, tenant {h.tenant_id}): {what}; payload {payload}")
        return "\n".join(lines)

    @staticmethod
    def _revoked_table(revoked: list[dict[str, Any]]) -> str:
        rows = [(h["token"], h["tenantId"], h["resource"], h["type"], h["pod"] or "(detached)",
                 "yes" if h["podBound"] else "no") for h in revoked]
        return table(["TOKEN", "TENANT", "RESOURCE", "TYPE", "POD", "BOUND"], rows)

    def _revoked_text(self, revoked: list[dict[str, Any]], via: str, settled: bool | None) -> str:
        if not revoked:
            return f"Nothing to revoke (via {via})."
        state = "handlers dispatched" + ("" if settled is None else (" and finished" if settled else " (still running)"))
        return f"{self._revoked_table(revoked)}\n\nRevoked {len(revoked)} holder(s) via {via}; {state}."

    def _revoke(self, o: dict[str, Any], *, pod: str | None = None, token: str | None = None) -> None:
        reason = o["reason"]
        if token is not None:
            validation.token(token)
        else:
            pod = validation.pod_id(pod)
            # "Nothing to revoke" would hide a typo in the pod id.
            _require_pod(pod)
        pod_id = pod or ""  # validated above whenever no token was given
        if o["force"]:
            if token is not None:
                holders = [actions.revoke_holder(token, acting_user=_operator() + " --force",
                                                    reason=reason or "forced revoke (CLI)", dispatch=False)]
            else:
                holders = actions.revoke_pod(pod_id, acting_user=_operator() + " --force",
                                                reason=reason or "forced pod revoke (CLI)", dispatch=False)
            wire = [h.to_wire() for h in holders]
            note = self._force_note(holders) if holders else "--force: nothing to revoke."
            self.emit(o, {"via": "mongodb --force", "handlersRan": False, "revoked": wire, "note": note},
                      lambda: f"{self._revoked_table(wire)}\n\n{note}" if wire else note)
            return
        path = f"/revoke/{urllib.parse.quote(token, safe='')}" if token is not None else f"/revoke-pod/{urllib.parse.quote(pod_id, safe='')}"
        body = {"actor": _operator()}
        if reason:
            body["reason"] = reason
        via_pod, answer = self._call_pod(o, path, body)
        revoked = answer.get("revoked") or []
        via = f"pod {answer.get('pod') or via_pod}"
        self.emit(o, {"via": via, "handlersRan": True, **answer},
                  lambda: self._revoked_text(revoked, via, answer.get("dispatchSettled")))

    def do_revoke(self, o: dict[str, Any]) -> None:
        self._revoke(o, token=o["token"])

    def do_revoke_pod(self, o: dict[str, Any]) -> None:
        self._revoke(o, pod=o["pod"])

    # The pod answers after its round (bounded by tasks.SWEEP_BUDGET_SECONDS) and the wait
    # for its dispatches (admin_views.SWEEP_SETTLE_SECONDS); the call's bound is above both.
    SWEEP_FORCE_HINT = "rerun with --force to sweep directly in MongoDB (no handler runs)"

    def do_sweep(self, o: dict[str, Any]) -> None:
        # Only pods hold the handler registry (types their own code registers): a round run in
        # this process would reap holders whose handlers then run nowhere.
        if o["force"]:
            self._sweep_forced(o)
            return
        via_pod, answer = self._call_pod(o, "/sweep", {"actor": _operator()}, timeout=http_client.OPERATOR_SWEEP_TIMEOUT_SECONDS,
                                         force_hint=self.SWEEP_FORCE_HINT)
        via = f"pod {answer.get('pod') or via_pod}"
        self.emit(o, {"via": via, **answer}, lambda: self._sweep_text(answer, via))

    @staticmethod
    def _sweep_text(answer: dict[str, Any], via: str) -> str:
        holders = answer.get("holders") or []
        lines = []
        if holders:
            rows = [(h["token"], h["tenantId"], h["type"], h["pod"] or "(detached)", "yes" if h["podBound"] else "no",
                     h["reason"], h["outcome"], h.get("ranOn") or "-") for h in holders]
            lines += [table(["TOKEN", "TENANT", "TYPE", "POD", "BOUND", "REASON", "OUTCOME", "RAN-ON"], rows), ""]
        lines.append(f"Sweep via {via}: {answer['done']} holder(s) reaped or counter(s) corrected in "
                     f"{answer['rounds']} round(s){'; more remain' if answer['hasMore'] else ''}.")
        ran = [h for h in holders if h.get("handlerRan")]
        if ran:
            lines.append(f"Handlers ran (or were accepted by the holder's pod) for {len(ran)} holder(s).")
        released = [h for h in holders if h["outcome"] == "release-only"]
        if released:
            lines.append(f"{len(released)} pod-bound holder(s) of dead pods: release only, their resources died with the pod.")
        unhandled = [h for h in holders if h["outcome"] in ("no-handler", "failed")]
        for h in unhandled:
            why = ("no live pod has a handler for this type" if h["outcome"] == "no-handler"
                   else "its handler raised (see the pod's log)")
            lines.append(f"NO handler ran for {h['token']} ({h['type']}): {why}; payload "
                         f"{json.dumps(h.get('payload') or {}, sort_keys=True)}")
        pending = [h for h in holders if h["outcome"] == "pending"]
        if pending:
            lines.append(f"{len(pending)} handler(s) still running on {via}.")
        return "\n".join(lines)

    def _sweep_forced(self, o: dict[str, Any]) -> None:
        from leases.revocation import listener
        from leases.upkeep import tasks

        reaped: list[Any] = []

        class _Recorder:
            """Receives the round's revocations and runs nothing (``--force``)."""

            def on_revoked(self, holders: list[Any]) -> None:
                reaped.extend(holders)

        previous = listener.get_listener()
        listener.set_listener(_Recorder())
        try:
            result = tasks.sweep()
        finally:
            listener.set_listener(previous)
        lines = [f"--force: swept directly in MongoDB: {result['done']} holder(s) reaped or counter(s) corrected in "
                 f"{result['rounds']} round(s){'; more remain' if result['hasMore'] else ''}. NO handler ran."]
        for h in reaped:
            if h.pod and h.pod_bound:
                what = f"pod-bound to dead pod {h.pod}: the resource died with it, nothing to stop"
            else:
                what = "its resource was NOT stopped and is left to its own expiration"
            payload = json.dumps(h.payload, sort_keys=True, default=str) if h.payload else "{}"
            lines.append(f"  - {h.token} ({h.type} on {h.resource}, tenant {h.tenant_id}, reason {h.reason}): "
                         f"{what}; payload {payload}")
        note = "\n".join(lines)
        self.emit(o, {"via": "mongodb --force", "handlersRan": False, **result,
                      "holders": [{**h.to_wire(), "outcome": "not-run", "ranOn": None, "handlerRan": False}
                                  for h in reaped],
                      "note": note}, lambda: note)

    def do_reconcile(self, o: dict[str, Any]) -> None:
        from leases.upkeep import sweeps

        if o["safety_ms"] is not None and o["safety_ms"] < 0:
            raise CommandError("--safety-ms must be >= 0")
        total, rounds, more = 0, 0, True
        while more and rounds < 100:
            corrected, more = sweeps.reconcile(safety_ms=o["safety_ms"])
            total += corrected
            rounds += 1
        self.emit(o, {"corrected": total, "rounds": rounds, "hasMore": more},
                  lambda: f"Reconcile: {total} counter(s) corrected or removed{'; more remain' if more else ''}.")

    def do_stats(self, o: dict[str, Any]) -> None:
        from leases.definitions.model import TENANT_PROJECT
        from leases.store import client as store
        from leases.telemetry import history

        resource = o["resource"]
        since = history.parse_since(o["since"])
        if o["tenant"] is not None:
            validation.entity_id(o["tenant"], "tenant id")
            # A tenant that left history is known even when its holders and documents are gone.
            if not history.collection().find_one({"tenantId": {"$eq": o["tenant"]}}, {"_id": 1}):
                _require_tenant(o["tenant"], TENANT_PROJECT)
        known = (history.collection().find_one({"resource": {"$eq": resource}}, {"_id": 1})
                 or store.counters().find_one({"resource": {"$eq": resource}}, {"_id": 1})
                 or store.holders().find_one({"resource": {"$eq": resource}}, {"_id": 1}))
        if not known:
            raise ResourceNotFound(f"no resource {resource!r} (no history, counter or holder names it)")
        data = history.query(resource, tenant_id=o["tenant"], since=since, fill=False)

        def text() -> str:
            who = f"tenant {o['tenant']}" if o["tenant"] else "all tenants (peak = sum of the tenants' peaks)"
            head = f"{resource}, {who}, {_when(data.since)} .. {_when(data.until)} UTC"
            if not data.rows:
                return f"{head}\n\nNo minutes recorded."
            reasons = sorted(data.totals.reaps)

            def row(r, label):
                return [label, r.grants, r.busy, r.waits, r.wait_p50_ms, r.wait_p95_ms, r.peak,
                        *[r.reaps.get(x, 0) for x in reasons]]

            body = table(["MINUTE", "GRANTS", "BUSY", "WAITS", "P50-MS", "P95-MS", "PEAK",
                          *[f"REAP-{x.upper()}" for x in reasons]],
                         [row(r, r.minute.strftime("%Y-%m-%d %H:%M")) for r in data.rows] + [row(data.totals, "TOTAL")],
                         numeric=["GRANTS", "BUSY", "WAITS", "P50-MS", "P95-MS", "PEAK",
                                  *[f"REAP-{x.upper()}" for x in reasons]])
            return f"{head}\n\n{body}"

        self.emit(o, data.to_dict(), text)
