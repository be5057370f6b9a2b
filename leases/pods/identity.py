"""This process's pod identity: ``POD_ID`` (``<POD_ID>-<pid>`` in a pool child) or ``<host>-<pid>``."""

from __future__ import annotations

import os
import re
import socket

# The pid of this process once it is marked a pool child (see mark_pool_child).
_pool_child_pid: int | None = None


def mark_pool_child() -> None:
    """Mark this process as a forked pool child, a pod of its own beside its siblings.

    A configured ``POD_ID`` names the whole worker; its children then are
    ``<POD_ID>-<pid>``, so siblings never share (and stop) one pod lease.
    """
    global _pool_child_pid
    _pool_child_pid = os.getpid()


def self_pod_id() -> str:
    """The pod id of this process; computed per call because a fork changes the pid."""
    from django.conf import settings

    configured = getattr(settings, "POD_ID", None) or os.environ.get("POD_ID")
    if configured:
        return f"{configured}-{os.getpid()}" if _pool_child_pid == os.getpid() else configured
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:80] or "host"
    return f"{host}-{os.getpid()}"
