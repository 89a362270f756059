"""The dashboard's server beside an in-process node: who may ask, the live
stream, the one write, and the bounded fan-out.

Over real HTTP (httpx) and, for the token, a real headless Chromium.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from aiotest import eventually, run
from dashboard_helpers import SRC, chromium_path
from hivemesh import Node
from hivemesh.errors import ConfigError, PeerBusy
from hivemesh.faces.dashboard import DashboardServer, NodeSource
from hivemesh.faces.dashboard.hub import Hub

TOKEN = "correct-horse-battery-staple"


@asynccontextmanager
async def served(tmp_path: Path, **kw: Any) -> AsyncIterator[tuple[Node, DashboardServer]]:
    async with (
        Node(tmp_path / "node", trust_mode="open") as node,
        DashboardServer(NodeSource(node), port=0, **kw) as dash,
    ):
        yield node, dash


def _local(dash: DashboardServer) -> str:
    return f"http://127.0.0.1:{dash.port}"


async def _sse_events(resp: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    event = ""
    async for line in resp.aiter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, json.loads(line[6:])


def test_off_loopback_every_request_without_the_token_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(ConfigError):
            DashboardServer(NodeSource(Node(tmp_path / "x")), host="0.0.0.0", port=0)
        async with (
            served(tmp_path, host="0.0.0.0", token=TOKEN) as (_node, dash),
            httpx.AsyncClient(base_url=_local(dash), timeout=10, trust_env=False) as http,
        ):
            paths = ["/", "/static/app.js", "/api/snapshot", "/api/events", "/api/health"]
            for path in paths:
                for headers in ({}, {"Authorization": "Bearer wrong"}):
                    r = await http.get(path, headers=headers)
                    assert r.status_code == 401, (path, headers, r.status_code)
                    assert r.json()["error"]["code"] == "dashboard_unauthorized"
            r = await http.post("/api/audit/answer", json={"id": "q", "text": "t"})
            assert r.status_code == 401
            assert dash.counters["dashboard_unauthorized"] == 2 * len(paths) + 1
            # the token opens everything: as a bearer token...
            auth = {"Authorization": f"Bearer {TOKEN}"}
            r = await http.get("/api/snapshot", headers=auth)
            assert r.status_code == 200 and "sections" in r.json()
            # ...or once on the page's URL, which keeps it in a cookie and drops it from the URL
            r = await http.get("/", params={"token": TOKEN})
            assert r.status_code == 303 and r.headers["location"] == "/"
            assert "httponly" in r.headers["set-cookie"].lower()
            r = await http.get("/api/snapshot")  # the client kept the cookie
            assert r.status_code == 200
            # a real browser: refused without the token, a live page with it
            await _browser_checks(_local(dash))

    run(main(), timeout_s=90)


async def _browser_checks(base: str) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = await browser.new_page()
            resp = await page.goto(f"{base}/")
            assert resp is not None and resp.status == 401
            page = await browser.new_page()  # a fresh page: its console must stay clean
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            resp = await page.goto(f"{base}/?token={TOKEN}")
            assert resp is not None and resp.status == 200 and page.url == f"{base}/"
            await page.wait_for_function(
                "() => document.querySelector('[data-testid=live]').textContent === 'live'",
                timeout=20_000,
            )
            await page.wait_for_function(
                "() => document.querySelector('[data-testid=node]').textContent.includes('up')",
                timeout=20_000,
            )
            assert errors == []
        finally:
            await browser.close()


def test_on_loopback_other_hosts_and_foreign_writes_are_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            served(tmp_path) as (_node, dash),
            httpx.AsyncClient(base_url=_local(dash), timeout=10, trust_env=False) as http,
        ):
            assert (await http.get("/")).status_code == 200  # no token on loopback
            r = await http.get("/api/snapshot", headers={"Host": "attacker.example"})
            assert r.status_code == 403  # a DNS-rebound page
            answer = {"id": "q-nobody-asked", "text": "yes"}
            r = await http.post("/api/audit/answer", content=json.dumps(answer))
            assert r.status_code == 403  # not JSON: a plain cross-site form post
            r = await http.post(
                "/api/audit/answer", json=answer, headers={"Origin": "http://attacker.example"}
            )
            assert r.status_code == 403
            assert dash.counters["dashboard_forbidden"] == 3
            r = await http.post("/api/audit/answer", json=answer)
            assert r.status_code == 404
            assert r.json()["error"]["code"] == "unknown_escalation"
            for bad in ({"id": "q"}, {"id": 3, "text": "x"}, {"id": "q", "text": "x", "z": 1}):
                r = await http.post("/api/audit/answer", json=bad)
                assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"
            r = await http.post(
                "/api/audit/answer",
                content=b'{"id": "' + b"x" * 20_000 + b'"}',
                headers={"Content-Type": "application/json"},
            )
            assert r.status_code == 413
            r = await http.get("/static/../server.py")
            assert r.status_code == 404

    run(main(), timeout_s=60)


def test_the_stream_sends_a_snapshot_then_what_the_journal_changes(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            served(tmp_path) as (node, dash),
            httpx.AsyncClient(base_url=_local(dash), timeout=10, trust_env=False) as http,
            http.stream("GET", "/api/events") as resp,
        ):
            assert resp.headers["content-type"].startswith("text/event-stream")
            events = _sse_events(resp)
            async with asyncio.timeout(20):
                kind, snap = await anext(events)
                assert kind == "snapshot" and set(snap) == {"sections", "versions"}
                with node.context("room") as ctx:
                    ctx["topic"] = "dashboards"
                async for kind, update in events:
                    assert kind == "update"
                    if update["section"] == "context":
                        rooms = {c["context"]: c for c in update["data"]["contexts"]}
                        if "room" in rooms:
                            assert rooms["room"]["items"] == [
                                {"key": "topic", "type": "kv", "value": "dashboards"}
                            ]
                            break
            assert dash.live.events_seen >= 1
            assert dash.hub.clients == 1

    run(main(), timeout_s=60)


def test_a_slow_client_is_dropped_and_counted_others_are_not() -> None:
    async def main() -> None:
        hub = Hub(queue_max=4, max_clients=2)
        slow, quick = hub.subscribe(), hub.subscribe()
        with pytest.raises(PeerBusy):
            hub.subscribe()
        assert hub.counters["clients_refused"] == 1
        for i in range(10):
            assert hub.publish("peers", [i])
            while not quick.queue.empty():  # this one keeps up
                assert quick.queue.get_nowait() is not None
        assert not hub.publish("peers", [9])  # unchanged: nothing sent
        assert slow.dropped and not quick.dropped
        assert slow.queue.get_nowait() is None and slow.queue.empty()  # told, nothing held
        assert hub.counters["dashboard_client_slow"] == 1
        assert hub.clients == 2  # its slot is held until its stream closes
        with pytest.raises(PeerBusy):
            hub.subscribe()
        hub.unsubscribe(slow)
        assert hub.clients == 1
        assert hub.snapshot()["versions"] == {"peers": 10}

    run(main(), timeout_s=10)


def test_a_page_that_stops_reading_is_cut_off_and_gives_its_slot_back(tmp_path: Path) -> None:
    async def main() -> None:
        async with served(tmp_path, write_timeout_s=0.5, queue_max=100_000) as (_node, dash):
            reader, writer = await asyncio.open_connection("127.0.0.1", dash.port)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            writer.write(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            await writer.drain()
            reader._transport.pause_reading()  # type: ignore[attr-defined]  # stop reading
            await eventually(lambda: dash.hub.clients == 1, "the stream is open", 10)
            blob = "x" * 100_000
            for i in range(2_000):  # up to 200 MB: far more than the socket buffers hold
                dash.hub.publish("bulk", {"i": i, "blob": blob})
                await asyncio.sleep(0)
                if dash.counters["dashboard_client_stalled"]:
                    break
            await eventually(
                lambda: dash.counters["dashboard_client_stalled"] == 1, "the write timed out", 10
            )
            await eventually(lambda: dash.hub.clients == 0, "its slot is given back", 10)
            writer.close()

    run(main(), timeout_s=60)


def test_the_command_says_when_no_node_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIVEMESH_")}
    out = subprocess.run(
        [sys.executable, "-m", "hivemesh", "dashboard", "--data-dir", str(tmp_path), "--json"],
        env={**env, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert json.loads(out.stdout)["error"]["code"] == "daemon_not_running"


def test_a_daemon_that_goes_away_shows_as_an_error_and_comes_back_live(tmp_path: Path) -> None:
    from hivemesh.client.swarm import LocalSwarm
    from hivemesh.faces.dashboard import ControlSource

    swarm = LocalSwarm(tmp_path / "swarm")
    try:
        node = swarm.start("a")

        async def main() -> None:
            source = ControlSource(node.data_dir, timeout_s=5.0)
            async with DashboardServer(source, port=0) as dash:
                sections = dash.hub.sections
                await eventually(lambda: "address" in sections.get("node", {}), "node shown", 20)
                await asyncio.to_thread(swarm.kill, "a")
                await eventually(
                    lambda: sections["node"].get("error") == "daemon_not_running",
                    "the page says the daemon is gone",
                    20,
                )
                await asyncio.to_thread(swarm.restart, "a")
                await eventually(lambda: "address" in sections["node"], "node back", 30)
                # the event stream was opened again (a supervised restart, counted)
                await eventually(lambda: dash.live.streams_opened >= 2, "stream reopened", 30)
                assert dash.counters["task_failed_dashboard_watch"] >= 1
                await asyncio.to_thread(node.client.ctx_set, "room", "after", "restart")
                await eventually(
                    lambda: any(
                        c["context"] == "room" for c in sections["context"].get("contexts", [])
                    ),
                    "a write after the restart reaches the page",
                    20,
                )

        run(main(), timeout_s=120)
    finally:
        swarm.close()


def test_demo_dashboard_leaves_only_the_human_only_question_to_the_page() -> None:
    from hivemesh.faces.cli import build_parser
    from hivemesh.faces.cli.commands.demo import _page_operator

    args = build_parser("demo").parse_args(["demo", "--dashboard"])
    assert args.dashboard == 7480
    assert build_parser("demo").parse_args(["demo"]).dashboard is None
    said: list[str] = []
    operator = _page_operator(said.append)
    brief = {"shop": "shop-42", "code": "2503-4228"}
    assert operator({"id": "q1", "shop": "shop-07"}, brief) == "skip"
    assert operator({"id": "q2", "shop": "shop-42"}, brief) is None
    assert operator({"id": "q2", "shop": "shop-42"}, brief) is None
    assert len(said) == 1 and "2503-4228" in said[0]  # told once, with the code
