"""Telemetry wired into an in-process node: ``Node.metrics``, the LLM usage hook,
the collector's own records, ``status()["telemetry"]`` and a node without a
collector keeping its records spooled."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from hivemesh.commands import MetricsQuery
from hivemesh.telemetry.app import HEARTBEAT, TelemetryApp, usage_hook


async def _until(fn: Any, timeout_s: float = 10.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = await fn()
        if value:
            return value
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def test_collector_node_stores_its_own_records_and_llm_usage(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with hivemesh.Node(tmp_path / "c", collector=True, name="planner") as node:
            assert node.resolve("metrics-collector") == node.address
            node.metrics.count("tasks.claimed")
            hook = usage_hook(node.metrics)
            hook("gpt-4o-mini", 120, 30, 250.0, True)
            hook("gpt-4o-mini", 0, 0, 9.0, False)
            sql = (
                "SELECT name, kind, model, input_tokens, ok FROM metrics"
                f" WHERE name <> '{HEARTBEAT}' ORDER BY seq"
            )

            async def rows() -> Any:
                # (the query takes the typed metrics command now, not a dict of args)
                got = await node.daemon.app(TelemetryApp).query(MetricsQuery(what="query", sql=sql))
                return got["rows"] if len(got["rows"]) == 3 else None

            got = await _until(rows)
            assert got == [
                ["tasks.claimed", "counter", None, None, True],
                ["gen_ai.client.operation.duration", "llm_call", "gpt-4o-mini", 120, True],
                ["gen_ai.client.operation.duration", "llm_call", "gpt-4o-mini", 0, False],
            ]
            tele = node.status()["telemetry"]
            assert tele["collector"]["counters"]["accepted"] >= 3
            assert tele["collector"]["gaps"] == 0

    asyncio.run(scenario())


def test_without_a_collector_records_wait_in_the_spool(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with hivemesh.Node(tmp_path / "a", telemetry_max_backoff_s=0.1) as node:
            for i in range(5):
                node.metrics.gauge("queue.depth", i)

            async def failing() -> bool:
                t = node.status()["telemetry"]
                return bool(t["sender"]["failures"] >= 2)

            await _until(failing)
            tele = node.status()["telemetry"]
            assert tele["spool_backlog"] >= 5 and tele["collector"] is None
            assert "metrics-collector" in tele["sender"]["last_error"]
        # spooled across a restart, nothing lost
        async with hivemesh.Node(tmp_path / "a") as node:
            assert node.status()["telemetry"]["spool_backlog"] >= 5

    asyncio.run(scenario())


def test_telemetry_config_section(tmp_path: Path) -> None:
    from hivemesh.config import load_config
    from hivemesh.errors import ConfigError

    (tmp_path / "config.toml").write_text(
        '[telemetry]\ncollector = true\nmetrics_senders = ["sender-1"]\ntelemetry_timeout_s = 2.5\n'
    )
    cfg = load_config(tmp_path, environ={})
    assert cfg.collector and cfg.metrics_senders == ("sender-1",)
    assert cfg.telemetry_timeout_s == 2.5 and cfg.telemetry
    (tmp_path / "config.toml").write_text("[telemetry]\ntelemetry_timeout_s = 0\n")
    with pytest.raises(ConfigError, match="telemetry_timeout_s"):
        load_config(tmp_path, environ={})
