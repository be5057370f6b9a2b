"""Test-only pause points inside the engine's crash windows, inert unless the settings arm them.

A test sets ``LEASES_TEST_PAUSE`` to a point's name in a child process; the engine then
blocks forever between two commands there, so the test can ``kill -9`` the process exactly
inside that window and prove what the survivors repair.

The module ships in the wheel because the engine's call sites do, but an environment variable
alone must never be able to stop a production process: a point blocks only where the Django
settings say ``LEASES_TEST_PAUSE_POINTS = True`` (``config.settings_test`` does; it is not
in the wheel). Elsewhere every call site is a dictionary lookup that returns.
"""

from __future__ import annotations

import os
import sys
import time

PAUSE_ENV = "LEASES_TEST_PAUSE"


def armed() -> bool:
    """Whether the settings switch pause points on (``LEASES_TEST_PAUSE_POINTS``, default off)."""
    from leases.conf import lease_settings

    return lease_settings.TEST_PAUSE_POINTS is True


def pause_point(name: str) -> None:
    """Block forever when ``LEASES_TEST_PAUSE`` names this point and the settings arm pause points.

    The environment is looked at first: on the hot path of a process without the variable
    this costs one lookup and never touches the settings.
    """
    if os.environ.get(PAUSE_ENV) != name or not armed():
        return
    sys.stderr.write(f"LEASES-PAUSED {name}\n")
    sys.stderr.flush()
    while True:
        time.sleep(3600)
