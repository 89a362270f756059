"""``hivemesh bench fanout``: a small real run (3 node processes) and its pieces.

The smoke run is the CLI end to end: real node processes on loopback, a
real nats-server when one answers (the bench starts a private one if it is
installed but not running). It checks zero loss and the JSON shape; speed is
the benchmark's business, not the test's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hivemesh.bench import _fanout_wire as wire
from hivemesh.bench import fanout

SRC = Path(__file__).resolve().parent.parent / "src"


def test_receipts_count_distinct_from_others_and_sample_latency() -> None:
    r = wire.Receipts(me=0)
    r.record(wire.body(1, "lat", 0, 1_000_000), now_ns=3_000_000)
    r.record(wire.body(1, "lat", 0, 1_000_000), now_ns=3_500_000)  # duplicate
    r.record(wire.body(2, "lat", 0, 2_000_000), now_ns=4_000_000)
    r.record(wire.body(0, "lat", 1, 2_000_000), now_ns=4_000_000)  # our own: not a delivery
    r.record({"p": "x"})
    r.record(["not", "a", "dict"])
    r.record({"p": 1, "ph": 5, "i": 1, "t": 0})
    r.record(wire.body(1, "lat", wire.MAX_MESSAGES, 0))  # would need a huge bitmap
    rep = r.report("lat")
    assert rep["count"] == 2 and rep["duplicates"] == 1 and rep["malformed"] == 4
    assert sorted(rep["latency_us"]) == [2000, 2000]
    assert rep["first_ns"] == 3_000_000 and rep["last_ns"] == 4_000_000
    assert r.report("tp")["count"] == 0
    assert wire.decode(wire.encode(wire.body(3, "tp", 7, 5)))["i"] == 7


def test_pacing_and_shares() -> None:
    assert wire.paced_due(0.0, 1000, 5000) == 1
    assert wire.paced_due(0.0105, 1000, 5000) == 11
    assert wire.paced_due(99.0, 1000, 5000) == 5000
    assert fanout._shares(10, 3) == [4, 3, 3]
    # a publisher expects everything but its own share
    assert fanout._expected(4, [4, 3]) == [3, 4, 7, 7]


def test_missing_libp2p_venv_is_reported_not_fetched(tmp_path: Path) -> None:
    assert fanout.libp2p_python(str(tmp_path / "absent")) is None


def test_smoke_run_three_nodes_zero_loss(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    env["PYTHONPATH"] = str(SRC)
    argv = [
        sys.executable,
        "-m",
        "hivemesh",
        "bench",
        "fanout",
        "--json",
        "--nodes",
        "3",
        "--events",
        "600",
        "--rate",
        "200",
        "--duration-s",
        "1",
        "--skip-libp2p",
        "--timeout-s",
        "30",
    ]
    try:
        proc = subprocess.run(
            argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150
        )
    except subprocess.TimeoutExpired as exc:  # pragma: no cover - diagnostic
        pytest.fail(f"bench did not finish: {exc.stderr!r}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["bench"] == "fanout"
    names = [m["name"] for m in doc["metrics"]]
    assert names[0] == "events/s to all 3 nodes" and len(names) == 6
    for m in doc["metrics"]:
        assert set(m) >= {"ours", "baseline", "ratio", "unit", "goal", "goal_met"}
    ours = doc["details"]["hivemesh"]
    tp = ours["throughput"]
    assert tp["complete"] and tp["lost"] == 0 and tp["duplicates"] == 0
    assert tp["delivered_to_all"] == 600 and tp["events_per_s"] > 0
    lat = ours["latency"]
    assert lat["lost"] == 0 and lat["samples"] == 200 * 2  # two receivers
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    nats = doc["details"]["nats"]
    if "error" not in nats:  # NATS normally runs here (scripts/services.sh)
        assert nats["throughput"]["lost"] == 0 and nats["latency"]["lost"] == 0
        assert doc["metrics"][0]["baseline"] > 0
    assert "libp2p" not in doc["details"]
    assert not list(tmp_path.iterdir())  # nothing left behind in the cwd
