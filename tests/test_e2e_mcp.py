"""The MCP face end to end: the official ``mcp`` client drives ``hivemesh mcp``
subprocesses over stdio, one on each of two real node processes (loopback).

A write through MCP on node a is read through MCP on node b (and announced
to b's listener as a resource change); a goal submitted on a shows as a plan
tree on b; a claim is taken, won and completed; a lease is taken, its
fencing token seen from the other node, renewed and released; bad input
(unknown tools, wrong types, unknown and missing fields, oversized and too
deep payloads) gets MCP errors with our stable codes and changes nothing.
Every wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types import ResourceUpdatedNotification

from hivemesh.client.swarm import LocalSwarm, NodeProc, wait_until
from hivemesh.faces.mcp import context_uri, plan_uri

DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path_factory.mktemp("mcp")) as s:
        a = s.start("a")
        s.start("b", bootstrap=[a.endpoint])
        wait_until(
            lambda: any(m["state"] == "up" for m in s.status("a")["members"].values()),
            15,
            what="a and b see each other",
        )
        yield s


@asynccontextmanager
async def mcp_on(swarm: LocalSwarm, node: NodeProc, **options: Any) -> AsyncIterator[Client]:
    """The official MCP client on a ``hivemesh mcp`` subprocess of ``node``."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "hivemesh", "mcp", "--data-dir", str(node.data_dir)],
        env=dict(swarm.env),
    )
    async with Client(params, read_timeout_seconds=DEADLINE_S, **options) as client:
        yield client


async def call(client: Client, tool: str, **args: Any) -> Any:
    """A tool's structured answer (fails the test on a tool error)."""
    res = await client.call_tool(tool, args)
    assert not res.is_error, (tool, res.content)
    assert res.structured_content is not None
    assert json.loads(res.content[0].text) is not None  # type: ignore[union-attr]
    return res.structured_content


async def refused(client: Client, tool: str, args: Any) -> str:
    """The stable code of an MCP error answering ``tool(args)``."""
    with pytest.raises(MCPError) as info:
        await client.call_tool(tool, args)
    assert info.value.error.code == -32602, info.value.error
    data = info.value.error.data
    assert isinstance(data, dict), info.value.error
    return str(data["code"])


async def until(what: str, probe: Any) -> Any:
    """Await ``probe()`` until it returns a truthy value, with a deadline."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            got = await probe()
            if got:
                return got
            await asyncio.sleep(0.1)
    raise AssertionError(what)  # pragma: no cover


def run(coro: Any) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(90):
            await coro

    asyncio.run(bounded())


def test_mcp_flow_across_two_nodes(pair: LocalSwarm) -> None:
    a, b = pair.nodes["a"], pair.nodes["b"]

    async def main() -> None:
        async with mcp_on(pair, a) as ma, mcp_on(pair, b) as mb:
            names = {t.name for t in (await ma.list_tools()).tools}
            assert {"ctx_set", "ctx_get", "ctx_watch", "plan_goal", "plan_show", "claim"} <= names
            assert {"lease_acquire", "send", "inbox", "metrics_record", "audit_answer"} <= names

            # context: written through MCP on a, announced to and read on b
            async with mb.listen(resource_subscriptions=[context_uri("room")]) as sub:
                await call(ma, "ctx_set", context="room", key="topic", value={"v": [1, 2]})
                await call(ma, "ctx_append", context="room", list="chat", values=["hi", "there"])
                await call(ma, "ctx_incr", context="room", counter="tokens", by=5)
                await call(ma, "ctx_add", context="room", set="who", elements=["ann", "bob"])
                async with asyncio.timeout(DEADLINE_S):
                    event = await anext(aiter(sub))
                assert event == ResourceUpdated(uri=context_uri("room"))

            async def replicated() -> Any:
                state = await call(mb, "ctx_get", context="room")
                return state if state.get("orset", {}).get("who") == ["ann", "bob"] else None

            state = await until("the context reaches b", replicated)
            assert state["kv"] == {"topic": {"v": [1, 2]}}
            assert state["list"] == {"chat": ["hi", "there"]}
            assert state["counter"] == {"tokens": 5}
            read = await mb.read_resource(context_uri("room"))
            assert json.loads(read.contents[0].text) == state  # type: ignore[union-attr]

            # a watch on b sees the next write on a
            watch = asyncio.ensure_future(
                mb.call_tool("ctx_watch", {"context": "room", "timeout_s": DEADLINE_S})
            )
            await asyncio.sleep(0.5)  # let the watch open before the write it should see
            await call(ma, "ctx_set", context="room", key="phase", value="review")
            watched = (await watch).structured_content
            assert watched is not None and watched["changed"] is True
            assert watched["state"]["kv"]["phase"] == "review"

            # a goal submitted on a is a plan tree on b (announced on b's plan resource)
            async with mb.listen(resource_subscriptions=[plan_uri()]) as sub:
                goal = (await call(ma, "plan_goal", title="write the release notes"))["goal"]
                async with asyncio.timeout(DEADLINE_S):
                    event = await anext(aiter(sub))
                assert event == ResourceUpdated(uri=plan_uri())
            index = json.loads((await mb.read_resource(plan_uri())).contents[0].text)  # type: ignore[union-attr]
            assert goal in index["goals"]

            async def tree_on_b() -> Any:
                try:
                    return await call(mb, "plan_show", goal=goal)
                except AssertionError:
                    return None  # not replicated yet: an error result

            shown = await until("the goal reaches b", tree_on_b)
            assert shown["tree"]["id"] == goal
            assert shown["tree"]["title"] == "write the release notes"
            read = await mb.read_resource(plan_uri(goal))
            assert json.loads(read.contents[0].text)["tree"]["id"] == goal  # type: ignore[union-attr]

            # a task claimed, won and completed
            claim = await call(ma, "claim", resource="task-7")
            assert claim["resource"] == "task-7"
            won = await call(ma, "claim_wait", resource="task-7", timeout_s=10)
            assert won["ours"] is True and won["winner"] == a.address
            assert (await call(ma, "claim_done", resource="task-7"))["done"] is True

            # a lease: its fencing token, seen from the other node
            got = await call(ma, "lease_acquire", resource="printer", holder="ide-a", ttl_ms=10000)
            token = got["token"]
            assert isinstance(token, int) and token >= 1
            held = await call(mb, "lease_show", resource="printer")
            assert held["held"] and held["holder"] == "ide-a" and held["fencing_token"] == token
            other = await call(mb, "lease_acquire", resource="printer", holder="ide-b")
            assert other["token"] is None  # held by ide-a
            renewed = await call(
                ma, "lease_renew", resource="printer", holder="ide-a", token=token, ttl_ms=10000
            )
            assert renewed["ok"] is True
            released = await call(
                ma, "lease_release", resource="printer", holder="ide-a", token=token
            )
            assert released["ok"] is True

            # metrics and escalations answer through the same table
            rec = await call(ma, "metrics_record", name="ide.tokens", value=42, kind="counter")
            assert rec["recorded"] == 1
            assert (await call(ma, "audit_inbox"))["questions"] == []

    run(main())


def test_mcp_bad_input_changes_nothing(pair: LocalSwarm) -> None:
    a = pair.nodes["a"]

    async def main() -> None:
        async with mcp_on(pair, a) as ma:
            await call(ma, "ctx_set", context="guarded", key="k", value="original")
            before = await call(ma, "ctx_get", context="guarded")
            seq_before = (await call(ma, "status"))["journal"]["own_seq"]

            deep: Any = "x"
            for _ in range(80):
                deep = [deep]
            G = {"context": "guarded"}
            cases: list[tuple[str, Any, str]] = [
                ("no_such_tool", {}, "unknown_command"),
                ("ctx_set", {**G, "key": 5, "value": 1}, "invalid_argument"),
                ("ctx_set", {**G, "value": 1}, "invalid_argument"),
                (
                    "ctx_set",
                    {**G, "key": "k", "value": 1, "x": 1},
                    "invalid_argument",
                ),
                (
                    "ctx_set",
                    {**G, "key": "k", "value": "v" * 300_000},
                    "too_large",
                ),
                ("ctx_set", {**G, "key": "k", "value": deep}, "too_deep"),
                ("ctx_add", {**G, "set": "s", "elements": []}, "invalid_argument"),
                (
                    "ctx_incr",
                    {**G, "counter": "c", "by": "ten"},
                    "invalid_argument",
                ),
                ("lease_renew", {"resource": "r", "holder": "h", "token": 0}, "invalid_argument"),
                ("plan_goal", {"title": "t", "max_depth": 99}, "invalid_argument"),
                ("plan_show", {"goal": "f" * 32}, "invalid_argument"),
                ("ctx_watch", {"timeout_s": 1e9}, "invalid_argument"),
            ]
            for tool, args, code in cases:
                assert await refused(ma, tool, args) == code, (tool, args)

            # a command that ran and failed is a tool error with its code
            res = await ma.call_tool(
                "send", {"to": "nobody-by-this-name", "data": 1, "timeout_s": 2}
            )
            assert res.is_error and res.structured_content is not None
            assert res.structured_content["error"]["code"] == "unknown_peer"

            assert await call(ma, "ctx_get", context="guarded") == before
            assert (await call(ma, "status"))["journal"]["own_seq"] == seq_before
            stats = json.loads(
                (await ma.read_resource("hivemesh://mcp/stats")).contents[0].text  # type: ignore[union-attr]
            )
            assert stats["refused_invalid_argument"] >= 8
            assert stats["refused_unknown_command"] == 1
            assert stats["refused_too_large"] == 1 and stats["refused_too_deep"] == 1
            assert stats["failed_unknown_peer"] == 1
            with pytest.raises(MCPError):
                await ma.read_resource("hivemesh://nothing/here")

    run(main())


def test_mcp_handshake_era_client_gets_resource_updates(pair: LocalSwarm) -> None:
    """A client on the 2025 protocol (today's desktop assistants) subscribes with
    resources/subscribe and is told of changes written on the other node."""
    a, b = pair.nodes["a"], pair.nodes["b"]
    updated: asyncio.Queue[str] = asyncio.Queue(100)

    async def on_message(message: Any) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            updated.put_nowait(str(message.params.uri))

    async def main() -> None:
        async with (
            mcp_on(pair, a) as ma,
            mcp_on(pair, b, mode="legacy", message_handler=on_message) as mb,
        ):
            assert mb.server_capabilities.resources is not None
            assert mb.server_capabilities.resources.subscribe is True
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await mb.subscribe_resource(context_uri("desk"))
            await call(ma, "ctx_set", context="elsewhere", key="k", value=1)  # not subscribed
            await call(ma, "ctx_set", context="desk", key="note", value="from a")
            async with asyncio.timeout(DEADLINE_S):
                uri = await updated.get()
            assert uri == context_uri("desk")
            read = await mb.read_resource(context_uri("desk"))
            assert json.loads(read.contents[0].text)["kv"] == {"note": "from a"}  # type: ignore[union-attr]

    run(main())
