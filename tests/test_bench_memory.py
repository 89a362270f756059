"""A node's memory: heavy dependencies load only where used, missing extras
say which to install, and ``hivemesh bench memory`` measures real processes."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import hivemesh
from hivemesh.bench import memory
from hivemesh.errors import ConfigError
from hivemesh.extras import missing

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)
#: What a plain node (and the CLI that starts it) must not import.
HEAVY = ("duckdb", "pyarrow", "numpy", "opentelemetry", "nats", "redis", "mcp", "lxml", "httpx")

_NODE = """
import asyncio, sys
import hivemesh
from hivemesh.faces.cli import build_parser

async def main() -> None:
    build_parser()  # every CLI command registered, as `hivemesh up` does
    async with hivemesh.Node(sys.argv[1], trust_mode="open") as node:
        node.metrics.count("bench.memory.test")  # telemetry sending runs too
        await asyncio.sleep(0.5)
    heavy = sys.argv[2].split(",")
    print(",".join(m for m in heavy if m in sys.modules))

asyncio.run(main())
"""


def test_a_plain_node_and_its_cli_load_no_heavy_dependency(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NODE, str(tmp_path / "n"), ",".join(HEAVY)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", f"loaded by a plain node: {done.stdout.strip()}"


def test_a_missing_extra_names_the_extra_to_install() -> None:
    err = missing(ModuleNotFoundError("No module named 'duckdb'", name="duckdb"), "the collector")
    assert isinstance(err, ConfigError)
    assert str(err) == (
        "the collector needs duckdb, not installed: pip install 'hivemesh[collector]'"
    )
    err = missing(ModuleNotFoundError(name="opentelemetry.sdk"), "a sink")
    assert isinstance(err, ConfigError) and "hivemesh[otlp]" in str(err)
    bug = ModuleNotFoundError(name="hivemesh.nothing")
    assert missing(bug, "x") is bug  # not an extra: the error stays what it is


def test_bench_memory_reports_idle_and_loaded_node_beside_a_bare_interpreter() -> None:
    args = argparse.Namespace(writes=50, settle_s=0.5, max_load_s=30.0)
    result = memory.run(args).to_json()
    figures = {m["name"]: m for m in result["metrics"]}
    idle, loaded = figures["idle node RSS"], figures["loaded node RSS"]
    assert 10 < idle["baseline"] < idle["ours"] < 200
    assert loaded["ours"] > 10 and loaded["baseline"] == idle["baseline"]
    assert idle["goal"] == "<= 50 MB" and idle["goal_met"] == (idle["ours"] <= 50)
    assert result["details"]["writes"]["own"] == 50
    assert result["details"]["import_rss_mb"]["loro"] is not None
