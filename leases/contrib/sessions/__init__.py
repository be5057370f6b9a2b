"""Remote HTTP session (the MCP browser-session pattern): type ``browser``, not pod-bound.

The lease follows the session's life, not the pool's: acquire on open, the lease's fence
sent with the handshake (``params.fence``, so the tool can record it with the session and
fence its own use) and kept with the session (:attr:`RemoteSession.fence`), payload
``{tool, endpoint, sessionId, fence}`` after the handshake, ``check()`` on every call, release on
close. ``LeaseLost`` during a call closes the session and raises :class:`SessionRevoked`;
the next call opens a new session and acquires anew. A failure after acquire (connect,
handshake, payload update) returns the lease at once.

Wire protocol of the remote server (a minimal MCP-like HTTP transport):

* ``POST {endpoint}`` ``{"method": "initialize"}`` → answer header ``Mcp-Session-Id``;
* ``POST {endpoint}`` with ``Mcp-Session-Id`` and ``{"method": ..., "params": ...}`` → JSON;
* ``DELETE {endpoint}`` with ``Mcp-Session-Id`` → session terminated.

Every request, the DELETE included, carries the tool's configured ``Authorization``.

Handler (``browser``): for a holder of this pod it closes the pooled session only if that
session still holds the revoked token (a late revocation of an already re-opened session
closes nothing); for a holder of a dead pod it sends the session DELETE to the stored
endpoint with the tool's configured auth — skipped when the tool now points elsewhere.

Tool configuration is a small registry (:func:`register_tool`), seeded from the setting
``LEASES_SESSION_TOOLS`` (``{"name": {"endpoint": "...", "auth": "Bearer ..."}}``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import leases
from leases import http_client
from leases.errors import InvalidLeaseRequest, LeaseLost, SessionError, SessionRevoked, UnknownTool
from leases.ids import validation
from leases.pods.identity import self_pod_id
from leases.revocation.handlers import LeaseHandler, RevokedHolder

log = logging.getLogger(__name__)

SESSION_TYPE = "browser"
SESSION_HEADER = "Mcp-Session-Id"


@dataclass(frozen=True)
class ToolConfig:
    """Where a tool's sessions live and how to authenticate to it."""

    name: str
    endpoint: str
    auth: str | None = None  # the full Authorization header value
    lease: str = "browser"


_tools_lock = threading.Lock()
_tools: dict[str, ToolConfig] = {}


def register_tool(name: str, endpoint: str, *, auth: str | None = None, lease: str = "browser") -> ToolConfig:
    """Configure (or re-point) tool ``name``.

    Raises:
        InvalidLeaseRequest: a bad name, endpoint or lease name.
    """
    validation.lease_name(name)
    validation.lease_name(lease)
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise InvalidLeaseRequest(f"tool endpoint must be an http(s) URL, got {endpoint!r}")
    tool = ToolConfig(name, endpoint, auth, lease)
    with _tools_lock:
        _tools[name] = tool
    return tool


def unregister_tool(name: str) -> None:
    with _tools_lock:
        _tools.pop(name, None)


def get_tool(name: str) -> ToolConfig | None:
    """The current configuration of tool ``name`` (registry first, then the setting)."""
    with _tools_lock:
        tool = _tools.get(name)
    if tool is not None:
        return tool
    from leases.conf import lease_settings

    configured = lease_settings.SESSION_TOOLS or {}
    entry = configured.get(name) if isinstance(configured, dict) else None
    if isinstance(entry, dict) and isinstance(entry.get("endpoint"), str):
        return ToolConfig(name, entry["endpoint"], entry.get("auth"), entry.get("lease", "browser"))
    return None


# --- transport ---------------------------------------------------------------------------


def _request(method: str, endpoint: str, *, auth: str | None, session_id: str | None = None,
             body: dict[str, Any] | None = None) -> tuple[int, dict[str, str], Any]:
    headers: dict[str, str] = {}
    if auth:
        headers["Authorization"] = auth
    if session_id:
        headers[SESSION_HEADER] = session_id
    try:
        answer = http_client.call_json(method, endpoint, body=body, headers=headers, timeout=http_client.REMOTE_TIMEOUT_SECONDS)
    except http_client.HttpCallFailed as exc:
        raise SessionError(str(exc)) from None
    if not answer.ok:
        raise SessionError(f"{method} {endpoint} answered {answer.status}")
    return answer.status, answer.headers, answer.body


def delete_session(endpoint: str, session_id: str, auth: str | None) -> bool:
    """Send the session-termination DELETE; True if the server answered 2xx."""
    try:
        status, _, _ = _request("DELETE", endpoint, auth=auth, session_id=session_id)
    except SessionError as exc:
        log.info("session DELETE %s failed: %s", session_id, exc)
        return False
    return 200 <= status < 300


class RemoteSession:
    """One open remote session under one lease."""

    def __init__(self, tool: ToolConfig, lease: Any, session_id: str):
        self.tool = tool
        self.lease = lease
        self.session_id = session_id
        self.closed = False
        #: The fence of the lease this session was opened under (recorded with the session).
        self.fence: str | None = getattr(lease, "fence", None)

    @property
    def token(self) -> str | None:
        return self.lease.token

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One call; ``check()`` first (check-at-use, also the touch).

        Raises:
            LeaseLost: the lease is gone (the caller closes the session).
            SessionError: the remote call failed.
        """
        self.lease.check()
        _, _, answer = _request("POST", self.tool.endpoint, auth=self.tool.auth, session_id=self.session_id,
                                body={"method": method, "params": params or {}})
        return answer

    def close(self) -> None:
        """DELETE the remote session and release the lease (a release runs no handler)."""
        if self.closed:
            return
        self.closed = True
        try:
            delete_session(self.tool.endpoint, self.session_id, self.tool.auth)
        finally:
            self.lease.release()


def open_session(tool: ToolConfig, *, tenant_id: str, project_id: str, user_id: str,
                 holder_ref: str = "") -> RemoteSession:
    """Acquire a ``browser`` lease and open a remote session under it.

    Raises:
        InvalidLeaseRequest: bad ids.
        LeaseBusy: no slot (e.g. the user already has a session).
        LeaseUnavailable: the store is unreachable.
        SessionError: connect/handshake failed (the lease was returned).
    """
    lease = leases.acquire(leases.LeaseRequest(
        type=SESSION_TYPE, lease=tool.lease, tenant_id=tenant_id, project_id=project_id, user_id=user_id,
        holder_ref=holder_ref or tool.name, pod_bound=False,
    ))
    try:
        fence = getattr(lease, "fence", None)
        _, headers, _ = _request("POST", tool.endpoint, auth=tool.auth,
                                 body={"method": "initialize", "params": {"fence": fence}})
        session_id = next((v for k, v in headers.items() if k.lower() == SESSION_HEADER.lower()), None)
        if not session_id:
            raise SessionError(f"{tool.endpoint} returned no {SESSION_HEADER}")
        session = RemoteSession(tool, lease, session_id)
        try:
            lease.update_payload({"tool": tool.name, "endpoint": tool.endpoint, "sessionId": session_id,
                                  "fence": fence})
        except BaseException:
            delete_session(tool.endpoint, session_id, tool.auth)
            raise
        return session
    except BaseException:
        lease.release()
        raise


class SessionPool:
    """This process's open sessions, one per (tool, tenant, project, user)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str, str, str], RemoteSession] = {}

    def get(self, key: tuple[str, str, str, str]) -> RemoteSession | None:
        with self._lock:
            return self._sessions.get(key)

    def put(self, key: tuple[str, str, str, str], session: RemoteSession) -> None:
        with self._lock:
            self._sessions[key] = session

    def discard(self, key: tuple[str, str, str, str], session: RemoteSession) -> None:
        with self._lock:
            if self._sessions.get(key) is session:
                del self._sessions[key]

    def close_if_token(self, token: str) -> bool:
        """Close the pooled session that still holds ``token``; False if none does."""
        with self._lock:
            found = next(((k, s) for k, s in self._sessions.items() if s.token == token), None)
            if found is not None:
                del self._sessions[found[0]]
        if found is None:
            return False
        found[1].close()
        return True

    def close_all(self) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.close()


pool = SessionPool()


class SessionClient:
    """Calls a tool through a pooled, lease-backed session (re-opened after ``LeaseLost``)."""

    def __init__(self, tool_name: str, *, tenant_id: str, project_id: str, user_id: str,
                 session_pool: SessionPool | None = None):
        self.tool_name = tool_name
        self.key = (tool_name, tenant_id, project_id, user_id)
        self.pool = session_pool or pool

    def _session(self) -> RemoteSession:
        session = self.pool.get(self.key)
        if session is not None and not session.closed:
            return session
        tool = get_tool(self.tool_name)
        if tool is None:
            raise UnknownTool(f"no tool configuration named {self.tool_name!r}")
        _, tenant_id, project_id, user_id = self.key
        session = open_session(tool, tenant_id=tenant_id, project_id=project_id, user_id=user_id)
        self.pool.put(self.key, session)
        return session

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Call ``method`` in the current session, opening one when needed.

        Raises:
            SessionRevoked: the lease was lost; the session is closed, call again to reopen.
            LeaseBusy / LeaseUnavailable / SessionError / UnknownTool: see :func:`open_session`.
        """
        session = self._session()
        try:
            return session.call(method, params)
        except LeaseLost as exc:
            self.pool.discard(self.key, session)
            session.close()
            raise SessionRevoked(f"session {session.session_id} closed: {exc}") from None

    def close(self) -> None:
        session = self.pool.get(self.key)
        if session is not None:
            self.pool.discard(self.key, session)
            session.close()


class SessionHandler(LeaseHandler):
    """``browser`` handler: close the pooled session or DELETE the dead pod's session."""

    type = SESSION_TYPE

    def __init__(self, session_pool: SessionPool | None = None):
        self.pool = session_pool or pool

    def on_revoked(self, holder: RevokedHolder) -> None:
        if holder.pod and holder.pod == self_pod_id():
            # Our own session: close it only if it still holds *this* lease.
            self.pool.close_if_token(holder.token)
            return
        payload = holder.payload or {}
        tool_name, endpoint, session_id = payload.get("tool"), payload.get("endpoint"), payload.get("sessionId")
        if not (isinstance(tool_name, str) and isinstance(endpoint, str) and isinstance(session_id, str)):
            log.info("revoked session %s has no payload (opened before the handshake); nothing to delete", holder.token)
            return
        tool = get_tool(tool_name)
        if tool is None or tool.endpoint != endpoint:
            log.info("tool %s now points elsewhere; leaving session %s at %s to expire", tool_name, session_id, endpoint)
            return
        delete_session(endpoint, session_id, tool.auth)
