"""Errors of the pod registry and dispatch, the contrib handlers, the ``lease`` command, the
settings read at import and the embedded test server.
"""

from __future__ import annotations

from .conditions import InvalidLeaseRequest, LeaseError, LeaseLost

# --- Pod registry and revocation dispatch ----------------------------------------------


class PodLeaseError(LeaseError):
    """A pod-lease request that was refused because its input was bad; nothing was written."""

    code = "POD_LEASE_INVALID"


class LeaseStillHeld(LeaseError):
    """A revocation was posted for a token that is still a live holder."""

    code = "LEASE_STILL_HELD"


# --- Contrib handlers ------------------------------------------------------------------


class SessionError(LeaseError):
    """The remote session failed (connect, handshake or call)."""

    code = "SESSION_ERROR"


class SessionRevoked(LeaseLost):
    """The session's lease was lost; the session is closed, the next call opens a new one."""

    code = "SESSION_REVOKED"


class UnknownTool(InvalidLeaseRequest):
    """No tool configuration under that name."""

    code = "UNKNOWN_TOOL"


class JobAborted(LeaseError):
    """The job's lease was revoked while its poll loop ran (the handler aborted it)."""

    code = "JOB_ABORTED"


class JobTimeout(LeaseError):
    """The job produced no result within the caller's bound."""

    code = "JOB_TIMEOUT"


# --- The ``lease`` command -------------------------------------------------------------


class PodCallError(LeaseError):
    """No pod could carry out the request (none alive, none reachable, or refused)."""

    code = "POD_UNREACHABLE"


class PodNotFound(LeaseError, LookupError):
    """The pod is neither registered nor named by any holder."""

    code = "POD_NOT_FOUND"


class TenantNotFound(LeaseError, LookupError):
    """No Insights tenant, config document or holder has that tenant id."""

    code = "TENANT_NOT_FOUND"


class ResourceNotFound(LeaseError, LookupError):
    """No history, counter or holder names that resource."""

    code = "RESOURCE_NOT_FOUND"


class ProjectNotFound(LeaseError, LookupError):
    """The tenant has no such project (in Insights, its config documents or its holders)."""

    code = "PROJECT_NOT_FOUND"


# --- Settings read at import ---------------------------------------------------------


class InvalidSetting(LeaseError, ValueError):
    """A ``LEASES_*`` setting read once at import (the metric namespace) has a value that
    cannot be used; the module that reads it refuses to load."""

    code = "INVALID_SETTING"


# --- Embedded test server --------------------------------------------------------------


class EmbeddedServerError(LeaseError, RuntimeError):
    """The embedded SecantusDB server could not be started."""

    code = "EMBEDDED_SERVER_ERROR"
