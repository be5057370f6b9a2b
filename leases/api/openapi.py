"""The OpenAPI 3.1 document of ``/api/v1/``, served at ``GET /api/v1/openapi.json``.

Kept true by ``tests/test_openapi.py``: schemathesis generates requests from this document
against a running server and validates every live answer against it.
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
    LeaseBusy,
    LeaseExpired,
    LeaseUnavailable,
    PriorityNotAllowed,
    ProjectForbidden,
    StaleLease,
    Unauthenticated,
    UnknownLease,
    UnknownLeaseType,
)
from leases.revocation import handlers
from leases.validation import HOLDER_REF_MAX, PAYLOAD_MAX_BYTES, USER_ID_CLASS, USER_ID_MAX

from .bodies import MAX_BODY_BYTES, MAX_INTERVAL_SECONDS, MAX_WAIT_MS
from .problems import BUSY_RETRY_AFTER_SECONDS

NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
# User ids: any Django username or email address (leases.validation.USER_ID_RE, same text).
USER_ID_PATTERN = f"^{USER_ID_CLASS}{{1,{USER_ID_MAX}}}$"
# Tenant and project ids of requests: a leading "_" marks the reserved config-layer ids.
REQUEST_ID_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
TOKEN_PATTERN = "^[A-Za-z0-9_-]{16,64}$"

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
`pollIntervalSeconds`, `deadline` on server time). Poll `GET /api/v1/tickets/{{id}}` every
`pollIntervalSeconds` (`Retry-After`): each poll keeps the place (a ticket not polled by its
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


def _problem_schema(code_enum: list[str] | None = None) -> dict[str, Any]:
    code: dict[str, Any] = {"type": "string"}
    if code_enum:
        code["enum"] = code_enum
    return {
        "type": "object",
        "required": ["type", "title", "status", "code", "detail"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "code": code,
            "detail": {"type": "string"},
        },
    }


def _problem(description: str, schema_ref: str = "Problem", headers: dict[str, Any] | None = None,
             codes: list[str] | None = None) -> dict[str, Any]:
    """A problem answer; ``codes``: the only ``code`` values the operation answers with it."""
    schema: dict[str, Any] = {"$ref": f"#/components/schemas/{schema_ref}"}
    if codes:
        schema = {"allOf": [schema, {"type": "object", "properties": {"code": {"enum": codes}}}]}
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/problem+json": {"schema": schema}},
    }
    if headers:
        response["headers"] = headers
    return response


_SCHEMAS: dict[str, Any] = {
    "InlineDefinition": {
        "type": "object",
        "description": "Inline lease definition: no layers, project-private counter; only project/user caps.",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "pattern": NAME_PATTERN},
            "levels": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "project": {"type": "integer", "minimum": 1, "maximum": 1000000000},
                    "user": {"type": "integer", "minimum": 1, "maximum": 1000000000},
                },
            },
            "ttlSeconds": {"type": "integer", "minimum": 1, "maximum": 604800},
            "waitMs": {"type": "integer", "minimum": 0, "maximum": 600000},
        },
    },
    "AcquireRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["type", "projectId", "userId"],
        # A name reference or an inline definition, not both (neither: a NOOP lease).
        "not": {"required": ["lease", "inline"],
                "properties": {"lease": {"type": "string"}, "inline": {"type": "object"}}},
        # An inline definition names no priority classes (400 INVALID_REQUEST).
        "allOf": [{"not": {"required": ["inline", "priority"],
                           "properties": {"inline": {"type": "object"}, "priority": {"type": "string"}}}}],
        "properties": {
            "type": {"type": "string", "pattern": NAME_PATTERN,
                     "description": "Handler type; must be registered on the server (the enum lists them)."},
            "lease": {"type": ["string", "null"], "pattern": NAME_PATTERN,
                      "description": "Name reference of a lease definition (or give `inline`)."},
            "inline": {"oneOf": [{"$ref": "#/components/schemas/InlineDefinition"}, {"type": "null"}]},
            "projectId": {"type": "string", "pattern": REQUEST_ID_PATTERN,
                          "description": "The project; a project-bound key only accepts its own project (else 403). "
                                         "Ids starting with `_` are reserved for the config layers (400)."},
            "userId": {"type": "string", "minLength": 1, "maxLength": USER_ID_MAX, "pattern": USER_ID_PATTERN,
                       "description": f"The user: any Django username or email address (`alice.smith`, "
                                      f"`bob@example.com`, `c+d`), 1 to {USER_ID_MAX} characters; no whitespace, "
                                      "control or invisible format characters. Compared exactly (no case "
                                      "folding or normalization): send the same spelling every time."},
            "holderRef": {"type": ["string", "null"], "maxLength": HOLDER_REF_MAX, "pattern": "^[^\\u0000]*$"},
            "podBound": {"type": "boolean", "default": False,
                         "description": "Stored as given. HTTP holders are detached (no pod), so no pod's death "
                                        "can take the resource along: a revocation runs the type's handler on the "
                                        "reaping pod with the payload whatever this says."},
            "proposedIntervalSeconds": {"type": "integer", "minimum": 1, "maximum": MAX_INTERVAL_SECONDS},
            "waitMs": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_MS,
                       "description": "Shortens the server's bounded wait for a slot."},
            "priority": {"type": ["string", "null"], "pattern": "^[a-z][a-z0-9_-]{0,31}$",
                         "description": "A priority class of the lease definition (`priorities`, highest first); "
                                        "absent or null: its `defaultPriority`. Not with `inline` (inline "
                                        "definitions name no classes). A class the definition does not "
                                        "name answers 400 INVALID_REQUEST; one the operator does not let this "
                                        "tenant use answers 403 PRIORITY_NOT_ALLOWED (never a silent downgrade). "
                                        "A waiting request of a higher class goes before lower ones; one that "
                                        "waited past `maxStarvationMs` goes before every class."},
        },
    },
    "RenewRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "proposedIntervalSeconds": {"type": "integer", "minimum": 1, "maximum": MAX_INTERVAL_SECONDS},
        },
    },
    "PayloadRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["payload"],
        "properties": {
            "payload": {"allOf": [{"$ref": "#/components/schemas/PayloadObject"}],
                        "description": f"What the revocation handler needs; at most {PAYLOAD_MAX_BYTES} bytes as BSON."},
            "proposedIntervalSeconds": {"type": "integer", "minimum": 1, "maximum": MAX_INTERVAL_SECONDS},
        },
    },
    "PayloadObject": {
        "type": "object",
        "description": "JSON object; keys non-empty, without a leading `$`, without `.` or NUL.",
        "propertyNames": {"pattern": "^[^$.\\u0000][^.\\u0000]*$"},
        "additionalProperties": {"$ref": "#/components/schemas/PayloadValue"},
    },
    "PayloadValue": {
        "oneOf": [
            {"type": "null"},
            {"type": "boolean"},
            {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
            {"type": "number", "not": {"type": "integer"}},
            {"type": "string", "pattern": "^[^\\u0000]*$"},
            {"type": "array", "items": {"$ref": "#/components/schemas/PayloadValue"}},
            {"$ref": "#/components/schemas/PayloadObject"},
        ],
    },
    "Grant": {
        "type": "object",
        "required": ["noop", "token", "type", "leaseName", "resource", "ttlSeconds", "intervalSeconds",
                     "expiryDeadline", "expiryDeadlineMs", "serverTime"],
        "properties": {
            "noop": {"const": False},
            "token": {"type": "string", "pattern": TOKEN_PATTERN},
            "type": {"type": "string"},
            "leaseName": {"type": "string"},
            "resource": {"type": "string"},
            "ttlSeconds": {"type": "integer", "minimum": 1},
            "intervalSeconds": {"type": "integer", "minimum": 1},
            "expiryDeadline": {"type": "string", "format": "date-time",
                               "description": "Server time after which the lease is reaped unless renewed."},
            "expiryDeadlineMs": {"type": "integer", "description": "The same deadline in epoch milliseconds."},
            "serverTime": {"type": "string", "format": "date-time", "description": "Server receipt time of this call."},
        },
    },
    "Ticket": {
        "type": "object",
        "description": "A kept place in the resource's queue: poll it every pollIntervalSeconds.",
        "required": ["ticket", "resource", "leaseName", "position", "level", "pollIntervalSeconds", "deadline",
                     "serverTime"],
        "properties": {
            "ticket": {"type": "string", "pattern": TOKEN_PATTERN,
                       "description": "The ticket id; the lease token once granted."},
            "resource": {"type": "string"},
            "leaseName": {"type": "string"},
            "position": {"type": ["integer", "null"], "minimum": 1,
                         "description": "1-based place in the grant order (tenant-fair, not FIFO)."},
            "level": {"type": "string", "enum": ["user", "project", "tenant", "global"],
                      "description": "The level that blocked it last."},
            "pollIntervalSeconds": {"type": "integer", "minimum": 1},
            "deadline": {"type": "string", "format": "date-time",
                         "description": "Server time by which the next poll must arrive, else the ticket is "
                                        "dropped (410 EXPIRED)."},
            "serverTime": {"type": "string", "format": "date-time", "description": "Server time of this answer."},
            "estimatedGrantAt": {"type": ["string", "null"], "format": "date-time",
                                 "description": "Server time at which the ticket is expected to be granted, from "
                                                "the resource's recent hold durations and the tickets the order "
                                                "rule puts ahead of it; null while the resource has no hold history."},
            "estimatedWaitSeconds": {"type": ["number", "null"], "minimum": 0,
                                     "description": "estimatedGrantAt − serverTime. `Retry-After` is this, rounded "
                                                    "up, at most pollIntervalSeconds and at least 1."},
        },
    },
    "NoopGrant": {
        "type": "object",
        "required": ["noop", "token"],
        "description": "No lease referenced or no caps configured: nothing to hold, nothing to renew or release.",
        "properties": {
            "noop": {"const": True},
            "token": {"type": "null"},
            "type": {"type": "string"},
            "leaseName": {"type": ["string", "null"]},
        },
    },
    "ReleaseResult": {
        "type": "object",
        "required": ["token", "released", "alreadyReleased"],
        "properties": {
            "token": {"type": "string"},
            "released": {"type": "boolean", "description": "This call returned the slots."},
            "alreadyReleased": {"type": "boolean", "description": "The lease had ended before this call."},
            "reason": {"type": ["string", "null"],
                       "description": "How the lease ended: release, idle, pod or revoke."},
        },
    },
    "Problem": _problem_schema(),
    "BusyProblem": {
        "allOf": [
            {"$ref": "#/components/schemas/Problem"},
            {
                "type": "object",
                "required": ["resource", "level", "scope", "count", "cap", "retryAfterSeconds"],
                "properties": {
                    "code": {"const": LeaseBusy.code},
                    "resource": {"type": "string"},
                    "level": {"type": "string", "enum": ["user", "project", "tenant", "global"]},
                    "scope": {"type": "string", "description": "The full level's scope: `*`, `tenant`, "
                              "`tenant/project` or `tenant/user`, each id with `%`, `/` and `|` "
                              "percent-encoded (`acme/a%2Fb` is user `a/b`)."},
                    "count": {"type": ["integer", "null"]},
                    "cap": {"type": "integer"},
                    "retryAfterSeconds": {"type": "integer"},
                },
            },
        ],
    },
    "GoneProblem": {
        "allOf": [
            {"$ref": "#/components/schemas/Problem"},
            {
                "type": "object",
                "properties": {
                    "code": {"enum": [StaleLease.code, LeaseExpired.code]},
                    "reason": {"type": "string", "description": "For EXPIRED: release, idle (also a renewal "
                               "after expiryDeadline), pod, revoke; for tickets also abandoned "
                               "or ticket-expired (not polled by its deadline)."},
                },
            },
        ],
    },
}

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
_POLL_HEADER = {"Retry-After": {"schema": {"type": "integer", "minimum": 1},
                                "description": "Seconds until the next poll (pollIntervalSeconds)."}}

_COMMON = {
    "401": _problem("UNAUTHENTICATED (missing, wrong or revoked API key) or API_KEY_SCOPE_GONE "
                    "(the key's tenant or project was deleted).", headers={
        "WWW-Authenticate": {"schema": {"type": "string"}}}, codes=[Unauthenticated.code, ApiKeyScopeGone.code]),
    "503": _problem("LEASE_UNAVAILABLE: the lease store is unreachable or the configuration is broken.",
                    codes=[LeaseUnavailable.code]),
}
# The 400 answers of each kind of operation, by code; nothing was written.
_BAD_TOKEN = {"400": _problem("INVALID_REQUEST: the token or ticket id does not match its pattern.",
                              codes=[InvalidLeaseRequest.code])}
_BAD_BODY = {"400": _problem("INVALID_BODY (not a JSON object, unknown field, wrong type, out of range), "
                             "BODY_TOO_LARGE, or INVALID_REQUEST (a token that does not match its pattern, "
                             "a payload key or value the store refuses).",
                             codes=[InvalidBody.code, BodyTooLarge.code, InvalidLeaseRequest.code])}
_BAD_ACQUIRE = {"400": _problem(
    "INVALID_BODY / BODY_TOO_LARGE (as for any body); INVALID_REQUEST (an id that does not fit, a reserved "
    "project id, a priority class the lease does not define, a priority with an inline definition); "
    "UNKNOWN_LEASE_TYPE (no handler registered for `type`); INVALID_DEFINITION (a refused inline "
    "definition); UNKNOWN_LEASE (a name no layer defines, when the server sets "
    "LEASES_UNDEFINED_LEASE = \"error\"; by default such a name answers 200 NOOP).",
    codes=[InvalidBody.code, BodyTooLarge.code, InvalidLeaseRequest.code, UnknownLeaseType.code,
           InvalidDefinition.code, UnknownLease.code])}
_GONE = {"410": _problem("STALE_LEASE (unknown token, or another tenant's) or EXPIRED (ended: released, reaped "
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
                    "403": _problem("PROJECT_FORBIDDEN: the key is bound to another project; "
                                    "PRIORITY_NOT_ALLOWED: the tenant may not use that priority class.",
                                    codes=[ProjectForbidden.code, PriorityNotAllowed.code]),
                    "429": _problem("LEASE_BUSY: a level stayed full for the bounded wait.", "BusyProblem", headers={
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
                    "410": _problem("STALE_LEASE: unknown token (or its tombstone expired).", "GoneProblem"),
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
                "responses": {
                    "200": {**_json("Ticket", "Still waiting: the current place and the next deadline."),
                            "headers": _POLL_HEADER},
                    "201": _json("Grant", "Granted (now or by an earlier poll): the acquire's lease body."),
                    **_COMMON, **_BAD_TOKEN,
                    "410": _problem("STALE_LEASE (unknown ticket, or another tenant's) or EXPIRED (not polled "
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
                    "410": _problem("STALE_LEASE: unknown ticket (or its tombstone expired).", "GoneProblem"),
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
    schemas = copy.deepcopy(_SCHEMAS)
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
