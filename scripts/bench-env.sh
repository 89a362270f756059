#!/usr/bin/env bash
# Create the optional venv holding py-libp2p for `hivemesh bench fanout`'s
# gossipsub baseline. py-libp2p is trio-only and brings ~120 MB of
# dependencies, so it lives apart from the project's own environment.
# Idempotent: does nothing if the venv already imports libp2p at the pinned version.
# Override the location with HIVEMESH_BENCH_VENV.
set -euo pipefail
VENV="${HIVEMESH_BENCH_VENV:-$HOME/.cache/hivemesh/bench-libp2p}"
LIBP2P_VERSION="0.8.1"
if [ -x "$VENV/bin/python" ] &&
  "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('libp2p') != '$LIBP2P_VERSION')" 2>/dev/null; then
  echo "bench venv ready: $VENV (libp2p $LIBP2P_VERSION)"
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "libp2p==$LIBP2P_VERSION"
"$VENV/bin/python" -c "import libp2p, trio; print('bench venv ready:', '$VENV')"
