"""``hivemesh bench cli``: our figure beside its same-run baseline, as JSON."""

from __future__ import annotations

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
