"""Errors of the HTTP API and its keys; all are :class:`leases.errors.LeaseError` subclasses."""

from __future__ import annotations

from leases.errors import InvalidLeaseRequest, LeaseError


class Unauthenticated(LeaseError):
    """No API key, a malformed or unknown one, or a revoked one (HTTP 401)."""

    code = "UNAUTHENTICATED"


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
