"""``hivemesh bench mcp``: a tool call beside the same command on the socket, as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import hivemesh

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)


def test_bench_mcp_reports_tool_calls_beside_the_control_socket() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hivemesh", "bench", "mcp", "--calls", "10", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    read, write = doc["metrics"]
    for m in (read, write):
        assert m["baseline_name"] == "control socket" and m["unit"] == "ms"
        assert m["ours"] > 0 and m["baseline"] > 0 and m["ratio"] > 0
        assert m["goal"] == "<= 5 ms" and isinstance(m["goal_met"], bool)
    assert doc["details"]["calls"] == 10
    assert doc["details"]["mcp_start_and_handshake_ms"] > 0
