"""API-key service: create (plaintext shown once), list, revoke, authenticate a bearer key.

A key is ``vlk_<prefix>_<secret>``: ``prefix`` (12 lowercase letters/digits) is the public
id used in lists and as the lookup value; ``secret`` is 32 random bytes, url-safe base64.
Only the SHA-256 of the whole key is stored and compared with ``hmac.compare_digest``.
Every create and revoke writes an audit record (``lease_audit``, MongoDB time).

A key names an existing tenant and, when bound, one of its projects (asked of the tenancy
hook, ``LEASES_TENANT_ACCESS``):
a key for a made-up tenant would book counters that share the global cap while no tenant
admin can see them. The scope is checked again on every authentication, so a key whose
tenant or project was deleted stops working.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import string
from typing import Any

import pymongo.errors
from django.db import DatabaseError
from django.utils import timezone

from leases.errors import (
    ApiKeyNotFound,
    ApiKeyScopeGone,
    InvalidApiKeyRequest,
    LeaseUnavailable,
    Unauthenticated,
    UnknownProject,
    UnknownTenant,
)
from leases.ids import validation
from leases.revocation import audit

from .models import ApiKey

log = logging.getLogger(__name__)

KEY_PREFIX = "vlk_"
PREFIX_LENGTH = 12
_PREFIX_ALPHABET = string.ascii_lowercase + string.digits
KEY_RE = re.compile(r"vlk_([a-z0-9]{12})_([A-Za-z0-9_-]{43})", re.ASCII)
NAME_MAX = validation.API_KEY_NAME_MAX  # the key form's max_length
# Compared against when no key has the presented prefix, so a miss costs the same time
# as a wrong secret.
_DUMMY_HASH = hashlib.sha256(b"no such key").hexdigest()


def hash_key(plaintext: str) -> str:
    """The stored form of a key: hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def _unavailable(exc: Exception) -> LeaseUnavailable:
    return LeaseUnavailable(f"key store unreachable: {exc.__class__.__name__}")


def _missing_scope(tenant_id: str, project_id: str | None) -> type[InvalidApiKeyRequest] | None:
    """Which part of (tenant, project) does not exist: ``UnknownTenant``, ``UnknownProject`` or None.

    Raises:
        DatabaseError: the store is unreachable (callers turn it into LeaseUnavailable).
    """
    from leases.tenancy import tenant_access

    access = tenant_access()
    # A project that exists implies its tenant does: a key's every request asks, so the
    # tenant is looked up on its own only when there is no project or it was not found.
    if project_id and access.project_exists(tenant_id, project_id):
        return None
    if not access.tenant_exists(tenant_id):
        return UnknownTenant
    return UnknownProject if project_id else None


def _scope_text(missing: type[InvalidApiKeyRequest], tenant_id: str, project_id: str | None) -> str:
    return f"no tenant {tenant_id!r}" if missing is UnknownTenant else f"tenant {tenant_id!r} has no project {project_id!r}"


def _audit(action: str, key: ApiKey, actor: str) -> None:
    audit.record(action, actor=actor, tenantId=key.tenant_id, projectId=key.project_id, keyPrefix=key.prefix,
                 keyName=key.name)


def create_key(*, tenant_id: str, project_id: str | None = None, name: str, acting_user: Any) -> tuple[ApiKey, str]:
    """Create a key for ``tenant_id`` (bound to ``project_id`` when given).

    Returns:
        ``(key, plaintext)``; the plaintext is not stored anywhere and cannot be shown again.

    Raises:
        InvalidLeaseRequest: malformed or reserved (``_vance``, ``_tenant``) tenant or project id.
        UnknownTenant: no such tenant; nothing was written.
        UnknownProject: the tenant has no such project; nothing was written.
        InvalidApiKeyRequest: bad name; nothing was written.
        InvalidLeaseRequest: missing or malformed ``acting_user``; nothing was written.
        LeaseUnavailable: the store is unreachable.
    """
    validation.request_id(tenant_id, "tenant id")
    if project_id is not None and project_id != "":
        validation.request_id(project_id, "project id")
    else:
        project_id = None
    clean_name = validation.api_key_name(name)
    actor = audit.actor_name(acting_user)
    prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(PREFIX_LENGTH))
    plaintext = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    try:
        missing = _missing_scope(tenant_id, project_id)
    except (DatabaseError, pymongo.errors.PyMongoError) as exc:
        raise _unavailable(exc) from None
    if missing is not None:
        raise missing(f"cannot create an API key: {_scope_text(missing, tenant_id, project_id)}")
    try:
        key = ApiKey.objects.create(
            tenant_id=tenant_id, project_id=project_id, name=clean_name, prefix=prefix,
            secret_hash=hash_key(plaintext), created_by=actor,
        )
        _audit("apikey-create", key, actor)
    except (DatabaseError, pymongo.errors.PyMongoError) as exc:
        raise _unavailable(exc) from None
    log.info("api key %s (%s) created for %s by %s", prefix, clean_name, tenant_id, actor)
    return key, plaintext


def list_keys(*, tenant_id: str | None = None, include_revoked: bool = True) -> list[ApiKey]:
    """Keys of one tenant (or all, for ``manage.py``), newest first.

    Raises:
        InvalidLeaseRequest: malformed tenant id.
        LeaseUnavailable: the store is unreachable.
    """
    query = ApiKey.objects.all()
    if tenant_id is not None:
        query = query.filter(tenant_id=validation.entity_id(tenant_id, "tenant id"))
    if not include_revoked:
        query = query.filter(revoked_at__isnull=True)
    try:
        return list(query.order_by("tenant_id", "-created_at"))
    except (DatabaseError, pymongo.errors.PyMongoError) as exc:
        raise _unavailable(exc) from None


def revoke_key(*, tenant_id: str | None, prefix: str, acting_user: Any) -> ApiKey:
    """Revoke the key ``prefix`` of ``tenant_id`` (``None``: any tenant, for operators).

    Idempotent: revoking a revoked key keeps its first revocation time. From now on the
    key answers 401.

    Raises:
        InvalidLeaseRequest: malformed tenant id.
        InvalidApiKeyRequest: malformed prefix.
        InvalidLeaseRequest: missing or malformed ``acting_user``.
        ApiKeyNotFound: no such key in that tenant; nothing was changed.
        LeaseUnavailable: the store is unreachable.
    """
    validation.api_key_prefix(prefix)
    actor = audit.actor_name(acting_user)
    query = ApiKey.objects.filter(prefix=prefix)
    if tenant_id is not None:
        # Tenant binding lives in the filter: another tenant's prefix is simply not found.
        query = query.filter(tenant_id=validation.entity_id(tenant_id, "tenant id"))
    try:
        key = query.first()
        if key is None:
            raise ApiKeyNotFound(f"no api key {prefix}" + (f" in tenant {tenant_id}" if tenant_id else ""))
        if key.revoked_at is None:
            # Conditional update: two concurrent revokes keep the first time and actor.
            ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(
                revoked_at=timezone.now(), revoked_by=actor)
            key.refresh_from_db()
            _audit("apikey-revoke", key, actor)
            log.info("api key %s of %s revoked by %s", prefix, key.tenant_id, actor)
    except (DatabaseError, pymongo.errors.PyMongoError) as exc:
        raise _unavailable(exc) from None
    return key


def authenticate(bearer: Any) -> ApiKey:
    """The active key whose plaintext is ``bearer`` (the value after ``Bearer``).

    Raises:
        Unauthenticated: missing, malformed, unknown, wrong or revoked key (one message for
            all, so an answer tells nothing about which keys exist).
        ApiKeyScopeGone: a genuine key whose tenant or bound project was deleted.
        LeaseUnavailable: the store is unreachable (fail-closed).
    """
    if not isinstance(bearer, str) or not bearer:
        raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
    match = KEY_RE.fullmatch(bearer)
    if match is None:
        raise Unauthenticated("invalid API key")
    try:
        key = ApiKey.objects.filter(prefix=match.group(1)).first()
    except (DatabaseError, pymongo.errors.PyMongoError) as exc:
        raise _unavailable(exc) from None
    presented = hash_key(bearer)
    ok = hmac.compare_digest(presented, key.secret_hash if key is not None else _DUMMY_HASH)
    if key is None or not ok or key.revoked_at is not None:
        raise Unauthenticated("invalid API key")
    try:
        missing = _missing_scope(key.tenant_id, key.project_id)
    except (DatabaseError, pymongo.errors.PyMongoError) as exc:
        raise _unavailable(exc) from None
    if missing is not None:
        # Only the key's holder gets here (the secret matched), so naming the scope is safe.
        raise ApiKeyScopeGone(f"this API key can no longer be used: {_scope_text(missing, key.tenant_id, key.project_id)}")
    return key
