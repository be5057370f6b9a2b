"""Reference consumers of the lease contract (§7), each with its revocation handler.

* :mod:`leases.contrib.jobs` — a poll-loop job tracker (like tex2pdf), type ``tex``,
  pod-bound: the poll state lives in this pod.
* :mod:`leases.contrib.sessions` — a remote HTTP session (like the MCP browser session),
  type ``browser``, not pod-bound: the session lives in the remote server.
* :mod:`leases.contrib.demo` — a tiny local remote service and the demo consumer loop.

``register_handlers()`` registers both handlers (``LeasesConfig.ready`` calls it).
"""

from __future__ import annotations


def register_handlers() -> None:
    """Register the handlers of the reference consumers (idempotent)."""
    from leases.handlers import register_handler

    from .jobs import JobHandler
    from .sessions import SessionHandler

    register_handler(JobHandler())
    register_handler(SessionHandler())
