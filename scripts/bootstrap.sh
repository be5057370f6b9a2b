#!/usr/bin/env bash
# Install everything the project needs on a fresh machine: a venv with the project and its
# test/serve/embedded/docs extras, Redis running on 127.0.0.1:6379, Debian's Chromium and faketime.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[embedded,test,serve,docs]"

apt_install() {
  if command -v apt-get >/dev/null 2>&1; then
    if [ ! -f /tmp/.leases-apt-updated ]; then apt-get update -qq && touch /tmp/.leases-apt-updated; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  fi
}

# The tests also start private redis-server processes (to freeze one), so the binary is
# needed even where a Redis already answers; faketime runs a pod with a skewed clock.
command -v redis-server >/dev/null || apt_install redis-server
command -v faketime >/dev/null || apt_install faketime
if ! (command -v redis-cli >/dev/null && redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG); then
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
fi
# PostgreSQL on 127.0.0.1:5432 with trust auth and a database "test": the adoption test runs a
# new project whose default database is PostgreSQL (its own venv gets psycopg).
pg_answers() { command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; }
if ! pg_answers; then
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    apt_install postgresql
    for hba in /etc/postgresql/*/main/pg_hba.conf; do
      sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
    done
  fi
  pg_version="$(ls /etc/postgresql | head -1)"
  pg_ctlcluster --skip-systemctl-redirect "$pg_version" main start || true
  # An install that started the cluster itself has not read the trust line yet.
  pg_ctlcluster --skip-systemctl-redirect "$pg_version" main reload || true
  for _ in $(seq 50); do pg_answers && break; sleep 0.2; done
fi
if pg_answers && ! psql -h 127.0.0.1 -U postgres -tAc "select 1 from pg_database where datname = 'test'" | grep -q 1; then
  psql -h 127.0.0.1 -U postgres -c "create database test" >/dev/null
fi
if [ "${SKIP_BROWSER:-0}" != 1 ] && [ ! -x /usr/bin/chromium ]; then
  apt_install chromium
fi
