#!/usr/bin/env bash
# Main job: install, then run web pods + Celery worker + beat + demo consumers on the
# embedded MongoDB-compatible server with demo tenants and data.
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_BROWSER=1 bash scripts/bootstrap.sh
exec .venv/bin/python -m config.devstack
