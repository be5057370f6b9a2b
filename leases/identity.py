"""This process's pod identity: ``POD_ID`` or ``<host>-<pid>``."""

from __future__ import annotations

import os
import re
import socket


def self_pod_id() -> str:
    """The pod id of this process; computed per call because a fork changes the pid."""
    from django.conf import settings

    configured = getattr(settings, "POD_ID", None) or os.environ.get("POD_ID")
    if configured:
        return configured
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:80] or "host"
    return f"{host}-{os.getpid()}"
