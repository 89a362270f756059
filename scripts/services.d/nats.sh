#!/usr/bin/env bash
# Idempotent: make sure nats-server with JetStream answers on 127.0.0.1:4222 (loopback only).
set -euo pipefail
PORT=${HIVEMESH_NATS_PORT:-4222}
answering() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT" && head -c 4 <&3 | grep -q INFO) 2>/dev/null; }
answering && exit 0
if ! command -v nats-server >/dev/null; then
  apt-get install -y -q nats-server >/dev/null
fi
DIR="${TMPDIR:-/tmp}/hivemesh-nats-$PORT"
mkdir -p "$DIR"
setsid nohup nats-server -a 127.0.0.1 -p "$PORT" -js -sd "$DIR" -l "$DIR/nats.log" >/dev/null 2>&1 &
for _ in $(seq 50); do answering && exit 0; sleep 0.1; done
echo "nats-server did not start on 127.0.0.1:$PORT" >&2
exit 1
