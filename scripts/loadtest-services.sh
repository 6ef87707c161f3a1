#!/usr/bin/env bash
# The auth service and the chat server, as a load test from one address needs them:
# the auth service's per-address login, register and refresh limits and the chat
# server's connections per address off (Locust's users all come from 127.0.0.1),
# everything else as configured (.env, environment: TOKEN_TTL_S=60 makes the users
# refresh during a short run). Runs until Ctrl-C, then stops both.
# Usage: scripts/loadtest-services.sh  (or make loadtest-services)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LOGIN_RATE_PER_CLIENT_PER_MIN=0 REGISTER_RATE_PER_CLIENT_PER_MIN=0 REFRESH_RATE_PER_CLIENT_PER_MIN=0 \
    $PY -m auth_service &
auth=$!
chat=""
trap 'kill $auth $chat 2>/dev/null || true; wait' EXIT INT TERM
# the chat server reads the public key the auth service writes at its first start
$PY -m auth_service wait >/dev/null
MAX_CONNECTIONS_PER_ADDRESS=0 $PY -m chat_server &
chat=$!
echo "loadtest-services: auth service on :8001 (login/register/refresh limits and connections per address off), chat server on :8000; Ctrl-C stops both" >&2
wait
