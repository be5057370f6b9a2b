"""Test-only pause points inside the engine's crash windows.

A test sets ``LEASES_TEST_PAUSE`` to a point's name in a child process; the engine then
blocks forever between two commands there, so the test can ``kill -9`` the process exactly
inside that window and prove what the survivors repair.
"""

from __future__ import annotations

import os
import sys
import time

PAUSE_ENV = "LEASES_TEST_PAUSE"


def pause_point(name: str) -> None:
    """Block forever when ``LEASES_TEST_PAUSE`` names this point (announced on stderr)."""
    if os.environ.get(PAUSE_ENV) == name:
        sys.stderr.write(f"LEASES-PAUSED {name}\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)
