"""``hivemesh bench dashboard``: from a journal write to every open page.

One in-process node serves the dashboard (:mod:`hivemesh.faces.dashboard`,
the node read through ``NodeSource``); ``--clients`` browsers' event streams
(real HTTP, server-sent events, read by httpx) are open. Each of
``--writes`` context writes (``ctx.set``, one every ``--gap-ms``) is timed
from the write until **every** stream has delivered the ``context`` update
that holds it: the node's event subscription marks the section stale, the
refresher asks ``ctx.contexts`` and ``ctx.get``, the hub fans the update out.

Baseline, in the same run: the same write until a plain subscriber of the
node (``Node.subscribe("ctx.update")``) has the event -- the freshness any
client of the node could get, with no dashboard in between. The ratio is
the dashboard's cost on top. The goal is absolute: a person watching the
page sees a change within a tenth of a second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from hivemesh.bench import BenchResult, Metric

DESCRIPTION = "journal write -> every open dashboard page (SSE), vs the node's own subscription"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for this benchmark."""
    parser.add_argument("--clients", type=int, default=10, help="open pages (event streams)")
    parser.add_argument("--writes", type=int, default=40)
    parser.add_argument("--gap-ms", type=int, default=300, help="pause between writes")


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


async def _stream(http: Any, seen: dict[int, float], ready: asyncio.Event) -> None:
    """Read one page's stream: record when each written value first arrives."""
    async with http.stream("GET", "/api/events") as resp:
        event = ""
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
                continue
            if not line.startswith("data: "):
                continue
            if event == "snapshot":
                ready.set()
                continue
            update = json.loads(line[6:])
            if update.get("section") != "context":
                continue
            for ctx in update["data"].get("contexts", []):
                if ctx["context"] == "bench":
                    for item in ctx["items"]:
                        if item["key"] == "n":
                            seen.setdefault(int(item["value"]), time.perf_counter())


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from hivemesh import Node
    from hivemesh.faces.dashboard import DashboardServer, NodeSource

    with tempfile.TemporaryDirectory(prefix="hivemesh-bench-dash-") as tmp:
        async with (
            Node(Path(tmp) / "node") as node,
            DashboardServer(NodeSource(node), port=0, max_clients=args.clients + 1) as dash,
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{dash.port}", timeout=30, trust_env=False
            ) as http,
        ):
            seen: list[dict[int, float]] = [{} for _ in range(args.clients)]
            readies = [asyncio.Event() for _ in range(args.clients)]
            streams = [
                asyncio.create_task(_stream(http, s, r)) for s, r in zip(seen, readies, strict=True)
            ]
            base: dict[int, float] = {}

            async def subscriber() -> None:
                async for ev in node.subscribe("ctx.update"):
                    if isinstance(ev.body, dict) and ev.body.get("c") == "bench":
                        base.setdefault(len(base), time.perf_counter())

            sub = asyncio.create_task(subscriber())
            try:
                async with asyncio.timeout(30):
                    for r in readies:
                        await r.wait()
                written: dict[int, float] = {}
                ours: list[float] = []
                for n in range(args.writes):
                    written[n] = time.perf_counter()
                    with node.context("bench") as ctx:
                        ctx["n"] = n
                    async with asyncio.timeout(10):
                        while not all(n in s for s in seen):
                            await asyncio.sleep(0.001)
                    ours.append((max(s[n] for s in seen) - written[n]) * 1000)
                    await asyncio.sleep(args.gap_ms / 1000)
                baseline = [(base[n] - written[n]) * 1000 for n in written if n in base]
            finally:
                for task in [*streams, sub]:
                    task.cancel()
                await asyncio.gather(*streams, sub, return_exceptions=True)
            return {
                "ours": ours,
                "baseline": baseline,
                "slow_dropped": dash.counters["dashboard_client_slow"],
                "events_seen": dash.live.events_seen,
            }


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark."""
    got = asyncio.run(_main(args))
    ours, base = got["ours"], got["baseline"]
    p50, p99 = _quantile(ours, 0.5), _quantile(ours, 0.99)
    b50, b99 = _quantile(base, 0.5), _quantile(base, 0.99)
    return BenchResult(
        "dashboard",
        [
            Metric(
                f"write -> all {args.clients} pages, p50",
                p50,
                b50,
                "ms",
                "node subscription",
                higher_is_better=False,
                goal="p50 <= 100 ms, no page dropped",
                goal_met=p50 <= 100 and got["slow_dropped"] == 0,
            ),
            Metric(
                f"write -> all {args.clients} pages, p99",
                p99,
                b99,
                "ms",
                "node subscription",
                higher_is_better=False,
            ),
        ],
        {
            "clients": args.clients,
            "writes": len(ours),
            "gap_ms": args.gap_ms,
            "slow_clients_dropped": got["slow_dropped"],
            "events_seen": got["events_seen"],
        },
    )
