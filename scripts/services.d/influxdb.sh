#!/usr/bin/env bash
# InfluxDB 1.x (Debian package) for hivemesh telemetry: install if missing, run on loopback.
# Idempotent: does nothing if something already answers /ping on $HM_INFLUXDB_PORT.
# The telemetry tests start their own short-lived influxd on free ports; this shared
# instance is for local use of the InfluxDB sink.
set -euo pipefail
PORT=${HM_INFLUXDB_PORT:-8086}
RPC_PORT=${HM_INFLUXDB_RPC_PORT:-8088}
DIR=${HM_INFLUXDB_DIR:-/tmp/hivemesh-influxdb}

if curl -fsS -m 2 -o /dev/null "http://127.0.0.1:${PORT}/ping" 2>/dev/null; then
  echo "influxdb: already answering on 127.0.0.1:${PORT}"
  exit 0
fi
if ! command -v influxd >/dev/null 2>&1; then
  echo "influxdb: installing the Debian package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends influxdb >/dev/null 2>&1 \
    || { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends influxdb >/dev/null; } \
    || { echo "influxdb: could not install (tests that need it will skip)"; exit 0; }
fi
mkdir -p "${DIR}/meta" "${DIR}/data" "${DIR}/wal"
cat > "${DIR}/influxdb.conf" <<CONF
reporting-disabled = true
bind-address = "127.0.0.1:${RPC_PORT}"
[meta]
  dir = "${DIR}/meta"
[data]
  dir = "${DIR}/data"
  wal-dir = "${DIR}/wal"
[http]
  bind-address = "127.0.0.1:${PORT}"
  log-enabled = false
[monitor]
  store-enabled = false
CONF
setsid nohup influxd -config "${DIR}/influxdb.conf" >"${DIR}/influxdb.log" 2>&1 &
for _ in $(seq 1 150); do
  if curl -fsS -m 2 -o /dev/null "http://127.0.0.1:${PORT}/ping" 2>/dev/null; then
    echo "influxdb: ready on 127.0.0.1:${PORT}"
    exit 0
  fi
  sleep 0.2
done
# The telemetry tests start their own influxdb and do not need this shared one: warn, do not fail.
echo "influxdb: WARNING: did not become ready in 30s (see ${DIR}/influxdb.log)"
exit 0
