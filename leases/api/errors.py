"""Errors of the HTTP API and its keys; all are :class:`leases.errors.LeaseError` subclasses."""

from __future__ import annotations

from leases.errors import InvalidLeaseRequest, LeaseError


class Unauthenticated(LeaseError):
    """No API key, a malformed or unknown one, or a revoked one (HTTP 401)."""

    code = "UNAUTHENTICATED"


class ApiKeyScopeGone(Unauthenticated):
    """A genuine key whose tenant (or bound project) no longer exists (HTTP 401).

    Such a key must not book counters any more: nobody administers that scope, so its
    holders would consume the global cap where no tenant admin can see them.
    """

    code = "API_KEY_SCOPE_GONE"


class ProjectForbidden(LeaseError):
    """A project-bound key asked for another project (HTTP 403)."""

    code = "PROJECT_FORBIDDEN"


class InvalidBody(InvalidLeaseRequest):
    """The request body is not the documented JSON object (HTTP 400); nothing was written."""

    code = "INVALID_BODY"


class BodyTooLarge(InvalidBody):
    """The request body exceeds the documented size limit (HTTP 400); nothing was read."""

    code = "BODY_TOO_LARGE"


class ApiKeyNotFound(LeaseError):
    """No key with that prefix in that tenant (management pages and ``manage.py apikey``)."""

    code = "API_KEY_NOT_FOUND"


class InvalidApiKeyRequest(InvalidLeaseRequest):
    """Bad input to key management (name, tenant or project id); nothing was written."""

    code = "INVALID_API_KEY_REQUEST"


class UnknownTenant(InvalidApiKeyRequest):
    """Key management named a tenant that does not exist; nothing was written."""

    code = "UNKNOWN_TENANT"


class UnknownProject(InvalidApiKeyRequest):
    """Key management named a project the tenant does not have; nothing was written."""

    code = "UNKNOWN_PROJECT"
