"""Input validation: every user-supplied value is checked here before it nears a query.

Tenant and project ids, lease names and tokens are matched against strict ASCII patterns.
User ids are wider (any Django username or email address, up to 150 characters): they are
only ever values (``$literal`` in pipelines) and are encoded (:mod:`leases.ids.encoding`) where they
are joined into counter keys, scopes and booking entries; control characters, whitespace,
invisible format characters and lone surrogates are refused.
"""

from __future__ import annotations

import math
import re
from typing import Any

import bson

from ..errors import InvalidApiKeyRequest, InvalidLeaseRequest, PodLeaseError
from . import encoding as ids_

LEASE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", re.ASCII)
# Tenant, project and user ids: no dots, slashes or pipes (they build counter keys
# ``resource|level|tenant/user``), no ``$``; a leading underscore marks the reserved
# ``_vance`` / ``_tenant`` ids of the config layers.
ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}", re.ASCII)
# User ids: whatever a Django username (letters, digits, ``@.+-_``, Unicode letters too with
# Django's default validator) or an email address can be, up to Django's 150 characters.
# Refused: C0/C1 controls, space and every other Unicode space, the invisible format and
# bidi characters (they make one name look like another); and lone surrogates (no valid
# text has one, so the check is apart: Rust and ECMA regex engines cannot name them).
# Written with ``\u`` escapes so the same text is the OpenAPI pattern (ECMA-262 reads it alike).
USER_ID_MAX = 150
USER_ID_CLASS = ("[^\\u0000-\\u0020\\u007f-\\u00a0\\u00ad\\u1680\\u180e\\u2000-\\u200f"
                 "\\u2028-\\u202f\\u205f-\\u206f\\u3000\\ufeff\\ufff9-\\ufffb]")
_SURROGATE_RE = re.compile(r"[\ud800-\udfff]")
USER_ID_RE = re.compile(f"{USER_ID_CLASS}{{1,{USER_ID_MAX}}}")
# Insights refuses tenant and project slugs with this prefix for the same reason.
RESERVED_ID_PREFIX = "_"
# Pod ids come from host names, so dots are allowed; they are only ever values.
POD_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}", re.ASCII)
RESOURCE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}", re.ASCII)
# resource (128) + level + tenant (64) + a user id encoded (150 characters, 3 each at worst).
COUNTER_KEY_MAX = 128 + 10 + 64 + 1 + 3 * 150
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{16,64}", re.ASCII)
PAYLOAD_MAX_BYTES = 16 * 1024
HOLDER_REF_MAX = 256
# Priority classes: a definition's ``priorities`` and a request's ``priority``. The name
# is stored on tickets and compared as is, so one spelling per class: lowercase ASCII.
PRIORITY_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}", re.ASCII)
# A pod's endpoint is stored and later called by other pods; a bound keeps the document small.
POD_ENDPOINT_MAX = 1024
# The public part of an API key (``vlk_<prefix>_<secret>``): its lookup value in lists and URLs.
API_KEY_PREFIX_RE = re.compile(r"[a-z0-9]{12}", re.ASCII)
API_KEY_NAME_MAX = 100


def _check(pattern: re.Pattern[str], value: Any, what: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise InvalidLeaseRequest(f"invalid {what}: {value!r} (must match {pattern.pattern})")
    return value


def lease_name(value: Any) -> str:
    """Return ``value`` if it is a valid lease name.

    Raises:
        InvalidLeaseRequest: not a string matching ``[A-Za-z0-9][A-Za-z0-9_-]{0,63}``.
    """
    return _check(LEASE_NAME_RE, value, "lease name")


def entity_id(value: Any, what: str) -> str:
    """Return ``value`` if it is a valid tenant, project or user id.

    Raises:
        InvalidLeaseRequest: empty, too long, or containing characters outside ``[A-Za-z0-9_-]``.
    """
    return _check(ID_RE, value, what)


def _is_entity_id(value: str) -> bool:
    return ID_RE.fullmatch(value) is not None


def _is_user_id(value: Any) -> bool:
    return isinstance(value, str) and USER_ID_RE.fullmatch(value) is not None and not _SURROGATE_RE.search(value)


def user_id(value: Any) -> str:
    """Return ``value`` if it is a valid user id: any Django username or email address.

    1 to :data:`USER_ID_MAX` characters; ``.``, ``@``, ``+``, ``$``, ``/``, ``|``, ``%`` and
    non-ASCII letters are all fine (they are encoded where keys are built).

    Raises:
        InvalidLeaseRequest: not a string, empty, longer than 150 characters, or containing a
            control character, whitespace, an invisible format character or a lone surrogate.
    """
    if not _is_user_id(value):
        shown = repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:40] + "…")
        raise InvalidLeaseRequest(
            f"invalid user id: {shown} (1 to {USER_ID_MAX} characters without whitespace or control characters)")
    return value


def request_id(value: Any, what: str) -> str:
    """Return ``value`` if it may name the tenant or project of a request (acquire, API key).

    The config layers address their documents with the reserved ids ``_vance`` (System
    tenant) and ``_tenant`` (tenant-wide project); a request carrying one would make the
    System or Tenant document count again as a deeper layer of its own merge. The layer code
    keeps using :func:`entity_id` for those paths; requests are checked here.

    Raises:
        InvalidLeaseRequest: not a valid :func:`entity_id`, or starting with the reserved ``_``.
    """
    _check(ID_RE, value, what)
    if value.startswith(RESERVED_ID_PREFIX):
        raise InvalidLeaseRequest(
            f"invalid {what}: {value!r} is reserved for the config layers (ids starting with "
            f"{RESERVED_ID_PREFIX!r}, such as _vance and _tenant, name no tenant or project)")
    return value


def pod_id(value: Any) -> str:
    """Return ``value`` if it is a valid pod id.

    Raises:
        InvalidLeaseRequest: not a plain ASCII host-like id.
    """
    return _check(POD_ID_RE, value, "pod id")


def resource_name(value: Any) -> str:
    """Return ``value`` if it is a valid resource (counter) name.

    Raises:
        InvalidLeaseRequest: not matching the resource pattern.
    """
    return _check(RESOURCE_RE, value, "resource")


def counter_key(value: Any) -> str:
    """Return ``value`` if it has the shape of a counter key ``<resource>|<level>|<scope>``.

    The scope is ``*`` (global), a tenant id, or ``tenant/project`` / ``tenant/user``, each
    id encoded as :func:`leases.ids.encode` does (``acme/alice%2Fx``).

    Raises:
        InvalidLeaseRequest: not a counter key of that shape.
    """
    if not isinstance(value, str) or len(value) > COUNTER_KEY_MAX:
        raise InvalidLeaseRequest("invalid counter key: must be <resource>|<level>|<scope>")
    parts = value.split("|")
    if len(parts) != 3:
        raise InvalidLeaseRequest("invalid counter key: must be <resource>|<level>|<scope>")
    resource, level, scope = parts
    resource_name(resource)
    ids = scope.split("/")
    shape_ok = ((level == "global" and scope == "*") or (level == "tenant" and len(ids) == 1)
                or (level in ("project", "user") and len(ids) == 2))
    # Each id is encoded (leases.ids); the last one of a user scope is a user id.
    checks = [_is_entity_id] * len(ids) if level != "user" else [_is_entity_id, _is_user_id]
    if not shape_ok or (scope != "*" and not all(
            ids_.is_encoded(i) and check(ids_.decode(i)) for i, check in zip(ids, checks))):
        raise InvalidLeaseRequest(f"invalid counter key: level {level!r} does not fit scope {scope!r}"
                                  if len(level) <= 16 and len(scope) <= 140 else "invalid counter key")
    return value


def token(value: Any) -> str:
    """Return ``value`` if it has the shape of a lease token.

    Raises:
        InvalidLeaseRequest: not a url-safe token string.
    """
    return _check(TOKEN_RE, value, "lease token")


def holder_ref(value: Any) -> str:
    """Return ``value`` if it is a usable holder reference (free text, stored as a value only).

    Raises:
        InvalidLeaseRequest: not a string, too long, or containing NUL.
    """
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > HOLDER_REF_MAX or "\x00" in value:
        raise InvalidLeaseRequest(f"invalid holder ref: must be a string of at most {HOLDER_REF_MAX} characters without NUL")
    return value


def _check_payload_value(value: Any, path: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not key or key.startswith("$") or "." in key or "\x00" in key:
                raise InvalidLeaseRequest(f"invalid payload key {key!r} at {path or 'top level'}: keys must be non-empty strings without '$' prefix, '.' or NUL")
            _check_payload_value(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_payload_value(item, f"{path}[{index}]")
    elif isinstance(value, str):
        if "\x00" in value:
            raise InvalidLeaseRequest(f"invalid payload value at {path}: NUL in string")
    elif isinstance(value, float):
        # JSON (and JSON Schema) know no int/float split: 1e24 is an integer there, so an
        # integral float must fit the same 64-bit range as an int; NaN/inf are not JSON.
        if not math.isfinite(value) or (value.is_integer() and not -(2**63) <= value < 2**63):
            raise InvalidLeaseRequest(f"invalid payload value at {path}: number out of range")
    elif value is None or isinstance(value, (bool, int)):
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise InvalidLeaseRequest(f"invalid payload value at {path}: integer out of 64-bit range")
    else:
        raise InvalidLeaseRequest(f"invalid payload value at {path}: {type(value).__name__} is not JSON-like")


def payload(value: Any) -> dict[str, Any]:
    """Return ``value`` if it is a JSON-like dict that is safe to store as a subdocument.

    Raises:
        InvalidLeaseRequest: not a dict, ``$``/dotted keys, non JSON-like values, or larger
            than ``PAYLOAD_MAX_BYTES`` once encoded.
    """
    if not isinstance(value, dict):
        raise InvalidLeaseRequest("payload must be a dict")
    _check_payload_value(value, "")
    if len(bson.encode(value)) > PAYLOAD_MAX_BYTES:
        raise InvalidLeaseRequest(f"payload larger than {PAYLOAD_MAX_BYTES} bytes")
    return value


REASON_MAX = 200


def optional(value: Any, check: Any, *args: Any) -> Any:
    """``None`` for a missing filter (``None`` or ``""``), else ``check(value, *args)``.

    Raises:
        InvalidLeaseRequest: whatever ``check`` raises for a present, malformed value.
    """
    if value is None or value == "":
        return None
    return check(value, *args)


def positive_int(value: Any, what: str, maximum: int) -> int:
    """Return ``value`` as an int in ``1..maximum`` (paging, limits); numeric strings are accepted.

    Raises:
        InvalidLeaseRequest: not an integer (booleans are not), or out of range.
    """
    if isinstance(value, bool):
        raise InvalidLeaseRequest(f"{what} must be an integer between 1 and {maximum}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise InvalidLeaseRequest(f"{what} must be an integer between 1 and {maximum}") from None
    if not 1 <= number <= maximum:
        raise InvalidLeaseRequest(f"{what} must be an integer between 1 and {maximum}")
    return number


def reason(value: Any) -> str:
    """Return the stripped operator reason for an action.

    Raises:
        InvalidLeaseRequest: not a non-empty string of at most ``REASON_MAX`` characters, or NUL.
    """
    if not isinstance(value, str) or not value.strip() or len(value) > REASON_MAX or "\x00" in value:
        raise InvalidLeaseRequest(f"reason must be a non-empty string of at most {REASON_MAX} characters")
    return value.strip()


def priority_class(value: Any, what: str = "priority") -> str:
    """Return ``value`` if it is a priority class name (``[a-z][a-z0-9_-]{0,31}``).

    Raises:
        InvalidLeaseRequest: not a string matching :data:`PRIORITY_RE`.
    """
    if not isinstance(value, str) or PRIORITY_RE.fullmatch(value) is None:
        raise InvalidLeaseRequest(f"{what} must be a class name, got {value!r}")
    return value


def pod_endpoint(value: Any) -> str:
    """Return a pod's endpoint URL without trailing slashes; ``""`` when it has none.

    ``None`` and ``""`` mean no endpoint (a pod nobody calls back).

    Raises:
        PodLeaseError: not a string, longer than :data:`POD_ENDPOINT_MAX`, containing NUL,
            or not an ``http://`` / ``https://`` URL (the pod-lease protocol's own error,
            so a registration answers ``POD_LEASE_INVALID``).
    """
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > POD_ENDPOINT_MAX or "\x00" in value:
        raise PodLeaseError("pod endpoint must be a string URL")
    if value and not value.startswith(("http://", "https://")):
        raise PodLeaseError(f"pod endpoint must be an http(s) URL, got {value!r}")
    return value.rstrip("/")


def api_key_name(value: Any) -> str:
    """Return the stripped display name of an API key.

    Raises:
        InvalidApiKeyRequest: not a non-empty single line (no CR, LF or NUL) of at most
            :data:`API_KEY_NAME_MAX` characters.
    """
    if (not isinstance(value, str) or not value.strip() or len(value) > API_KEY_NAME_MAX
            or any(c in value for c in "\x00\r\n")):
        raise InvalidApiKeyRequest(f"key name must be a non-empty single line of at most {API_KEY_NAME_MAX} characters")
    return value.strip()


def api_key_prefix(value: Any) -> str:
    """Return ``value`` if it is an API key's public prefix (12 lowercase letters or digits).

    Raises:
        InvalidApiKeyRequest: not a string matching :data:`API_KEY_PREFIX_RE`.
    """
    if not isinstance(value, str) or API_KEY_PREFIX_RE.fullmatch(value) is None:
        raise InvalidApiKeyRequest(f"invalid key prefix {value!r} (12 lowercase letters or digits)")
    return value
