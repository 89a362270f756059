"""An independent MCP server from the npm registry plugged into an audit
executor as a tool source, over stdio.

The reference memory server (``@modelcontextprotocol/server-memory``) runs
under the machine's Node from what npm already holds (``npm ls -g`` or the
npx cache): nothing is downloaded at run time. The executor's tools are the
web tools plus that server, configured in the desktop-client format; it notes
every audited shop in the server's knowledge graph, and each note is a
journaled ``tool.call``/``tool.result`` like any other tool call. Without
node or the package the test is skipped, saying why.
"""

from __future__ import annotations

import asyncio
import glob
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from audit_harness import audit_on_one_node
from hivemesh.audit.node import webtools_spec
from hivemesh.audit.server import FixtureServer, serve_in_thread
from hivemesh.audit.worker import ExecutorOptions
from hivemesh.audit.world import WorldOptions, build_world
from hivemesh.tools.mcp_client import MCPToolSet
from hivemesh.tools.spec import parse_mcp_config

PACKAGE = "@modelcontextprotocol/server-memory"


def _installed_entry() -> str | None:
    """The server's entry script from the global npm tree or the npx cache."""
    roots = []
    npm = shutil.which("npm")
    if npm is not None:
        got = subprocess.run([npm, "root", "-g"], capture_output=True, text=True, timeout=60)
        roots.append(got.stdout.strip())
    roots += glob.glob(str(Path.home() / ".npm/_npx/*/node_modules"))
    for root in roots:
        entry = Path(root) / PACKAGE / "dist" / "index.js"
        if root and entry.exists():
            return str(entry)
    return None


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureServer]:
    with serve_in_thread(
        build_world(7, WorldOptions(slow_ms=150)), out_dir=tmp_path_factory.mktemp("shops")
    ) as fx:
        yield fx


def test_the_npm_memory_server_is_an_executor_tool_source(
    world: FixtureServer, tmp_path: Path
) -> None:
    node = shutil.which("node")
    entry = _installed_entry()
    if node is None or entry is None:
        reason = "node is not installed" if node is None else f"{PACKAGE} is not in npm's store"
        print(f"skipped: {reason} (nothing is downloaded at run time)")
        pytest.skip(reason)
    memory = parse_mcp_config(
        {
            "mcpServers": {
                "memory": {
                    "command": node,
                    "args": [entry],
                    "env": {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")},
                    "timeout_s": 60,
                }
            }
        }
    )
    ids = [s.id for s in world.world.shops if not s.behaviours][:3]

    async def main() -> tuple[dict[str, Any], str]:
        async with MCPToolSet([webtools_spec(world.routes), *memory]) as tools:
            names = {t["name"] for t in await tools.describe()}
            assert {"web.fetch_page", "memory.create_entities", "memory.read_graph"} <= names
            opts = ExecutorOptions(reflect_wait_s=2.0, notes_tool="memory.create_entities")
            doc = await audit_on_one_node(world, ids, tools, tmp_path / "node", options=opts)
            graph = await tools.call_checked("memory.read_graph", {})
            return doc, graph.text

    doc, graph = asyncio.run(main())
    notes = [r for r in doc["tool_results"] if r["tool"] == "memory.create_entities"]
    assert sorted(r["shop"] for r in notes) == sorted(ids)
    assert all(r["outcome"] == "ok" for r in notes)
    truth = world.world.ground_truth()["shops"]
    for sid in ids:
        assert f"/{sid}" in graph
        first = truth[sid]["products"][0]
        assert f"{first['sku']} {first['price']} {truth[sid]['currency']}" in graph
