"""Demo data for the main job: a tiny local remote service and the two demo consumers.

:class:`DemoRemoteServer` plays both remote systems the contrib handlers clean up after (a
compile farm and a browser-session tool), over real HTTP on 127.0.0.1 — a
compile service (``POST /jobs`` with the submitter's ``fence``, ``GET /jobs/<id>``; given a
:class:`leases.fencing.FenceGuard` it refuses a stale fence with 409 ``STALE_FENCE``, as a
resource owner's service would) and an MCP-like session server
(``POST /mcp`` initialize/call, ``DELETE /mcp`` with ``Mcp-Session-Id``) that checks the
``Authorization`` header and records every session DELETE. It is demo scenery for the
reference consumers (and the tests' observation point for DELETEs), not a fake of the
lease store.

:func:`run_demo_consumers` loops the job tracker and the session client against it.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from leases import http_client
from leases.errors import InvalidFence, StaleFence

log = logging.getLogger(__name__)


class DemoRemoteServer:
    """Compile jobs and MCP-like sessions over HTTP; records session DELETEs."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, auth: str | None = "Bearer demo-token",
                 job_seconds: float = 0.3, guard: Any | None = None):
        self.auth = auth
        self.guard = guard  # a FenceGuard / RedisFenceGuard: submissions must carry a fresh fence
        self.job_fences: dict[str, str | None] = {}  # job id -> the fence it was submitted with
        self.job_seconds = job_seconds
        self.lock = threading.Lock()
        self.sessions: dict[str, dict[str, Any]] = {}
        self.deleted: list[dict[str, Any]] = []
        self.jobs: dict[str, float] = {}
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
                raw = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(raw)

            def _authorized(self) -> bool:
                return outer.auth is None or self.headers.get("Authorization") == outer.auth

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"null") if length else None

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self._body() or {}
                if self.path.startswith("/jobs"):
                    fence = body.get("fence") if isinstance(body, dict) else None
                    if outer.guard is not None:
                        # The compile service's side of fencing: one admit per submission.
                        try:
                            outer.guard.admit(fence)
                        except StaleFence as exc:
                            return self._reply(409, {"code": exc.code, "detail": str(exc)})
                        except InvalidFence as exc:
                            return self._reply(400, {"code": exc.code, "detail": str(exc)})
                    job_id = secrets.token_hex(6)
                    with outer.lock:
                        outer.jobs[job_id] = time.monotonic() + outer.job_seconds
                        outer.job_fences[job_id] = fence
                    return self._reply(201, {"jobId": job_id})
                if not self._authorized():
                    return self._reply(401, {"error": "unauthorized"})
                if body.get("method") == "initialize":
                    session_id = secrets.token_hex(8)
                    params = body.get("params")
                    params = params if isinstance(params, dict) else {}
                    with outer.lock:
                        outer.sessions[session_id] = {"open": True, "calls": 0, "fence": params.get("fence")}
                    return self._reply(200, {"ok": True}, {"Mcp-Session-Id": session_id})
                session_id = self.headers.get("Mcp-Session-Id", "")
                with outer.lock:
                    session = outer.sessions.get(session_id)
                    if session is None or not session["open"]:
                        return self._reply(404, {"error": "unknown session"})
                    session["calls"] += 1
                    outer.calls += 1
                return self._reply(200, {"result": body.get("method"), "session": session_id})

            def do_GET(self) -> None:  # noqa: N802
                job_id = self.path.rsplit("/", 1)[-1]
                with outer.lock:
                    ready_at = outer.jobs.get(job_id)
                if ready_at is None:
                    return self._reply(404, {"error": "unknown job"})
                if time.monotonic() < ready_at:
                    return self._reply(200, {"status": "running"})
                return self._reply(200, {"status": "done", "pdf": f"%PDF-demo {job_id}"})

            def do_DELETE(self) -> None:  # noqa: N802
                session_id = self.headers.get("Mcp-Session-Id", "")
                with outer.lock:
                    outer.deleted.append({"sessionId": session_id, "auth": self.headers.get("Authorization"),
                                          "authorized": self._authorized()})
                    session = outer.sessions.get(session_id)
                    if session is not None and self._authorized():
                        session["open"] = False
                if not self._authorized():
                    return self._reply(401, {"error": "unauthorized"})
                return self._reply(200 if session is not None else 404, {"deleted": session_id})

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="demo-remote", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    @property
    def mcp_endpoint(self) -> str:
        return self.url + "/mcp"

    def deletes_of(self, session_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [d for d in self.deleted if d["sessionId"] == session_id]

    def start(self) -> "DemoRemoteServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "DemoRemoteServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _http_json(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    """The JSON body of the demo job service's answer.

    Raises:
        StaleFence: the service refused the submission's fence (409 ``STALE_FENCE``).
        leases.http_client.HttpCallFailed: no usable answer, or another non-2xx one.
    """
    answer = http_client.call_json(method, url, body=(body or {}) if method == "POST" else None,
                                   timeout=http_client.REMOTE_TIMEOUT_SECONDS)
    if answer.status == 409 and isinstance(answer.body, dict) and answer.body.get("code") == StaleFence.code:
        raise StaleFence(str(answer.body.get("detail") or "stale fence"))
    if not answer.ok:
        raise http_client.HttpCallFailed(method, url, f"HTTP {answer.status}")
    return answer.body


def submit_job(remote_url: str, fence: str | None) -> str:
    """Submit a compile job to the demo service with the submitter's ``fence``; its job id.

    Raises:
        StaleFence: the service refused the fence (the lease's slot was granted again).
        leases.http_client.HttpCallFailed: the service gave no usable answer.
    """
    return str(_http_json("POST", remote_url.rstrip("/") + "/jobs", {"fence": fence})["jobId"])


def run_demo_consumers(*, remote_url: str, stop: threading.Event, tenant_id: str = "demo",
                       project_id: str = "docs", user_id: str = "alice", auth: str | None = "Bearer demo-token",
                       pause: float = 1.0, rounds: int | None = None) -> dict[str, int]:
    """Loop both reference consumers until ``stop`` is set (or ``rounds`` are done).

    Each round compiles one job through :func:`leases.contrib.jobs.run_job` and makes three
    calls through a lease-backed :class:`leases.contrib.sessions.SessionClient`.

    Returns:
        Counts per outcome (``jobs``, ``calls``, ``busy``, ``lost``, ``stale``, ``errors``).
    """
    import leases

    from .jobs import run_job
    from .sessions import SessionClient, register_tool

    register_tool("demo-browser", remote_url.rstrip("/") + "/mcp", auth=auth)
    client = SessionClient("demo-browser", tenant_id=tenant_id, project_id=project_id, user_id=user_id)
    stats = {"jobs": 0, "calls": 0, "busy": 0, "lost": 0, "stale": 0, "errors": 0}
    done = 0
    try:
        while not stop.is_set() and (rounds is None or done < rounds):
            done += 1
            try:
                result = run_job(
                    submit=lambda fence: submit_job(remote_url, fence),
                    poll=lambda job_id: (lambda r: r if r.get("status") == "done" else None)(
                        _http_json("GET", f"{remote_url.rstrip('/')}/jobs/{job_id}")),
                    tenant_id=tenant_id, project_id=project_id, user_id=user_id, poll_interval=0.1, timeout=30,
                )
                stats["jobs"] += 1 if result else 0
                for step in range(3):
                    client.call("tools/call", {"name": "screenshot", "step": step})
                    stats["calls"] += 1
            except leases.LeaseBusy:
                stats["busy"] += 1
            except leases.LeaseLost:
                stats["lost"] += 1
            except StaleFence:
                stats["stale"] += 1
            except Exception:  # demo loop: log and keep going
                stats["errors"] += 1
                log.exception("demo consumer round failed")
            stop.wait(pause)
    finally:
        client.close()
    return stats
