"""Child process: an HTTP client whose kept ticket is left behind (it stops polling and exits).

Usage:
    python -m tests.workers.http_ticket_client key <tenant> [<project> ...]
        prints a new API key of ``<tenant>`` (creating the tenant and its projects), on the
        store of ``MONGODB_URI``/``MONGODB_DB`` (the checker run's own, where its server looks);
    python -m tests.workers.http_ticket_client <mode> <log-file> <base-url> <secret> <lease> <project> <user>

Modes, each ending with the process gone and its ticket never abandoned (no DELETE):

* ``before`` — ``POST /api/v1/leases`` (type ``tex``: a handler every server registers) with a
  short ``waitMs``; on ``202`` poll once, then
  vanish while the ticket still waits (its grant, if it comes, finds nobody);
* ``after`` — poll until the ticket is next (position 1), then vanish: it is likely granted
  between polls that never come;
* ``hold`` — not a vanisher: keep the lease granted (the POST's or a poll's ``201``) for
  ``HOLD_S`` and release it (``DELETE``): the release hands the slot to the next ticket in
  the same command, between that ticket's polls;
* ``granted`` — vanish with the lease once an answer grants it (the POST's or a poll's
  ``201``) without releasing it (a client that crashed right after its grant): it keeps
  the slot for the lease's TTL, so the next clients get tickets.

In the other modes a ``201`` on the POST itself (a slot was free) is released at once and
the client tries again (it is here to leave a *ticket* behind), a bounded number of times. Every answer is
appended to ``<log-file>`` as a JSON line (``{"at", "what", "status", ...}``) for the report.
"""

import json
import sys
import time

MAX_TRIES = 5
POLL_BOUND_S = 20.0  # a poll loop never outlasts this (the injector does not wait for it)
HOLD_S = 3.0


def make_key(tenant: str, projects: list[str]) -> None:
    import django

    django.setup()
    from insights.models import Project, Tenant
    from leases.api import keys

    row, _ = Tenant.objects.get_or_create(slug=tenant, defaults={"name": tenant})
    for project in projects:
        Project.objects.get_or_create(tenant=row, slug=project, defaults={"name": project})
    print(keys.create_key(tenant_id=tenant, name="checker", acting_user="checker")[1])


def vanish(mode: str, log_file: str, base: str, secret: str, lease: str, project: str, user: str) -> None:
    import requests

    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {secret}"
    with open(log_file, "a", encoding="utf-8") as log:
        def note(what: str, response: requests.Response | None = None, **fields) -> None:
            line = {"at": time.monotonic(), "what": what}
            if response is not None:
                line["status"] = response.status_code
                body = response.json() if response.content else {}
                line.update({k: body.get(k) for k in ("ticket", "token", "position", "level", "code", "ttlSeconds", "expiresAt", "serverTime",
                                                           "deadline") if k in body})
            line.update(fields)
            log.write(json.dumps(line) + "\n")
            log.flush()

        def hold(token: str) -> None:
            time.sleep(HOLD_S)
            released = session.delete(f"{base}/api/v1/leases/{token}", timeout=10)
            note("release", released, token=token)

        for _ in range(MAX_TRIES):
            body = {"type": "tex", "projectId": project, "userId": user, "lease": lease, "waitMs": 200}
            try:
                answer = session.post(f"{base}/api/v1/leases", json=body, timeout=10)
            except requests.RequestException as exc:
                note("post-error", detail=type(exc).__name__)
                time.sleep(0.3)
                continue
            note("post", answer)
            if answer.status_code == 201:
                token = answer.json()["token"]
                if mode == "hold":
                    hold(token)
                    return
                if mode == "granted":
                    note("vanish", ticket=token, token=token)
                    return  # a lease granted at once and gone: its TTL brings it back
                session.delete(f"{base}/api/v1/leases/{token}", timeout=10)
                time.sleep(0.5)
                continue
            if answer.status_code != 202:
                time.sleep(0.3)
                continue
            ticket = answer.json()
            interval = float(ticket.get("pollIntervalSeconds") or 1)
            deadline = time.monotonic() + POLL_BOUND_S
            polls = 0
            while time.monotonic() < deadline:
                if mode == "before" and polls >= 1:
                    note("vanish", ticket=ticket["ticket"], position=ticket.get("position"))
                    return
                if mode == "after" and (ticket.get("position") or 99) <= 1:
                    note("vanish", ticket=ticket["ticket"], position=ticket.get("position"))
                    return
                # Half the interval: the ticket stays alive with room (three intervals).
                time.sleep(interval / 2)
                try:
                    polled = session.get(f"{base}/api/v1/tickets/{ticket['ticket']}", timeout=10)
                except requests.RequestException as exc:
                    note("poll-error", detail=type(exc).__name__)
                    continue
                polls += 1
                note("poll", polled, ticket=ticket["ticket"])
                if polled.status_code == 201:
                    if mode == "hold":
                        hold(polled.json()["token"])
                        return
                    if mode == "granted" or mode == "after":
                        note("vanish", ticket=ticket["ticket"], token=polled.json().get("token"))
                        return  # granted and gone: nobody renews or releases it
                    return
                if polled.status_code != 200:
                    break  # ended (410 expired or stale): try a new ticket
                ticket = {**ticket, **polled.json()}
        note("gave-up")


def main() -> None:
    if sys.argv[1] == "key":
        make_key(sys.argv[2], sys.argv[3:])
    else:
        vanish(*sys.argv[1:8])


if __name__ == "__main__":
    main()
