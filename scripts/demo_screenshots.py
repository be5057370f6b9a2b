"""Screenshots of acme's Waiting and History tabs from a running dev stack (``bash scripts/dev.sh``).

    .venv/bin/python scripts/demo_screenshots.py [--url http://127.0.0.1:8000]

Logs in as ``acme-admin`` (``seed_demo``'s password) in Debian's Chromium through Playwright
and writes ``docs/screenshots/demo-waiting.png`` and ``docs/screenshots/demo-history.png``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHOTS = REPO / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('DEV_WEB_PORT', '8000')}")
    parser.add_argument("--password", default="demo-pass-123")
    parser.add_argument("--resource", default="browser", help="the History tab's resource")
    parser.add_argument("--since", default="1h")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.goto(f"{args.url}/accounts/login/")
            page.fill("#id_username", "acme-admin")
            page.fill("#id_password", args.password)
            page.click("button[type=submit]")
            page.wait_for_load_state()
            page.goto(f"{args.url}/t/acme/insights/leases/waiting?refresh=off")
            page.screenshot(path=str(SHOTS / "demo-waiting.png"), full_page=True)
            page.goto(f"{args.url}/t/acme/insights/leases/history?resource={args.resource}&since={args.since}&refresh=off")
            page.screenshot(path=str(SHOTS / "demo-history.png"), full_page=True)
        finally:
            browser.close()
    print(f"wrote {SHOTS / 'demo-waiting.png'} and {SHOTS / 'demo-history.png'}")


if __name__ == "__main__":
    main()
