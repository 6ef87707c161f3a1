#!/usr/bin/env bash
# Set up chatlab on a fresh Debian machine: Debian packages, then .venv with the project.
# Idempotent: a second run only checks. Usage: scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the project needs: sqlite3 (inspect the history), redis-server and
# redis-tools (scale-out; redis-cli makes the tests' and the lab's Redis Cluster), graphviz (call graphs in the lab report), chromium (the tests that open
# the lab's report.html and the web chat page in a real headless browser),
# chromium-driver (selenium drives that chromium), prometheus (promtool checks
# deploy/prometheus/, and a test runs prometheus against the services), postgresql
# (the auth service's AUTH_DB_URL: the tests make and start clusters of their own with
# its initdb and pg_ctl), haproxy (the front door, deploy/haproxy: a test runs it in
# front of both services, and the lab's tls matrix measures TLS terminated at it).
DEB_PACKAGES="python3-venv sqlite3 redis-server redis-tools graphviz chromium chromium-driver prometheus postgresql haproxy"
if command -v apt-get >/dev/null 2>&1; then
  missing=""
  for pkg in $DEB_PACKAGES; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
  done
  if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "setup: installing Debian packages:$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
  fi
else
  echo "setup: no apt-get here; install sqlite3, redis-server, redis-tools, graphviz, chromium, chromium-driver, prometheus, postgresql and haproxy yourself" >&2
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.chatlab-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing chatlab and its dev tools into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  touch "$stamp"
fi
echo "setup: ready ($(.venv/bin/python -c 'import chat_server.codecs as c; print("protobuf backend", c.protobuf_backend())'))"
