"""The OpenAPI 3.1 document of ``/api/v1/``, served at ``GET /api/v1/openapi.json``.

Kept true by ``tests/test_openapi.py``: schemathesis generates requests from this document
against a running server and validates every live answer against it. This module holds the
paths and their answers; the schemas and patterns are :mod:`leases.api.openapi_schemas`.
"""

from __future__ import annotations

import copy
from typing import Any

from leases.conf import lease_settings
from leases.errors import (
    ApiKeyScopeGone,
    BodyTooLarge,
    InvalidBody,
    InvalidDefinition,
    InvalidLeaseRequest,
    LeaseUnavailable,
    PriorityNotAllowed,
    ProjectForbidden,
    Unauthenticated,
    UnknownLease,
    UnknownLeaseType,
)
from leases.ids.validation import PAYLOAD_MAX_BYTES, USER_ID_MAX
from leases.revocation import handlers

from .bodies import MAX_BODY_BYTES, MAX_WAIT_MS
from .openapi_schemas import REQUEST_ID_PATTERN, SCHEMAS, TOKEN_PATTERN, problem
from .problems import BUSY_RETRY_AFTER_SECONDS

_DESCRIPTION = f"""\
Resource leases for consumers that cannot import the Python engine (an MCP server in Node,
a build agent in Go). A lease is a slot on a logical resource, limited per user, project,
tenant and globally; see the consumer contract: acquire → renew at every usage step →
release.

**Authentication.** Every lease operation needs `Authorization: Bearer <API key>`. The
key's tenant (and project, for a project-bound key) binds the lease: tokens of other
tenants answer exactly like unknown tokens (`410 STALE_LEASE`). Missing, wrong or
revoked keys answer `401 UNAUTHENTICATED`; a key whose tenant (or bound project) was
deleted answers `401 API_KEY_SCOPE_GONE`. Project ids starting with `_` (the reserved
`_tenant` / `_vance` of the config layers) answer `400 INVALID_REQUEST`.

**Server-issued lease.** The acquire answer carries `token`, `ttlSeconds`, `expiryDeadline`
(MongoDB server time) and `intervalSeconds`: the server clamps a proposed interval into
`[max(1, ttl/10), max(that, ttl/2)]` (integer division) and issues `ttl/3` (clamped) when
there is no proposal. Renew at that interval or at every usage step. Renewal is idempotent:
the new deadline is `max(previous deadline, now + ttl)`, so duplicate, delayed or replayed
renewals never move it backwards. `410 STALE_LEASE` (unknown token) and `410 EXPIRED`
(reaped, revoked or released) are terminal: acquire a fresh lease. A renewal that arrives
after the deadline does not revive the lease: it answers `410 EXPIRED` (`idle`) and ends it
on the spot, so its slot is free at once.

**Waiting and retries.** An acquire waits for a free slot at most
`min(definition waitMs, request waitMs, {lease_settings.HTTP_MAX_WAIT_MS} ms)` so no web
worker is held for long. When no slot freed by then, an acquire of a named lease keeps its
place in the queue: `202` with a ticket (`Location: /api/v1/tickets/{{id}}`, `position`,
`pollIntervalSeconds`, `deadline` on server time). Poll `GET /api/v1/tickets/{{id}}?waitMs=…` at `Retry-After`
(at most `pollIntervalSeconds`): each poll keeps the place (a ticket not polled by its
`deadline`, three intervals, is dropped: `410 EXPIRED`) and answers `200` with the ticket
while it waits, or `201` with the acquire's lease body once it is its turn (a lost answer
is fetched again by polling once more). `DELETE` gives the place up (or releases the lease
it was granted as). The ticket id becomes the lease token. Unknown and other tenants'
tickets answer `410 STALE_LEASE`. `waitMs: 0` and inline definitions never queue. A
`429 LEASE_BUSY` answer carries the diagnosis (resource, level, scope, count, cap) and
`Retry-After` (seconds; the queue's wait estimate when it has one): retry after it with random jitter and exponential backoff,
bounded by your own deadline. `503 LEASE_UNAVAILABLE` means the lease
cannot be decided (store unreachable, broken configuration): fail closed, do not use the
resource unprotected, retry later.

**Ids and tokens.** `userId`: any Django username or email address (`alice.smith`,
`bob@example.com`, `c+d`), 1 to {USER_ID_MAX} characters without whitespace, control or invisible
format characters; compared exactly. `projectId`: `{REQUEST_ID_PATTERN}`. Tokens and ticket ids:
`{TOKEN_PATTERN}`; any other value in the path answers `400 INVALID_REQUEST`, a well-formed one the
server does not know (made up, expired past its tombstone, or another tenant's) `410 STALE_LEASE`.
A lease name no layer defines answers `200` NOOP, or `400 UNKNOWN_LEASE` where the server sets
`LEASES_UNDEFINED_LEASE = "error"`.

**Limits.** Request bodies at most {MAX_BODY_BYTES} bytes; payloads at most
{PAYLOAD_MAX_BYTES} bytes once BSON-encoded, keys without a leading `$`, `.` or NUL.
Unknown fields, wrong types and oversize bodies answer `400` and write nothing.

**Release** is idempotent: the first call answers `released: true`, later calls
`alreadyReleased: true` with the reason the lease ended (while its tombstone lives, 7 days).
"""


_TOKEN_PARAMETER = {
    "name": "token", "in": "path", "required": True,
    "schema": {"type": "string", "pattern": TOKEN_PATTERN},
    "description": "The lease token from the acquire answer.",
}

_TICKET_PARAMETER = {
    "name": "ticket", "in": "path", "required": True,
    "schema": {"type": "string", "pattern": TOKEN_PATTERN},
    "description": "The ticket id from the 202 acquire answer.",
}
_POLL_HEADER = {"Retry-After": {"schema": {"type": "integer", "minimum": 0},
                                "description": "Seconds until the next poll (at most pollIntervalSeconds; "
                                               "0 after a poll that waited for the grant to the end of its waitMs)."}}

_COMMON = {
    "401": problem("UNAUTHENTICATED (missing, wrong or revoked API key) or API_KEY_SCOPE_GONE "
                    "(the key's tenant or project was deleted).", headers={
        "WWW-Authenticate": {"schema": {"type": "string"}}}, codes=[Unauthenticated.code, ApiKeyScopeGone.code]),
    "503": problem("LEASE_UNAVAILABLE: the lease store is unreachable or the configuration is broken.",
                    codes=[LeaseUnavailable.code]),
}
# The 400 answers of each kind of operation, by code; nothing was written.
_BAD_TOKEN = {"400": problem("INVALID_REQUEST: the token or ticket id does not match its pattern.",
                              codes=[InvalidLeaseRequest.code])}
_BAD_BODY = {"400": problem("INVALID_BODY (not a JSON object, unknown field, wrong type, out of range), "
                             "BODY_TOO_LARGE, or INVALID_REQUEST (a token that does not match its pattern, "
                             "a payload key or value the store refuses).",
                             codes=[InvalidBody.code, BodyTooLarge.code, InvalidLeaseRequest.code])}
_BAD_ACQUIRE = {"400": problem(
    "INVALID_BODY / BODY_TOO_LARGE (as for any body); INVALID_REQUEST (an id that does not fit, a reserved "
    "project id, a priority class the lease does not define, a priority with an inline definition); "
    "UNKNOWN_LEASE_TYPE (no handler registered for `type`); INVALID_DEFINITION (a refused inline "
    "definition); UNKNOWN_LEASE (a name no layer defines, when the server sets "
    "LEASES_UNDEFINED_LEASE = \"error\"; by default such a name answers 200 NOOP).",
    codes=[InvalidBody.code, BodyTooLarge.code, InvalidLeaseRequest.code, UnknownLeaseType.code,
           InvalidDefinition.code, UnknownLease.code])}
_GONE = {"410": problem("STALE_LEASE (unknown token, or another tenant's) or EXPIRED (ended: released, reaped "
                         "idle, its pod died, revoked); terminal, nothing refreshed.", "GoneProblem")}


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _paths() -> dict[str, Any]:
    return {
        "/api/v1/leases": {
            "post": {
                "operationId": "acquireLease",
                "summary": "Acquire a lease",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/AcquireRequest"}}}},
                "responses": {
                    "201": _json("Grant", "The lease is held."),
                    "200": _json("NoopGrant", "NOOP lease: the resource is not limited."),
                    "202": {**_json("Ticket", "No slot within the bounded wait: the request keeps its place. "
                                              "Poll the ticket (Location) every pollIntervalSeconds."),
                            "headers": {**_POLL_HEADER, "Location": {
                                "schema": {"type": "string"}, "description": "/api/v1/tickets/{ticket}"}}},
                    **_COMMON, **_BAD_ACQUIRE,
                    "403": problem("PROJECT_FORBIDDEN: the key is bound to another project; "
                                    "PRIORITY_NOT_ALLOWED: the tenant may not use that priority class.",
                                    codes=[ProjectForbidden.code, PriorityNotAllowed.code]),
                    "429": problem("LEASE_BUSY: a level stayed full for the bounded wait.", "BusyProblem", headers={
                        "Retry-After": {"schema": {"type": "integer", "minimum": 1},
                                        "description": "Seconds to wait before retrying (add jitter)."}}),
                },
            },
        },
        "/api/v1/leases/{token}": {
            "parameters": [_TOKEN_PARAMETER],
            "delete": {
                "operationId": "releaseLease",
                "summary": "Release a lease (idempotent)",
                "responses": {
                    "200": _json("ReleaseResult", "Released now, or already released/ended before."),
                    **_COMMON, **_BAD_TOKEN,
                    "410": problem("STALE_LEASE: unknown token (or its tombstone expired).", "GoneProblem"),
                },
            },
        },
        "/api/v1/leases/{token}/renew": {
            "parameters": [_TOKEN_PARAMETER],
            "post": {
                "operationId": "renewLease",
                "summary": "Check-at-use and renew (idempotent)",
                "requestBody": {"required": False, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/RenewRequest"}}}},
                "responses": {"200": _json("Grant", "Renewed: the new deadline."), **_COMMON, **_BAD_BODY, **_GONE},
            },
        },
        "/api/v1/leases/{token}/payload": {
            "parameters": [_TOKEN_PARAMETER],
            "put": {
                "operationId": "updateLeasePayload",
                "summary": "Replace the payload the revocation handler gets (also renews)",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/PayloadRequest"}}}},
                "responses": {"200": _json("Grant", "Payload stored and lease renewed."), **_COMMON, **_BAD_BODY,
                              **_GONE},
            },
        },
        "/api/v1/tickets/{ticket}": {
            "parameters": [_TICKET_PARAMETER],
            "get": {
                "operationId": "pollTicket",
                "summary": "Keep a wait ticket alive; the lease once it is its turn",
                "parameters": [{
                    "name": "waitMs", "in": "query", "required": False,
                    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS},
                    "description": "Wait up to this long (capped by the server's "
                                   f"{lease_settings.HTTP_MAX_WAIT_MS} ms and by two poll intervals) for the "
                                   "grant when it is expected "
                                   "within it (a long poll): the slot is taken the moment it is granted. "
                                   "A ticket further back, or a server with all its long polls busy, "
                                   "answers at once. After a poll that waited to its end, Retry-After is 0.",
                }],
                "responses": {
                    "200": {**_json("Ticket", "Still waiting: the current place and the next deadline."),
                            "headers": _POLL_HEADER},
                    "201": _json("Grant", "Granted (now or by an earlier poll): the acquire's lease body."),
                    **_COMMON, **_BAD_TOKEN,
                    "410": problem("STALE_LEASE (unknown ticket, or another tenant's) or EXPIRED (not polled "
                                    "by its deadline, abandoned, or its lease ended); terminal.", "GoneProblem"),
                },
            },
            "delete": {
                "operationId": "abandonTicket",
                "summary": "Give up a wait ticket, or release the lease it was granted as (idempotent)",
                "responses": {
                    "204": {"description": "Abandoned (or its lease released) by this call."},
                    "200": _json("ReleaseResult", "It had ended before (alreadyReleased, with the reason)."),
                    **_COMMON, **_BAD_TOKEN,
                    "410": problem("STALE_LEASE: unknown ticket (or its tombstone expired).", "GoneProblem"),
                },
            },
        },
        "/api/v1/openapi.json": {
            "get": {
                "operationId": "openapiDocument",
                "summary": "This document",
                "security": [],
                "responses": {"200": {"description": "OpenAPI 3.1 document",
                                      "content": {"application/json": {"schema": {"type": "object"}}}}},
            },
        },
    }


def document(server_url: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document; ``server_url`` becomes its ``servers`` entry.

    ``type`` lists the lease types registered in this process (a request naming another
    type is refused), so the contract says exactly what the server accepts.
    """
    schemas = copy.deepcopy(SCHEMAS)
    types = handlers.registered_types()
    if types:
        schemas["AcquireRequest"]["properties"]["type"]["enum"] = types
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Vance lease API", "version": "1.0.0", "description": _DESCRIPTION},
        "paths": _paths(),
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer",
                                               "description": "A tenant API key (vlk_…), shown once on creation."}},
        },
        "security": [{"bearerAuth": []}],
    }
    if server_url:
        doc["servers"] = [{"url": server_url.rstrip("/")}]
    return doc


__all__ = ["document", "BUSY_RETRY_AFTER_SECONDS"]
