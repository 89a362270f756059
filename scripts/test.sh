#!/usr/bin/env bash
# Install hivemesh with its test extras, start the services the tests talk to,
# then run lint, type checks, the simulator seed campaign and the test suites.
# With arguments, runs only pytest with them (after install, services, lint).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# the dashboard's browser tests use the system Chromium (scripts/services.d/chromium.sh)
# and keep their screenshots in $HIVEMESH_ARTIFACTS
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
export HIVEMESH_ARTIFACTS=${HIVEMESH_ARTIFACTS:-/tmp/hivemesh-artifacts}
"$PY" -m pip install --quiet --disable-pip-version-check '.[test]'
bash scripts/services.sh

suite() {  # suite NAME CMD...: run one suite, print its wall time
  local name=$1 t0=$SECONDS
  shift
  echo "== $name"
  "$@"
  echo "== $name: passed in $((SECONDS - t0)) s"
}

suite lint "$PY" -m ruff check src tests
suite format "$PY" -m ruff format --check src tests
suite types "$PY" -m mypy
if [ $# -gt 0 ]; then
  suite pytest "$PY" -m pytest -q -p no:cacheprovider "$@"
  exit 0
fi
# The deterministic simulator, 10,000 seeds across the cores: each seed picks
# its workload (journal with partitions, loss, crashes, forgeries, restores from
# backup, damaged logs, lost fsyncs, torn writes, clock steps and paused
# processes; claims; the planner; a clock adversary; quorum leases voted by the
# nodes; SWIM membership; the journal on the daemon's Peer) and its node
# count (5 to 50) from the seed (hivemesh.sim.campaign.ci_scenario).
suite simulator "$PY" -m hivemesh sim --campaign ci --seeds 1..10000
# Every test but the suites below: unit, property, fuzz budget, real daemons,
# the faces (MCP, A2A, LangGraph, the dashboard in the system Chromium).
suite tests "$PY" -m pytest -q -p no:cacheprovider -m "not netns and not chaos and not broker"
# Linux network namespaces (root): NATs, punching, relays, and the chaos set.
suite namespaces "$PY" -m pytest -q -p no:cacheprovider -m "netns or chaos"
# Broker mode against real NATS JetStream and Redis servers.
suite broker "$PY" -m pytest -q -p no:cacheprovider -m "broker and not netns and not chaos"
