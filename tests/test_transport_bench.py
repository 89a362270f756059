"""The transport benchmark runs and reports ours, baseline and ratio (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SMALL = ["--frames", "3000", "--rounds", "1", "--fanout", "3"]
SRC = Path(__file__).resolve().parents[1] / "src"


def test_bench_transport_json_smoke() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-m", "hivemesh", "bench", "transport", "--json", *SMALL],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["bench"] == "transport"
    names = [m["name"] for m in result["metrics"]]
    assert names == [
        "secure channel, recv() per frame",
        "secure channel, recv_batch()",
        "fan-out to 3 channels",
    ]
    for m in result["metrics"]:
        assert m["ours"] > 0 and m["baseline"] > 0 and m["ratio"] > 0
        assert m["baseline_name"] == "raw asyncio TCP"
    assert result["details"]["frames_per_round"] == 3000
    assert result["details"]["fanout_events_per_round"] == 1000
