#!/usr/bin/env bash
# Idempotent: make sure an etcd (v3 API) answers on 127.0.0.1:2379 (loopback only).
# Installs the Debian `etcd-server` package if etcd is missing; data under $TMPDIR.
set -euo pipefail
PORT=${HIVEMESH_ETCD_PORT:-2379}
PEER_PORT=${HIVEMESH_ETCD_PEER_PORT:-2380}
answering() { curl -fsS -m 2 -o /dev/null "http://127.0.0.1:${PORT}/health" 2>/dev/null; }
answering && exit 0
if ! command -v etcd >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q etcd-server >/dev/null 2>&1 \
    || { apt-get update >/dev/null 2>&1 && apt-get install -y -q etcd-server >/dev/null; }
fi
DIR="${TMPDIR:-/tmp}/hivemesh-etcd-$PORT"
mkdir -p "$DIR"
setsid nohup etcd --name hivemesh --data-dir "$DIR/data" \
  --listen-client-urls "http://127.0.0.1:${PORT}" --advertise-client-urls "http://127.0.0.1:${PORT}" \
  --listen-peer-urls "http://127.0.0.1:${PEER_PORT}" \
  --initial-advertise-peer-urls "http://127.0.0.1:${PEER_PORT}" \
  --initial-cluster "hivemesh=http://127.0.0.1:${PEER_PORT}" \
  >"$DIR/etcd.log" 2>&1 &
for _ in $(seq 100); do answering && exit 0; sleep 0.1; done
echo "etcd did not start on 127.0.0.1:$PORT (see $DIR/etcd.log)" >&2
exit 1
