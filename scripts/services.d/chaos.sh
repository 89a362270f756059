#!/usr/bin/env bash
# The chaos runner's clock offsets (hivemesh chaos, scenario "clock") use
# Debian's faketime (libfaketime). Installed if missing; starts nothing.
# The packet-delay fault also wants `pip install 'hivemesh[chaos]'`
# (netfilterqueue, built against libnetfilter-queue-dev).
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "chaos: not root, the chaos tests will skip"
  exit 0
fi
missing=()
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
if [ ${#missing[@]} -eq 0 ]; then
  echo "chaos: tools present"
  exit 0
fi
echo "chaos: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
  || { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; } \
  || echo "chaos: could not install ${missing[*]} (the clock scenario will fail to start nodes)"
