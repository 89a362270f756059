"""Node wiring, the public surface, the CLI over a real store, and the bench smoke run."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import threading
from collections.abc import Mapping
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")

import hivemesh.telemetry as telemetry
from hivemesh.faces.cli import main as cli_main
from hivemesh.telemetry import CollectorNode, NodeStatus, NodeTelemetry

EXPECTED_PUBLIC = {
    "COLLECTOR_NAME", "Alert", "CallStats", "Collector", "CollectorNode", "Deliver",
    "HealthMonitor", "HealthService", "Metrics", "MetricsStore", "NodeStatus", "NodeTelemetry",
    "Sender", "SenderReport", "Spool", "Thresholds", "Transition", "WebhookNotifier",
    "pagerduty_payload", "slack_payload",
}  # fmt: skip


def test_public_surface_is_deliberate() -> None:
    assert set(telemetry.__all__) == EXPECTED_PUBLIC
    assert telemetry.__all__ == sorted(telemetry.__all__, key=lambda n: (not n.isupper(), n))
    for name in telemetry.__all__:
        assert getattr(telemetry, name) is not None


def cli(*argv: str) -> Any:
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(list(argv)) == 0
    return json.loads(out.getvalue())


def test_node_to_collector_in_process_then_cli_queries(tmp_path: Path) -> None:
    col = CollectorNode(tmp_path / "collector", members=lambda: [NodeStatus("hmx", "dead", 0)])

    async def deliver(payload: bytes) -> Mapping[str, Any]:
        return await col.handle_message("hm-node-1", payload)

    async def main() -> None:
        await col.start()
        node = NodeTelemetry(tmp_path / "node", deliver, agent="planner", linger_s=0.01)
        await node.start()
        m = node.metrics
        for i in range(10):
            m.llm_call(
                model="m-a" if i < 7 else "m-b",
                input_tokens=100,
                output_tokens=10,
                latency_ms=float(10 * (i + 1)),
                error_type="RateLimit" if i == 0 else None,
            )

        def from_a_worker_thread() -> None:
            for _ in range(4):
                m.tool_call(tool="search", latency_ms=5.0)

        t = threading.Thread(target=from_a_worker_thread)
        t.start()
        t.join()
        with pytest.raises(ValueError), m.track_tool("browser"):
            raise ValueError("page gone")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while node.spool.backlog and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert node.spool.backlog == 0
        await node.stop()
        assert col.health is not None
        await col.health.evaluate_once()
        await col.stop()

    asyncio.run(main())
    store = str(tmp_path / "collector" / "metrics.duckdb")
    by_model = {
        r["model"]: r for r in cli("metrics", "--store", store, "--json", "top", "--by", "model")
    }
    assert by_model["m-a"]["records"] == 7 and by_model["m-a"]["failures"] == 1
    assert by_model["m-a"]["input_tokens"] == 700 and by_model["m-b"]["p50_ms"] == 90.0
    fails = cli("metrics", "failures", "--store", store, "--json")
    tool_rates = {r["key"]: r["failure_rate"] for r in fails if r["by"] == "tool"}
    assert tool_rates == {"browser": 1.0, "search": 0.0}
    (row,) = cli(
        "metrics", "query", "SELECT count(*) AS n FROM metrics", "--store", store, "--json"
    )
    assert row["n"] == 15
    assert cli("metrics", "gaps", "--store", store, "--json") == []
    (alert,) = cli("alerts", "--store", store, "--json")
    assert alert["rule"] == "node_down" and alert["status"] == "firing"


def test_cli_reports_a_missing_store(tmp_path: Path) -> None:
    assert cli_main(["metrics", "--store", str(tmp_path / "nope.duckdb"), "top"]) == 1


def test_bench_smoke() -> None:
    from hivemesh.bench import telemetry as bench

    args = argparse.Namespace(
        senders=3, records=200, batch=50, layout="split", transport="inproc", repeat=1
    )
    res = bench.run(args)
    flush, same = res.metrics
    assert flush.goal and flush.ours > 0 and flush.baseline and same.baseline
    assert res.details["records"] == 600
    assert json.loads(json.dumps(res.to_json()))["metrics"][0]["ratio"] > 0


def test_bench_mesh_smoke_hosts_sender_nodes_per_process() -> None:
    from hivemesh.bench import telemetry as bench

    args = argparse.Namespace(
        senders=4, records=300, batch=50, layout="mesh", transport="inproc", repeat=1,
        per_process=2,
    )  # fmt: skip
    res = bench.run(args)  # raises unless the collector stored exactly every record
    d = res.details
    assert d["records"] == 1200 and d["sender_nodes"] == 4 and d["sender_processes"] == 2
    assert "2 sender nodes per OS process" in d["hosting"]
    assert d["collector_cpu_us_per_pt"][0] > 0 and d["senders_cpu_us_per_pt"][0] > 0
    assert res.metrics[0].ours > 0 and res.metrics[0].baseline


def test_cli_says_why_when_a_running_collector_holds_the_store(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    store = tmp_path / "m.duckdb"
    col = subprocess.Popen(
        [sys.executable, "-m", "hivemesh.telemetry.loopback", "collector", "--store", str(store)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert col.stdout is not None and col.stdout.readline().startswith("READY")
        res = subprocess.run(
            [sys.executable, "-m", "hivemesh", "metrics", "--store", str(store), "top"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert res.returncode == 1
        assert "running collector holds the store" in res.stderr
    finally:
        col.terminate()
        col.wait(timeout=30)
        if col.stdout:
            col.stdout.close()
