"""``hivemesh bench lease`` runs end to end (a smoke test; speed is not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_bench_lease_json_reports_every_backend_beside_its_baseline() -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run(
        [sys.executable, "-m", "hivemesh", "bench", "lease", "--json", "--rounds", "30"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=True,
    )
    d = json.loads(out.stdout)
    names = {m["name"] for m in d["metrics"]}
    mesh = "mesh via control socket (5 node procs, data on disk"
    assert {
        "redis acquire+release p50",
        "nats acquire+release p50",
        "etcd acquire+release p50",
        "quorum(5 procs) acquire+release p50",
        f"{mesh}) acquire+release p50",
        f"{mesh}, fresh resource per round) acquire+release p50",
        "mesh via Node API (in-process node + 4 node procs, data on disk) acquire+release p50",
    } <= names, d
    for m in d["metrics"]:
        assert m["ours"] > 0 and m["baseline"] > 0 and m["ratio"] is not None
    assert d["details"]["redis rounds"] == d["details"]["quorum(5 procs) rounds"] == 30
    assert "cpu ms/pair" in " ".join(d["details"])  # CPU time beside the latencies
