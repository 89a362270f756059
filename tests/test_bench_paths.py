"""``hivemesh bench paths`` runs end to end (a smoke workload) and reports
the three paths beside each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hivemesh

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)
pytest.importorskip("aioquic", reason="aioquic is not installed")
pytestmark = pytest.mark.netns  # in namespaces when root, else on loopback


def test_bench_paths_compares_quic_tcp_and_relayed() -> None:
    cmd = [sys.executable, "-m", "hivemesh", "bench", "paths", "--json"]
    cmd += ["--rounds", "100", "--frames", "300", "--max-s", "5"]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": SRC}
    )
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    names = [m["name"] for m in doc["metrics"]]
    assert names[0] == "relayed RTT p99" and "direct QUIC throughput" in names
    assert set(doc["details"]["p99_ms"]) == {"tcp", "quic", "relayed"}
    assert all(v > 0 for v in doc["details"]["frames_per_s"].values())
