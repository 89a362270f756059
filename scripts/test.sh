#!/usr/bin/env bash
# Install hivemesh with its test extras, start the services the tests talk to,
# then run lint, type checks, the test suite and the simulator seed campaign.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# the dashboard's browser tests use the system Chromium (scripts/services.d/chromium.sh)
# and keep their screenshots in $HIVEMESH_ARTIFACTS
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
export HIVEMESH_ARTIFACTS=${HIVEMESH_ARTIFACTS:-/tmp/hivemesh-artifacts}
"$PY" -m pip install --quiet --disable-pip-version-check '.[test]'
bash scripts/services.sh

"$PY" -m ruff check src tests
"$PY" -m ruff format --check src tests
"$PY" -m mypy
# The deterministic simulator, 10,000 seeds across the cores: each seed picks
# its workload (journal with partitions, loss, crashes, forgeries, restores from
# backup, damaged logs, lost fsyncs, torn writes, clock steps and paused
# processes; claims; the planner; a clock adversary; quorum leases voted by the
# nodes; SWIM membership; the journal on the daemon's Peer) and its node
# count (5 to 50) from the seed (hivemesh.sim.campaign.ci_scenario).
"$PY" -m hivemesh sim --campaign ci --seeds 1..10000
"$PY" -m pytest -q -p no:cacheprovider "$@"
