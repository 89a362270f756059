#!/usr/bin/env bash
# Start (if not running) the local services that hivemesh's tests talk to.
# Each service has its own idempotent script in scripts/services.d/; loopback only.
set -euo pipefail
cd "$(dirname "$0")"
for s in services.d/*.sh; do
  [ -e "$s" ] || continue
  bash "$s"
done
