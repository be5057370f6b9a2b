"""The components of the ``/api/v1/`` OpenAPI document: id patterns, the problem answer, the schemas.

The request and answer bodies as JSON Schema, with the bounds the server enforces
(:mod:`leases.api.bodies`, :mod:`leases.ids.validation`); :mod:`leases.api.openapi` puts them
together with the paths.
"""

from __future__ import annotations

from typing import Any

from leases.errors import LeaseBusy, LeaseExpired, StaleLease
from leases.ids.validation import HOLDER_REF_MAX, PAYLOAD_MAX_BYTES, USER_ID_CLASS, USER_ID_MAX

from .bodies import MAX_INTERVAL_SECONDS, MAX_WAIT_MS

NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
# User ids: any Django username or email address (leases.ids.validation.USER_ID_RE, same text).
USER_ID_PATTERN = f"^{USER_ID_CLASS}{{1,{USER_ID_MAX}}}$"
# Tenant and project ids of requests: a leading "_" marks the reserved config-layer ids.
REQUEST_ID_PATTERN = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
TOKEN_PATTERN = "^[A-Za-z0-9_-]{16,64}$"


def problem_schema(code_enum: list[str] | None = None) -> dict[str, Any]:
    """An RFC 9457 problem document; ``code_enum``: the only ``code`` values allowed."""
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


def problem(description: str, schema_ref: str = "Problem", headers: dict[str, Any] | None = None,
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


SCHEMAS: dict[str, Any] = {
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
                     "expiryDeadline", "expiryDeadlineMs", "serverTime", "fence"],
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
            "fence": {
                "type": ["string", "null"], "maxLength": 1024, "pattern": "^1\\.[A-Za-z0-9_-]+\\.[0-9]+\\.[0-9]+$",
                "description": "The grant's fencing token, the same in every renewal: send it with each use of the "
                               "resource, which admits it with a fence guard (leases.fencing) and refuses it once "
                               "the slot was granted again (STALE_FENCE). Opaque to holders. null only for a "
                               "lease granted before fences existed."},
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
    "Problem": problem_schema(),
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
