"""Strict JSON request bodies: size limit, one JSON object, known fields, exact types.

A body is refused (``400``, nothing written) when it is larger than
:data:`MAX_BODY_BYTES`, not UTF-8 JSON, not an object, has duplicate or unknown keys,
``NaN``/``Infinity``, or a field of the wrong type. Values that reach the engine are then
validated again by ``leases.ids.validation`` (ids, names, payload keys).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest

from leases.errors import BodyTooLarge, InvalidBody, InvalidLeaseRequest

MAX_BODY_BYTES = 32 * 1024  # documented in the OpenAPI document (payloads: 16 KiB BSON)
MAX_INTERVAL_SECONDS = 7 * 24 * 3600
MAX_WAIT_MS = 10 * 60 * 1000


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise InvalidBody(f"duplicate key {key!r} in JSON body")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise InvalidBody(f"{name} is not valid JSON")


def read_object(request: HttpRequest, *, optional: bool = False) -> dict[str, Any]:
    """The request body as a JSON object (``{}`` for an empty body when ``optional``).

    Raises:
        BodyTooLarge: more than :data:`MAX_BODY_BYTES` bytes (checked before reading).
        InvalidBody: not a UTF-8 JSON object, duplicate keys, NaN/Infinity.
    """
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise InvalidBody("invalid Content-Length") from None
    if declared > MAX_BODY_BYTES:
        raise BodyTooLarge(f"request body larger than {MAX_BODY_BYTES} bytes")
    try:
        raw = request.body
    except RequestDataTooBig:
        raise BodyTooLarge(f"request body larger than {MAX_BODY_BYTES} bytes") from None
    if len(raw) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"request body larger than {MAX_BODY_BYTES} bytes")
    if not raw.strip():
        if optional:
            return {}
        raise InvalidBody("a JSON object body is required")
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except UnicodeDecodeError:
        raise InvalidBody("request body is not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, InvalidBody):
            raise
        raise InvalidBody(f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidBody("request body must be a JSON object")
    return value


# --- field checks -------------------------------------------------------------------------

def string(value: Any, name: str) -> str:
    """``value`` if it is a string.

    Raises:
        InvalidBody: any other JSON type.
    """
    if not isinstance(value, str):
        raise InvalidBody(f"{name} must be a string")
    return value


def optional_string(value: Any, name: str) -> str | None:
    """``value`` if it is a string or null.

    Raises:
        InvalidBody: any other JSON type.
    """
    return None if value is None else string(value, name)


def boolean(value: Any, name: str) -> bool:
    """``value`` if it is ``true`` or ``false``.

    Raises:
        InvalidBody: any other JSON value (``1`` and ``"yes"`` included).
    """
    if not isinstance(value, bool):
        raise InvalidBody(f"{name} must be true or false")
    return value


def _as_int(value: Any) -> int | None:
    # bool is an int in Python; JSON true must not become 1. JSON Schema counts 5.0 as an
    # integer, so an integral float is one too.
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def integer(minimum: int, maximum: int) -> Callable[[Any, str], int]:
    """A check accepting integers in ``[minimum, maximum]``; the check raises
    :class:`InvalidBody` for anything else (booleans and fractional numbers included)."""
    def check(value: Any, name: str) -> int:
        number = _as_int(value)
        if number is None or not minimum <= number <= maximum:
            raise InvalidBody(f"{name} must be an integer between {minimum} and {maximum}")
        return number
    return check


def obj(value: Any, name: str) -> dict[str, Any]:
    """``value`` if it is a JSON object.

    Raises:
        InvalidBody: any other JSON type.
    """
    if not isinstance(value, dict):
        raise InvalidBody(f"{name} must be a JSON object")
    return value


def optional_obj(value: Any, name: str) -> dict[str, Any] | None:
    """``value`` if it is a JSON object or null.

    Raises:
        InvalidBody: any other JSON type.
    """
    return None if value is None else obj(value, name)


def inline_definition(value: Any, name: str) -> dict[str, Any] | None:
    """An inline definition object (or null); integral floats of its numbers become ints.

    The engine validates the rest and refuses with ``INVALID_DEFINITION``.

    Raises:
        InvalidBody: not a JSON object or null.
    """
    definition = optional_obj(value, name)
    if definition is None:
        return None
    definition = dict(definition)
    # The engine skips null fields; over HTTP a null is a wrong type, as the contract says.
    if any(definition.get(field, 0) is None for field in ("levels", "ttlSeconds", "waitMs")) or (
            isinstance(definition.get("levels"), dict) and None in definition["levels"].values()):
        raise InvalidBody(f"{name}: levels, caps, ttlSeconds and waitMs must not be null")
    for field in ("ttlSeconds", "waitMs"):
        number = _as_int(definition.get(field))
        if isinstance(definition.get(field), float) and number is not None:
            definition[field] = number
    if isinstance(definition.get("levels"), dict):
        definition["levels"] = {level: (_as_int(cap) if isinstance(cap, float) and _as_int(cap) is not None else cap)
                                for level, cap in definition["levels"].items()}
    return definition


def fields(body: dict[str, Any], spec: dict[str, Callable[[Any, str], Any]], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check ``body`` against ``spec`` (field name → check); absent optional fields are omitted.

    Raises:
        InvalidBody: unknown fields, missing required fields, or a failed check.
    """
    unknown = sorted(set(body) - set(spec))
    if unknown:
        raise InvalidBody(f"unknown fields {unknown}; allowed: {sorted(spec)}")
    missing = [name for name in required if name not in body]
    if missing:
        raise InvalidBody(f"missing required fields {missing}")
    return {name: spec[name](body[name], name) for name in spec if name in body}


ACQUIRE_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "type": string,
    "lease": optional_string,
    "inline": inline_definition,
    "projectId": string,
    "userId": string,
    "holderRef": optional_string,
    "podBound": boolean,
    "proposedIntervalSeconds": integer(1, MAX_INTERVAL_SECONDS),
    "waitMs": integer(0, MAX_WAIT_MS),
    "priority": optional_string,
}
RENEW_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "proposedIntervalSeconds": integer(1, MAX_INTERVAL_SECONDS),
}
PAYLOAD_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "payload": obj,
    "proposedIntervalSeconds": integer(1, MAX_INTERVAL_SECONDS),
}


def query_integer(request: HttpRequest, name: str, low: int, high: int) -> int:
    """The query parameter ``name`` (the only one allowed) as an integer in ``[low, high]``
    (``low`` when absent).

    Raises:
        InvalidLeaseRequest: another query parameter, ``name`` given more than once, or not a
            decimal integer in range.
    """
    unknown = sorted(set(request.GET) - {name})
    if unknown:
        raise InvalidLeaseRequest(f"unknown query parameters {unknown}; allowed: [{name!r}]")
    values = request.GET.getlist(name)
    if not values:
        return low
    if len(values) > 1:
        raise InvalidLeaseRequest(f"{name} given more than once")
    raw = values[0]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 12 or not low <= int(raw) <= high:
        raise InvalidLeaseRequest(f"{name} must be an integer from {low} to {high}")
    return int(raw)
