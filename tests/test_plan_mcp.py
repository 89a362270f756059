"""Executor tools from a real MCP server (in memory), through MCPToolBox."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

import hivemesh
from hivemesh.core.plan import PlanView
from hivemesh.core.plan_events import KIND_GOAL, goal_body, goal_id
from hivemesh.llm import ScriptedLLM
from hivemesh.roles import Executor, Job
from hivemesh.roles.local import LocalJournal, author_key
from hivemesh.roles.mcp_tools import MCPToolBox

mcp = pytest.importorskip("mcp")
mcpserver = pytest.importorskip("mcp.server.mcpserver")


def make_server() -> Any:
    app = mcpserver.MCPServer("trains")

    @app.tool()
    def next_train(city: str) -> str:
        """Next train to a city."""
        return f"09:12 to {city}"

    @app.tool()
    def boom() -> str:
        """Always fails."""
        raise ValueError("nope")

    return app


async def drive(ex: Executor, view: PlanView, j: LocalJournal, clock: list[int]) -> None:
    """Two poll rounds of ``ex``: claim the leaf, then run it."""
    for _ in range(2):
        for a in ex.poll(view, clock[0]):
            for e in await a.run() if isinstance(a, Job) else [a]:
                j.append(ex.me, e.kind, e.body)
        clock[0] += 100


def test_executor_uses_mcp_tools() -> None:
    clock = [5_000_000]
    j = LocalJournal(lambda: clock[0])
    view = PlanView()
    j.add_view(view)
    j.append(author_key("cli"), KIND_GOAL, goal_body("go to Porto", b"mcp-nonce", max_depth=0))
    gid = goal_id(author_key("cli"), b"mcp-nonce")
    llm = ScriptedLLM(
        [
            {"tool": "boom", "arguments": {}},
            {"tool": "secret", "arguments": {}},
            {"tool": "next_train", "arguments": {"city": "Porto"}},
            {"result": "take the 09:12"},
        ]
    )

    async def main() -> MCPToolBox:
        async with mcp.Client(make_server()) as client:
            tools = MCPToolBox(client, allow=["next_train", "boom"])
            await drive(Executor(author_key("e"), llm, tools=tools), view, j, clock)
            return tools

    tools = asyncio.run(main())
    assert view.final_answer(gid) == "take the 09:12"
    system = llm.calls[0][0]["content"]
    assert "next_train: Next train to a city." in system and '"city"' in system
    assert "secret" not in system and tools.calls == 2
    replies = [c[-1]["content"] for c in llm.calls[1:]]
    assert replies[0].startswith("Tool boom returned:\nerror:")
    assert "not allowed" in replies[1]
    assert replies[2] == "Tool next_train returned:\n09:12 to Porto"


def test_an_executor_calls_tools_through_the_mcp_client_over_stdio() -> None:
    """The same through :class:`MCPToolSet`: a real server process over stdio,
    configured in the desktop-client format, tools named ``server.tool``."""
    from hivemesh.tools.mcp_client import MCPToolSet
    from hivemesh.tools.spec import parse_mcp_config

    server = str(Path(__file__).resolve().parent / "mcp_test_server.py")
    src = str(Path(hivemesh.__file__).resolve().parent.parent)
    doc = {
        "mcpServers": {
            "t": {"command": sys.executable, "args": [server], "env": {"PYTHONPATH": src}}
        }
    }
    clock = [5_000_000]
    j = LocalJournal(lambda: clock[0])
    view = PlanView()
    j.add_view(view)
    j.append(
        author_key("cli"), KIND_GOAL, goal_body("price of shop-07", b"price-nonce", max_depth=0)
    )
    gid = goal_id(author_key("cli"), b"price-nonce")
    llm = ScriptedLLM(
        [
            {"tool": "t.fail", "arguments": {}},
            {"tool": "t.echo", "arguments": {"text": "1.234,56 EUR"}},
            {"result": "the price is 1234.56 EUR"},
        ]
    )

    async def main() -> MCPToolSet:
        async with MCPToolSet(parse_mcp_config(doc)) as tools:
            await drive(Executor(author_key("e"), llm, tools=tools), view, j, clock)
            return tools

    tools = asyncio.run(main())
    assert view.final_answer(gid) == "the price is 1234.56 EUR"
    assert "t.echo: Return text unchanged." in llm.calls[0][0]["content"]
    replies = [c[-1]["content"] for c in llm.calls[1:]]
    assert replies[0].startswith("Tool t.fail returned:\nerror: ") and "boom_code" in replies[0]
    assert replies[1] == "Tool t.echo returned:\n1.234,56 EUR"
    assert tools.calls == 2
