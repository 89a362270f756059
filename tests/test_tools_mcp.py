"""MCP servers as tool sources, configured in the desktop-client format:
parsing, the [mcp] config table, sessions over stdio and streamable HTTP,
crashes, timeouts, an independent server from the npm registry, and
``hivemesh agent --mcp`` (an executor calling tools through it: test_plan_mcp)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from hivemesh.audit.server import FixtureServer, serve_in_thread
from hivemesh.audit.world import WorldOptions, build_world
from hivemesh.config import load_config
from hivemesh.errors import ConfigError
from hivemesh.tools.errors import ToolFailed, ToolTimeout, ToolUnavailable, UnknownTool
from hivemesh.tools.mcp_client import MCPToolSet
from hivemesh.tools.spec import MCPServerSpec, load_mcp_config, merge_specs, parse_mcp_config

SRC = str(Path(hivemesh.__file__).resolve().parent.parent)
TEST_SERVER = str(Path(__file__).resolve().parent / "mcp_test_server.py")
ENV = {"PYTHONPATH": SRC}


def stdio_doc(name: str = "t", **extra: Any) -> dict[str, Any]:
    entry = {"command": sys.executable, "args": [TEST_SERVER], "env": ENV, "timeout_s": 60, **extra}
    return {"mcpServers": {name: entry}}


# -- configuration -----------------------------------------------------------------


def test_desktop_format_parses_strictly() -> None:
    doc = {
        "mcpServers": {
            "web": {"command": "hivemesh", "args": ["webtools"], "env": {"A": "1"}},
            "remote": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "x"}},
            "off": {"command": "x", "disabled": True},
        }
    }
    specs = parse_mcp_config(json.dumps(doc))
    assert [s.name for s in specs] == ["off", "remote", "web"]
    web = specs[2]
    assert (web.transport, web.command, web.args, web.env) == (
        "stdio",
        "hivemesh",
        ("webtools",),
        (("A", "1"),),
    )
    assert specs[1].transport == "http" and specs[1].headers == (("Authorization", "x"),)
    assert [s.name for s in merge_specs(specs)] == ["remote", "web"]
    override = parse_mcp_config({"mcpServers": {"web": {"url": "http://h/mcp"}}})
    assert merge_specs(specs, override)[1].transport == "http"
    bad: list[Any] = [
        "{not json",
        [],
        {"servers": {}},
        {"mcpServers": {"x": {"command": "a", "url": "http://h"}}},
        {"mcpServers": {"x": {}}},
        {"mcpServers": {"x": {"command": "a", "argz": []}}},
        {"mcpServers": {"x": {"command": "a", "args": "b"}}},
        {"mcpServers": {"x": {"command": "a", "env": {"A": 1}}}},
        {"mcpServers": {"x": {"url": "ftp://h"}}},
        {"mcpServers": {"x": {"url": "http://h", "args": []}}},
        {"mcpServers": {"x": {"command": "a", "type": "http"}}},
        {"mcpServers": {"x": {"command": "a", "timeout_s": 0}}},
        {"mcpServers": {"a.b": {"command": "a"}}},
    ]
    for doc in bad:
        with pytest.raises(ConfigError):
            parse_mcp_config(doc)


def test_mcp_table_in_config_toml_env_and_files(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[node]\nname = "x"\n[mcp.mcpServers.web]\ncommand = "hivemesh"\nargs = ["webtools"]\n'
    )
    cfg = load_config(tmp_path, environ={})
    assert cfg.mcp_servers == (
        MCPServerSpec("web", "stdio", command="hivemesh", args=("webtools",)),
    )
    hash(cfg)  # the config stays hashable
    env = {"HIVEMESH_MCP_SERVERS": json.dumps({"mcpServers": {"r": {"url": "http://h/mcp"}}})}
    assert [s.name for s in load_config(tmp_path, environ=env).mcp_servers] == ["r"]
    (tmp_path / "config.toml").write_text('[mcp.mcpServers.web]\ncommand = "x"\ntypo = 1\n')
    with pytest.raises(ConfigError, match="typo"):
        load_config(tmp_path, environ={})
    (tmp_path / "m.json").write_text(json.dumps(stdio_doc()))
    (tmp_path / "m.toml").write_text('[mcp.mcpServers.t]\ncommand = "x"\n')
    assert load_mcp_config(tmp_path / "m.json")[0].args == (TEST_SERVER,)
    assert load_mcp_config(tmp_path / "m.toml")[0].command == "x"
    with pytest.raises(ConfigError):
        load_mcp_config(tmp_path / "missing.json")


# -- sessions ------------------------------------------------------------------------


def test_stdio_tools_errors_timeouts_and_a_crash() -> None:
    specs = parse_mcp_config(stdio_doc(allow=["echo", "sleep", "crash", "fail", "pid"]))
    ghost = parse_mcp_config({"mcpServers": {"ghost": {"command": "/nonexistent/mcp-server"}}})

    async def main() -> None:
        async with MCPToolSet(specs + ghost) as tools:
            listed = await tools.list_tools()  # the dead server hides no one's tools
            assert [t["name"] for t in listed] == [
                "t.crash",
                "t.echo",
                "t.fail",
                "t.pid",
                "t.sleep",
            ]
            assert listed[1]["input_schema"]["required"] == ["text"]
            ok = await tools.call("t.echo", {"text": "hi"})
            assert (ok.text, ok.is_error, ok.structured) == ("hi", False, {"result": "hi"})
            failed = await tools.call("t.fail", {})
            assert failed.is_error and failed.reason == "boom_code"
            with pytest.raises(ToolFailed) as err:
                await tools.call_checked("t.fail", {})
            assert err.value.reason == "boom_code"
            typed = await tools.call("t.echo", {"text": 5})
            assert typed.is_error and typed.reason == "invalid_arguments"
            with pytest.raises(ToolTimeout):
                await tools.call("t.sleep", {"seconds": 30}, timeout_s=0.3)
            pid = (await tools.call("t.pid", {})).text  # the session survived the timeout
            with pytest.raises(ToolUnavailable):
                await tools.call("t.crash", {})
            again = (await tools.call("t.pid", {})).text  # a new server process
            assert again != pid
            counters = tools.connections["t"].counters
            assert counters["starts"] == 2 and counters["crashes"] == 1
            for name in ("nope.x", "t", "t.secret", "ghost"):
                with pytest.raises(UnknownTool):
                    await tools.call(name, {})
            with pytest.raises(ToolUnavailable):
                await tools.call("ghost.anything", {})
            with pytest.raises(ToolUnavailable, match="next try"):  # backing off, no respawn
                await tools.call("ghost.anything", {})
            assert await tools.call_tool("t.fail", {}) == (
                "error: Error executing tool fail: boom_code: this tool always fails"
            )
            assert (await tools.call_tool("nope.x", {})).startswith("error: unknown_tool:")

    asyncio.run(main())


@pytest.fixture(scope="module")
def fixture_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureServer]:
    world = build_world(7, WorldOptions(slow_ms=100))
    with serve_in_thread(world, out_dir=tmp_path_factory.mktemp("shops")) as fx:
        yield fx


def test_http_source_from_a_url_config(fixture_world: FixtureServer) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hivemesh", "webtools", "--http", "127.0.0.1:0"],
        env={**ENV, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        specs = parse_mcp_config({"mcpServers": {"web": {"url": url, "timeout_s": 60}}})
        plain = next(s for s in fixture_world.world.shops if not s.behaviours)

        async def main() -> None:
            async with MCPToolSet(specs) as tools:
                names = [t["name"] for t in await tools.list_tools()]
                assert "web.extract_prices" in names and "web.follow_pagination" in names
                res = await tools.call_checked(
                    "web.follow_pagination", {"url": fixture_world.shop_url(plain.id)}
                )
                assert res.structured is not None
                got = [p["price"] for p in res.structured["products"]]
                assert got == [p.price() for p in plain.products]
                bad = await tools.call("web.fetch_page", {"url": fixture_world.url + "/nope/"})
                assert bad.is_error and bad.reason == "fetch_failed"

        asyncio.run(main())
    finally:
        proc.terminate()
        proc.wait(15)


def test_an_independent_server_from_the_npm_registry(tmp_path: Path) -> None:
    npx = shutil.which("npx")
    if npx is None or shutil.which("node") is None:
        print("skipped: node/npx are not installed")
        pytest.skip("node/npx are not installed")
    doc = {
        "mcpServers": {
            "memory": {
                "command": npx,
                "args": ["-y", "@modelcontextprotocol/server-memory"],
                "env": {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")},
                "timeout_s": 180,
            }
        }
    }

    async def main() -> None:
        async with MCPToolSet(parse_mcp_config(doc)) as tools:
            await tools.connections["memory"].tools()  # raises with the reason if it fails
            names = [t["name"] for t in await tools.list_tools()]
            assert {"memory.create_entities", "memory.read_graph"} <= set(names)
            made = await tools.call_checked(
                "memory.create_entities",
                {"entities": [{"name": "shop-07", "entityType": "shop", "observations": ["ok"]}]},
            )
            assert "shop-07" in made.text
            graph = await tools.call_checked("memory.read_graph", {})
            assert "shop-07" in graph.text
            bad = await tools.call("memory.create_entities", {"entities": "nope"})
            assert bad.is_error

    asyncio.run(main())


def agent(*args: str, data_dir: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    env["PYTHONPATH"] = SRC
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "hivemesh", "agent", "--role", "observer", "--json"),
            *("--data-dir", str(data_dir), "--listen", "127.0.0.1:0", *args),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_agent_takes_mcp_servers_from_the_flag_and_the_config_file(tmp_path: Path) -> None:
    d = tmp_path / "node"
    d.mkdir()
    (d / "config.toml").write_text(
        '[mcp.mcpServers.web]\ncommand = "hivemesh"\nargs = ["webtools"]\n'
    )
    proc = agent("--mcp", json.dumps(stdio_doc("t")), data_dir=d)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["role"] == "observer" and ready["tools"] == ["t", "web"]
    finally:
        proc.terminate()
        assert proc.wait(20) == 0
    (tmp_path / "bad.json").write_text('{"mcpServers": {"x": {"command": "a", "bogus": 1}}}')
    proc = agent("--mcp", str(tmp_path / "bad.json"), data_dir=tmp_path / "other")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert json.loads(out)["error"]["code"] == "config_error" and "bogus" in out
