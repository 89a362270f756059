#!/usr/bin/env bash
# The chaos runner's clock offsets (hivemesh chaos, scenario "clock") use
# Debian's faketime (libfaketime). Installed if missing; starts nothing.
# The packet-delay fault wants netfilterqueue (the `chaos` extra), built from
# source against libnetfilter-queue-dev, and its NFQUEUE rule is iptables':
# all are installed here when missing.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "chaos: not root, the chaos tests will skip"
  exit 0
fi
PY=${PYTHON:-python3}
missing=()
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
[ -e /usr/include/libnetfilter_queue/libnetfilter_queue.h ] || missing+=(libnetfilter-queue-dev build-essential)
if [ ${#missing[@]} -gt 0 ]; then
  echo "chaos: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; } \
    || echo "chaos: could not install ${missing[*]} (the clock and delay scenarios will not run)"
fi
if ! "$PY" -c "import netfilterqueue" 2>/dev/null; then
  "$PY" -m pip install --quiet --disable-pip-version-check 'netfilterqueue>=1.1' \
    || echo "chaos: could not build netfilterqueue (the delay check will skip)"
fi
echo "chaos: tools present"
