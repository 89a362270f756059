#!/usr/bin/env bash
# The network lab's tools (hivemesh.netlab, the `netns` tests): nftables and
# conntrack from Debian, installed if missing. Starts nothing. Without them
# (or without root) the netns tests skip with the reason.
set -euo pipefail
if [ "$(id -u)" != 0 ]; then
  echo "netlab: not root, the netns tests will skip"
  exit 0
fi
missing=()
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v conntrack >/dev/null 2>&1 || missing+=(conntrack)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if [ ${#missing[@]} -eq 0 ]; then
  echo "netlab: tools present"
  exit 0
fi
echo "netlab: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
  || { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; } \
  || echo "netlab: could not install ${missing[*]} (the netns tests will skip)"
python3 -m hivemesh.netlab cleanup 2>/dev/null || true
