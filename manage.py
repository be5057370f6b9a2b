#!/usr/bin/env python
"""Django's command-line utility for administrative tasks.

Without ``MONGODB_URI``, the settings use the server of the dev stack running from this
checkout (``bash scripts/dev.sh`` records it in ``var/devstack.json``).
"""

import os
import sys


def main() -> int:
    """Run the management command named in ``sys.argv``; returns the exit code."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        # Django would swallow a settings error here and go on to report every project
        # command as "Unknown command"; say what is wrong instead.
        settings.INSTALLED_APPS  # noqa: B018 - loads the settings module
    except ImproperlyConfigured as exc:
        print(f"manage.py: {exc}", file=sys.stderr)
        return 2
    execute_from_command_line(sys.argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
