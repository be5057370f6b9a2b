#!/usr/bin/env bash
# Main job: install, then run web pods + Celery worker + beat + demo consumers on the
# embedded MongoDB-compatible server with demo tenants and data. While it runs, var/devstack.json
# says where its server is, so `.venv/bin/python manage.py …` in another terminal finds it.
# DEV_WEB_PORT (default 8000) moves the two web pods (that port and the next). Every process
# writes its Prometheus metrics to var/prometheus-multiproc (emptied at each start), so either
# web pod's /metrics shows the whole stack's, the worker's sweeps and @leased tasks included.
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_BROWSER=1 bash scripts/bootstrap.sh
exec .venv/bin/python -m config.devstack
