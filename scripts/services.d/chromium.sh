#!/usr/bin/env bash
# Chromium (Debian package) for the dashboard's browser tests: install if missing.
# Playwright drives this system browser; it must never download one of its own.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
echo "chromium: installing the Debian package"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
  || { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends chromium >/dev/null; } \
  || echo "chromium: WARNING: could not install (the dashboard's browser tests will fail)"
exit 0
