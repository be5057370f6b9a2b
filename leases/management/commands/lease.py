"""``python manage.py lease …``: the operator CLI, across all tenants (the platform operator's view).

Reads go straight to MongoDB (:mod:`leases.ops.reads`). Revocations go through a live pod's
internal admin API (:mod:`leases.revocation.remote`), because only pods run handlers and
know the pod routing; ``--force`` revokes directly in MongoDB when no pod is reachable, and
says what that leaves behind (:mod:`leases.revocation.explain`). ``sweep`` runs on a live pod
too (its handlers), ``--force`` runs it here without any handler; ``reconcile`` runs here (it
needs no handler; :mod:`leases.upkeep.rounds`). This module parses, calls and prints; the
texts are :mod:`leases.ops.reports`.

Exit status: 0 on success, 1 with a one-line ``CommandError`` on bad input, an unknown
token, pod, tenant or project, an unreachable store or no reachable pod; 2 for unknown
options (argparse). With ``--json`` an error is the JSON object
``{"error": {"code": ..., "message": ...}}`` on stdout instead (still exit 1), so a script
reads one format whatever happens.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pymongo.errors
from django.core.management.base import BaseCommand, CommandError, CommandParser

from leases.conf import lease_settings
from leases.definitions import undefined as undefined_names, view as definition_views
from leases.errors import InvalidLeaseRequest, LeaseError, LeaseUnavailable
from leases.ids import validation
from leases.ops import actions, history, lookups, reads, reports
from leases.ops.tables import json_default
from leases.queue import shares
from leases.revocation import explain, remote


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
            self.stdout.write(json.dumps(data, default=json_default, indent=2, sort_keys=True))
        else:
            self.stdout.write(text())

    # --- reads -------------------------------------------------------------------------

    def do_list(self, o: dict[str, Any]) -> None:
        page = reads.list_holders(
            tenant_id=o["tenant"], resource=o["resource"], pod=o["pod"], type=o["type"],
            project_id=o["project"], user_id=o["user"], page=o["page"], per_page=o["per_page"],
        )
        self.emit(o, page.to_dict(), lambda: reports.holders(page))

    def do_show(self, o: dict[str, Any]) -> None:
        holder = reads.get_holder(o["token"])
        self.emit(o, holder.to_dict(), lambda: reports.holder(holder))

    def do_counters(self, o: dict[str, Any]) -> None:
        rows = reads.list_counters(tenant_id=o["tenant"], include_global=o["tenant"] is None)
        if o["drift_only"]:
            rows = [r for r in rows if r.drift]
        self.emit(o, [r.to_dict() for r in rows], lambda: reports.counters(rows, drift_only=o["drift_only"]))

    def do_waiters(self, o: dict[str, Any]) -> None:
        result = reads.operator_waiters(tenant_id=o["tenant"], resource=o["resource"])
        self.emit(o, result.to_dict(), lambda: reports.waiters(result))

    def do_weights(self, o: dict[str, Any]) -> None:
        rows = shares.tenant_weights()
        self.emit(o, rows, lambda: reports.weights(rows))

    def do_set_weight(self, o: dict[str, Any]) -> None:
        raw = o["weight"]
        if raw == "default":
            weight = None
        else:
            try:
                weight = float(raw)
            except ValueError:
                raise InvalidLeaseRequest(f"weight must be a positive number or 'default', got {raw!r}") from None
        after = shares.set_tenant_weight(o["name"], o["tenant"], weight, acting_user=actions.cli_actor())
        self.emit(o, {"lease": o["name"], "tenant": o["tenant"], "weight": weight, "tenantWeights": after},
                  lambda: reports.weight_set(o["name"], o["tenant"], weight))

    def do_undefined(self, o: dict[str, Any]) -> None:
        rows = undefined_names.recent(o["tenant"])
        self.emit(o, [r.to_dict() for r in rows], lambda: reports.undefined(rows, lease_settings.UNDEFINED_LEASE))

    def do_definition(self, o: dict[str, Any]) -> None:
        validation.lease_name(o["name"])
        validation.entity_id(o["tenant"], "tenant id")
        validation.entity_id(o["project"], "project id")
        # A typo in --tenant/--project would otherwise print the defaults as if they applied.
        lookups.require_tenant(o["tenant"], o["project"])
        view = definition_views.definition_view(o["name"], o["tenant"], o["project"])
        self.emit(o, {**view.to_dict(), "defined": view.defined}, lambda: reports.definition(view, defined=view.defined))

    def do_stats(self, o: dict[str, Any]) -> None:
        since = history.parse_since(o["since"])
        lookups.require_history_scope(o["resource"], o["tenant"])
        data = history.query(o["resource"], tenant_id=o["tenant"], since=since, fill=False)
        self.emit(o, data.to_dict(), lambda: reports.stats(data, o["resource"], o["tenant"]))

    # --- acts --------------------------------------------------------------------------

    @staticmethod
    def _endpoint(o: dict[str, Any]) -> str | None:
        url = o.get("endpoint")
        if url and not url.startswith(("http://", "https://")):
            raise CommandError(f"--endpoint must be an http(s) URL, got {url!r}")
        return url or None

    def _revoke(self, o: dict[str, Any], *, pod: str | None = None, token: str | None = None) -> None:
        reason = o["reason"]
        if token is not None:
            validation.token(token)
        else:
            pod = validation.pod_id(pod)
            # "Nothing to revoke" would hide a typo in the pod id.
            lookups.require_pod(pod)
        if o["force"]:
            actor = actions.cli_actor() + " --force"
            if token is not None:
                holders = [actions.revoke_holder(token, acting_user=actor, reason=reason or "forced revoke (CLI)",
                                                 dispatch=False)]
            else:
                holders = actions.revoke_pod(pod or "", acting_user=actor, reason=reason or "forced pod revoke (CLI)",
                                             dispatch=False)
            wire = [h.to_wire() for h in holders]
            note = explain.forced_revoke_note(holders)
            self.emit(o, {"via": "mongodb --force", "handlersRan": False, "revoked": wire, "note": note},
                      lambda: reports.forced_revoke(wire, note))
            return
        via_pod, answer = remote.revoke(actor=actions.cli_actor(), token=token, pod=pod, reason=reason,
                                        endpoint=self._endpoint(o))
        revoked = answer.get("revoked") or []
        via = f"pod {answer.get('pod') or via_pod}"
        self.emit(o, {"via": via, "handlersRan": True, **answer},
                  lambda: reports.revoked(revoked, via, answer.get("dispatchSettled")))

    def do_revoke(self, o: dict[str, Any]) -> None:
        self._revoke(o, token=o["token"])

    def do_revoke_pod(self, o: dict[str, Any]) -> None:
        self._revoke(o, pod=o["pod"])

    def do_sweep(self, o: dict[str, Any]) -> None:
        # Only pods hold the handler registry (types their own code registers): a round run in
        # this process would reap holders whose handlers then run nowhere, hence --force.
        if o["force"]:
            from leases.upkeep import rounds

            result, reaped = rounds.sweep_without_handlers()
            note = explain.forced_sweep_note(result, reaped)
            self.emit(o, {"via": "mongodb --force", "handlersRan": False, **result,
                          "holders": [{**h.to_wire(), "outcome": "not-run", "ranOn": None, "handlerRan": False}
                                      for h in reaped],
                          "note": note}, lambda: note)
            return
        via_pod, answer = remote.sweep(actor=actions.cli_actor(), endpoint=self._endpoint(o))
        via = f"pod {answer.get('pod') or via_pod}"
        self.emit(o, {"via": via, **answer}, lambda: reports.sweep(answer, via))

    def do_reconcile(self, o: dict[str, Any]) -> None:
        from leases.upkeep import rounds

        if o["safety_ms"] is not None and o["safety_ms"] < 0:
            raise CommandError("--safety-ms must be >= 0")
        result = rounds.reconcile_until_done(safety_ms=o["safety_ms"])
        self.emit(o, result, lambda: reports.reconciled(result))
