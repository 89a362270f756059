"""Bad input never crashes or stalls the audit: each case is reflected,
retried or escalated.

A real node (in process), the real fixture server, the real web-tools MCP
server over stdio, the supervisor, an executor and the reflector. Between
the executor and its tools sits a test-only fault injector: malformed HTML
instead of a page, tool timeouts, error results, and a real crash (SIGKILL)
of the MCP server process mid-audit. An answer to a question nobody asked is
refused with its own error. Every shop must still end with the fixture's
ground-truth prices.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from audit_harness import audit_on_one_node
from hivemesh import Node
from hivemesh.audit import ops
from hivemesh.audit.errors import UnknownEscalation
from hivemesh.audit.node import webtools_spec
from hivemesh.audit.server import FixtureServer, serve_in_thread
from hivemesh.audit.world import WorldOptions, build_world
from hivemesh.client.blocking import Client
from hivemesh.errors import HivemeshError, InvalidArgument
from hivemesh.tools.errors import ToolTimeout
from hivemesh.tools.mcp_client import MCPToolSet

GARBAGE = "<html><body><div><<<>>\x00<table><tr><td>no price here</td><p>" * 20


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FixtureServer]:
    w = build_world(7, WorldOptions(slow_ms=150))
    with serve_in_thread(w, out_dir=tmp_path_factory.mktemp("shops")) as fx:
        yield fx


def _children(name: str) -> list[int]:
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == me and name.encode() in cmd:
            out.append(int(d))
    return out


class Faulty:
    """Test-only: injects faults between the executor and its real tools."""

    def __init__(self, inner: MCPToolSet, plan: dict[tuple[str, str], list[str]]) -> None:
        self.inner = inner
        self.plan = plan
        self.done: Counter[str] = Counter()

    async def call(self, name: str, args: dict[str, Any], *, timeout_s: float | None = None) -> Any:
        url = str(args.get("url") or args.get("base_url") or "")
        for (shop, tool), faults in self.plan.items():
            if tool == name and f"/{shop}/" in url and faults:
                fault = faults[0]
                if fault == "timeout":
                    faults.pop(0)
                    self.done[fault] += 1
                    raise ToolTimeout(f"{name}: no answer in time (injected)", tool=name)
                if fault == "crash":
                    faults.pop(0)
                    self.done[fault] += 1
                    for pid in _children("webtools"):
                        os.kill(pid, signal.SIGKILL)
                    break
                # "error", "garbage": change a real answer (once one comes: the crash
                # above can fail calls in flight)
                res = await self.inner.call(name, args, timeout_s=timeout_s)
                if res.is_error:
                    return res
                faults.pop(0)
                self.done[fault] += 1
                if fault == "error":
                    return dataclasses.replace(res, is_error=True, reason="", structured=None)
                got = dict(res.structured or {})  # garbage: the page read as nothing
                got.pop("snapshot", None)
                got.update(html=GARBAGE, products=[], next_page=None)
                return dataclasses.replace(res, structured=got)
        return await self.inner.call(name, args, timeout_s=timeout_s)


def test_malformed_html_timeouts_errors_and_a_crashed_mcp_server(
    world: FixtureServer, tmp_path: Path
) -> None:
    shops = [s for s in world.world.shops if not s.behaviours or s.behaviours == {"human-only"}]
    chosen = [s for s in shops if "human-only" in s.behaviours] + [
        s for s in shops if not s.behaviours
    ][:6]
    ids = [s.id for s in chosen]
    plan = {
        (ids[1], "web.fetch_page"): ["garbage"],
        (ids[2], "web.fetch_page"): ["timeout", "timeout"],
        (ids[3], "web.fetch_page"): ["error"],
        (ids[4], "web.fetch_page"): ["crash"],
        (ids[5], "web.fetch_page"): ["timeout"],
    }

    async def main() -> tuple[Any, Faulty, list[str]]:
        refused: list[str] = []
        async with MCPToolSet([webtools_spec(world.routes)]) as inner:
            tools = Faulty(inner, plan)

            async def unknown_answers(node: Node) -> None:
                # an answer to an escalation nobody made: refused, typed; the audit goes on
                with pytest.raises(UnknownEscalation):
                    await ops.answer(node.daemon, "q-nope", "1234")
                with pytest.raises(InvalidArgument):
                    await ops.answer(node.daemon, 42, "")
                client = Client(tmp_path / "node")
                try:
                    await asyncio.to_thread(client.call, "audit.answer", id="q-nope", text="x")
                except HivemeshError as exc:
                    refused.append(str(exc))

            doc = await audit_on_one_node(
                world, ids, tools, tmp_path / "node", before=unknown_answers
            )
            refused.append(str(inner.connections["web"].counters["starts"]))
            return doc, tools, refused

    doc, tools, refused = asyncio.run(main())
    assert refused and "no question" in refused[0]
    assert tools.done == {"garbage": 1, "timeout": 3, "error": 1, "crash": 1}
    truth = world.world.ground_truth(world.url)["shops"]
    for sid in ids:
        got = [(p["sku"], p["price"]) for p in doc["done"][sid]["products"]]
        assert got == [(p["sku"], p["price"]) for p in truth[sid]["products"]], sid
    fixes = Counter((c["after"], c["action"]) for c in doc["corrections"])
    assert fixes[("extract_failed", "other_strategy")] >= 1  # malformed HTML: other strategies
    # ... then a fresh fetch (unless the shop's lease was lost meanwhile on a
    # loaded machine: the next holder fetches afresh anyway)
    assert fixes[("extract_failed", "retry")] <= 1
    assert fixes[("tool_timeout", "retry")] == 3
    assert fixes[("tool_failed", "retry")] == 1
    # the killed server was started again; calls caught in the crash were retried
    assert int(refused[-1]) >= 2
    assert fixes[("tool_unavailable", "retry")] == sum(
        1 for r in doc["tool_results"] if r["error"] == "tool_unavailable"
    )
    assert fixes[("access_code_required", "escalate")] == 1
    assert [q["answer"] for q in doc["questions"]] == [world.world.operator_code()]


def test_report_files_from_an_export(world: FixtureServer, tmp_path: Path) -> None:
    from hivemesh.audit.report import COLUMNS, build_report, write_report

    ids = [s.id for s in world.world.shops if "human-only" in s.behaviours]
    ids += [s.id for s in world.world.shops if not s.behaviours][:2]

    async def main() -> dict[str, Any]:
        async with MCPToolSet([webtools_spec(world.routes)]) as tools:
            return await audit_on_one_node(world, ids, tools, tmp_path / "node")

    doc = asyncio.run(main())
    truth = world.world.ground_truth(world.url)
    truth["shops"] = {k: v for k, v in truth["shops"].items() if k in ids}
    report = build_report(doc, ground_truth=truth)
    paths = write_report(report, tmp_path / "report")
    csv_lines = Path(paths["csv"]).read_text().splitlines()
    assert csv_lines[0] == ",".join(COLUMNS)
    assert len(csv_lines) - 1 == sum(len(t["products"]) for t in truth["shops"].values())
    md = Path(paths["markdown"]).read_text()
    assert "every price matches" in md and world.world.operator_code() in md
    assert report["summary"]["escalations"] == 1 and report["summary"]["mismatches"] == 0
