#!/usr/bin/env bash
# Idempotent: make sure a Redis server answers on 127.0.0.1:6379 (loopback only).
set -euo pipefail
PORT=${HIVEMESH_REDIS_PORT:-6379}
answering() { redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; }
answering && exit 0
if ! command -v redis-server >/dev/null; then
  apt-get install -y -q redis-server >/dev/null
fi
redis-server --bind 127.0.0.1 --port "$PORT" --daemonize yes --appendonly yes \
  --dir "${TMPDIR:-/tmp}" --appendfilename "hivemesh-redis-$PORT.aof" >/dev/null
for _ in $(seq 50); do answering && exit 0; sleep 0.1; done
echo "redis did not start on 127.0.0.1:$PORT" >&2
exit 1
