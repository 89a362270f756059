"""``hivemesh bench mcp``: a tool call through ``hivemesh mcp`` vs the command it runs.

One node process is started (``hivemesh up``), and one ``hivemesh mcp``
process on it, driven over stdio by the official MCP client. Measured in the
same run, interleaved call by call so a busy machine slows both alike:

* ours: the MCP tool call (``ctx_get`` for a read, ``ctx_set`` for a
  write), from the client's call to its result;
* baseline: the same command (``ctx.get`` / ``ctx.set``) sent straight to
  the node's control socket (:class:`~hivemesh.client.aio.AsyncClient`).

The ratio is the MCP layer's cost (JSON-RPC over a pipe, the schema and
argument checks, one more process hop). Also reported: the start of a
``hivemesh mcp`` process until its handshake is done. Goal: a tool call's
median within 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import hivemesh
from hivemesh.bench import BenchResult, Metric
from hivemesh.client.aio import AsyncClient
from hivemesh.client.swarm import LocalSwarm
from hivemesh.commands import CtxGet, CtxSet

DESCRIPTION = "an MCP tool call through `hivemesh mcp` (stdio) vs the same command on the socket"

#: The goal for a tool call's median.
GOAL_MS = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for this benchmark."""
    parser.add_argument("--calls", type=int, default=300, help="calls of each kind (default 300)")
    parser.add_argument(
        "--max-s", type=float, default=60.0, help="stop measuring after this long (default 60)"
    )


def _ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(data_dir: Path, env: dict[str, str], calls: int, max_s: float) -> dict[str, Any]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "hivemesh", "mcp", "--data-dir", str(data_dir)], env=env
    )
    sock = AsyncClient(data_dir)
    out: dict[str, list[float]] = {k: [] for k in ("mcp_get", "sock_get", "mcp_set", "sock_set")}

    async def timed(name: str, call: Awaitable[Any]) -> None:
        t = time.perf_counter()
        res = await call
        out[name].append((time.perf_counter() - t) * 1000)
        if getattr(res, "is_error", False):
            raise RuntimeError(f"{name}: {res.content}")

    t0 = time.perf_counter()
    async with Client(params, read_timeout_seconds=30) as client:
        start_ms = (time.perf_counter() - t0) * 1000
        await client.call_tool("ctx_get", {"context": "bench"})  # warm both paths
        await sock.run(CtxGet(context="bench"))
        deadline = time.monotonic() + max_s
        for i in range(calls):
            if time.monotonic() > deadline:
                break
            value = {"i": i, "text": "x" * 64}
            read = {"context": "bench", "key": "k"}
            await timed("mcp_get", client.call_tool("ctx_get", read))
            await timed("sock_get", sock.run(CtxGet(**read)))
            await timed("mcp_set", client.call_tool("ctx_set", {**read, "value": value}))
            await timed("sock_set", sock.run(CtxSet(**read, value=value)))
    return {"start_ms": start_ms, **out}


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark."""
    with tempfile.TemporaryDirectory(prefix="hm-bench-mcp-") as root, LocalSwarm(root) as swarm:
        node = swarm.start("a")
        env = dict(swarm.env)
        env["PYTHONPATH"] = str(Path(hivemesh.__file__).resolve().parent.parent)
        got = asyncio.run(_measure(node.data_dir, env, args.calls, args.max_s))
    result = BenchResult("mcp")
    for kind, label in (("get", "read"), ("set", "write")):
        ours, base = got[f"mcp_{kind}"], got[f"sock_{kind}"]
        p50 = statistics.median(ours)
        result.metrics.append(
            Metric(
                f"MCP tool call, {label} (median)",
                p50,
                statistics.median(base),
                "ms",
                baseline_name="control socket",
                higher_is_better=False,
                goal=f"<= {GOAL_MS:.0f} ms",
                goal_met=p50 <= GOAL_MS,
            )
        )
        result.details[f"{label}_p99_ms"] = {
            "mcp": round(_ms(ours, 0.99), 2),
            "socket": round(_ms(base, 0.99), 2),
        }
    result.details.update(
        calls=len(got["mcp_get"]),
        mcp_start_and_handshake_ms=round(got["start_ms"], 1),
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    return result
