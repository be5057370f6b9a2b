#!/usr/bin/env bash
# Install everything, then run the whole test suite (embedded server, real Redis, real
# Celery workers, real processes, headless Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -q "$@"
