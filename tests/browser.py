"""Debian's Chromium through Playwright, shared by the browser tests (no browser downloads)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers import REPO

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(REPO) / "docs" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]

requires_chromium = pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM),
                                       reason="Debian chromium is not installed (apt-get install -y chromium)")


@contextmanager
def chromium() -> Iterator[object]:
    """A launched headless Chromium (``playwright.sync_api.Browser``)."""
    from playwright import sync_api

    # Playwright's sync API keeps an asyncio loop in this thread; the tests' ORM calls are
    # plain synchronous calls, so Django's async-context guard is lifted while it runs.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous
