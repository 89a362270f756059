#!/usr/bin/env bash
# Prometheus (Debian package) for hivemesh telemetry: install if missing, run on loopback.
# Idempotent: does nothing if something already answers on $HM_PROMETHEUS_PORT.
# The telemetry tests start their own short-lived Prometheus (they need a scrape target
# on a free port); this shared instance scrapes targets listed in
# $HM_PROMETHEUS_DIR/targets/*.json (file_sd), e.g. a collector's /metrics endpoint.
set -euo pipefail
PORT=${HM_PROMETHEUS_PORT:-9090}
DIR=${HM_PROMETHEUS_DIR:-/tmp/hivemesh-prometheus}

if curl -fsS -m 2 "http://127.0.0.1:${PORT}/-/ready" >/dev/null 2>&1; then
  echo "prometheus: already answering on 127.0.0.1:${PORT}"
  exit 0
fi
if ! command -v prometheus >/dev/null 2>&1; then
  echo "prometheus: installing the Debian package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends prometheus >/dev/null 2>&1 \
    || { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends prometheus >/dev/null; } \
    || { echo "prometheus: could not install (tests that need it will skip)"; exit 0; }
fi
# The package's service may have been started by its postinst on a system with systemd;
# here we run our own instance on loopback only.
mkdir -p "${DIR}/data" "${DIR}/targets"
cat > "${DIR}/prometheus.yml" <<YML
global:
  scrape_interval: 5s
scrape_configs:
  - job_name: hivemesh
    file_sd_configs:
      - files: ['${DIR}/targets/*.json']
        refresh_interval: 5s
YML
setsid nohup prometheus --config.file="${DIR}/prometheus.yml" --storage.tsdb.path="${DIR}/data" \
  --web.listen-address="127.0.0.1:${PORT}" >"${DIR}/prometheus.log" 2>&1 &
for _ in $(seq 1 150); do
  if curl -fsS -m 2 "http://127.0.0.1:${PORT}/-/ready" >/dev/null 2>&1; then
    echo "prometheus: ready on 127.0.0.1:${PORT}"
    exit 0
  fi
  sleep 0.2
done
# The telemetry tests start their own prometheus and do not need this shared one: warn, do not fail.
echo "prometheus: WARNING: did not become ready in 30s (see ${DIR}/prometheus.log)"
exit 0
