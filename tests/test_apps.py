"""The app configs: which revocation handlers each app registers in its ready()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = """
import json, sys
import django
from django.conf import settings
settings.configure(INSTALLED_APPS=json.loads(sys.argv[1]), MONGODB_URI="mongodb://127.0.0.1:1/",
                   LEASES_POD_AUTOSTART=False)
django.setup()
from leases.revocation import handlers
print(json.dumps(handlers.registered_types()))
"""


def _registered_types(apps: list[str]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(apps)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_given_only_the_engine_app_when_django_starts_then_no_handler_is_registered():
    assert _registered_types(["leases"]) == []


def test_given_the_contrib_apps_when_django_starts_then_each_registers_its_own_handler():
    assert _registered_types(["leases", "leases.contrib.jobs"]) == ["tex"]
    assert _registered_types(["leases", "leases.contrib.sessions"]) == ["browser"]
    assert sorted(_registered_types(["leases", "leases.contrib.jobs", "leases.contrib.sessions"])) == ["browser", "tex"]
