#!/usr/bin/env bash
# Install hivemesh with its test extras, start the services the tests talk to,
# then run lint, type checks, the test suite and the simulator seed campaign.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
"$PY" -m pip install --quiet --disable-pip-version-check '.[test]'
bash scripts/services.sh

"$PY" -m ruff check src tests
"$PY" -m ruff format --check src tests
"$PY" -m mypy
# The deterministic simulator over 1,000 seeds (partitions, loss, crashes, forgeries).
"$PY" -m hivemesh sim --seeds 1..1000 --nodes 5
# The planner on the simulator: same accepted tree everywhere, one result per leaf.
"$PY" -m hivemesh sim --seeds 1..200 --nodes 5 --workload plan
# A trusted peer with far-future and backdated clocks: honest nodes keep writing,
# no clock passes the bound, no backdated claim takes a name held longer than it.
"$PY" -m hivemesh sim --seeds 1..200 --nodes 5 --workload clock
"$PY" -m pytest -q -p no:cacheprovider "$@"
