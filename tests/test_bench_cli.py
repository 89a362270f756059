"""``hivemesh bench cli``: our figure beside its same-run baseline, as JSON."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import hivemesh

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)


def test_bench_cli_reports_status_beside_a_bare_interpreter() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hivemesh", "bench", "cli", "--runs", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    wall, cpu = doc["metrics"]
    assert wall["baseline_name"] == "python -c pass" and wall["unit"] == "ms"
    assert wall["ours"] > 0 and wall["baseline"] > 0 and wall["ratio"] > 0
    assert wall["goal"] == "<= 100 ms" and isinstance(wall["goal_met"], bool)
    assert cpu["ours"] > 0 and cpu["baseline"] > 0
    assert doc["details"]["runs"] == 2 and doc["details"]["hivemesh_import_ms"] > 0


def test_status_loads_no_daemon_planner_or_simulator_code(tmp_path: Path) -> None:
    """The quick-CLI budget: `hivemesh status` imports the client and the one
    command it runs, nothing of the daemon, core, planner, LLMs or simulator."""
    code = (
        "import sys\n"
        "from hivemesh.faces.cli import main\n"
        f"rc = main(['status', '--data-dir', {str(tmp_path)!r}])\n"
        "print(sorted(sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert out.returncode == 0, out.stderr
    loaded = set(ast.literal_eval(out.stdout.strip().splitlines()[-1]))
    heavy = ("asyncio", "hivemesh.core", "hivemesh.roles", "hivemesh.llm", "hivemesh.sim",
             "hivemesh.runtime.daemon", "hivemesh.leases", "hivemesh.telemetry")  # fmt: skip
    assert not {m for m in loaded if m.startswith(heavy)}, sorted(loaded)
    assert {"hivemesh.commands.node", "hivemesh.client.blocking"} <= loaded
    # one command's module, not the whole table
    assert not {"hivemesh.commands.table", "hivemesh.commands.trust"} & loaded
