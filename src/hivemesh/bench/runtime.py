"""``hivemesh bench runtime``: journal replication between two full nodes.

Two complete nodes (:class:`hivemesh.Node`: SQLite stores in temporary data
dirs, Noise channels over loopback TCP, SWIM, the asyncio pump) run on one
event loop. Measured, each beside a baseline taken in the same run:

* **throughput** -- node A appends ``--events`` events (batches of
  ``--batch``, signed per batch); the clock stops when node B has verified
  and durably stored all of them. Baseline: the very same encoded event
  bytes sent as frames over one bare secure channel and merely counted by
  the receiver (no signatures, no storage, no pump): the transport's
  ceiling, so the ratio is the share of it the full stack delivers.
* **latency** -- A appends one event at a time and waits until B's event
  subscription yields it (sign, commit, push, verify, commit, dispatch);
  median over ``--pings`` writes. Baseline: the median one-way time (half a
  round trip) of a frame on a bare secure channel.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from hivemesh.bench import BenchResult, Metric
from hivemesh.core.identity import Identity
from hivemesh.errors import ConnectionClosed, WouldBlock
from hivemesh.transports import SecureChannel, connect, serve

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = "replicated events/s and write->visible latency between two full nodes"
HOST = "127.0.0.1"
_FAST: dict[str, Any] = {
    "sync_interval_ms": 500,
    "reconnect_min_s": 0.05,
    "reconnect_max_s": 0.5,
    "trust_mode": "open",  # a loopback bench pair (nodes are private by default)
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--events N``, ``--batch B``, ``--body-bytes S``, ``--pings P``."""
    parser.add_argument("--events", type=int, default=50_000, help="events in the throughput run")
    parser.add_argument("--batch", type=int, default=256, help="events per append_many call")
    parser.add_argument("--body-bytes", type=int, default=100, help="payload bytes per event")
    parser.add_argument("--pings", type=int, default=200, help="writes in the latency run")


async def _nodes_run(args: argparse.Namespace, root: Path) -> tuple[float, float, bytes]:
    from hivemesh.node import Node

    body = {"p": "x" * args.body_bytes}
    async with (
        Node(root / "a", **_FAST) as a,
        Node(root / "b", bootstrap=[a.endpoint], **_FAST) as b,
    ):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while a.address not in b.daemon.conns.links or b.address not in a.daemon.node.peers:
            if loop.time() > deadline:
                raise TimeoutError("nodes did not connect")
            await asyncio.sleep(0.01)
        author = a.daemon.identity.public
        journal_b = b.daemon.node.journal
        base = journal_b.head(author).seq
        # throughput
        start = time.perf_counter()
        remaining = args.events
        sample = b""
        while remaining:
            k = min(args.batch, remaining)
            evs = a.daemon.node.append_many([("bench.event", body)] * k, _now_ms())
            sample = sample or evs[0].raw
            remaining -= k
            await a.daemon.flush()
        target = base + args.events
        while journal_b.head(author).seq < target:
            if loop.time() > deadline + 120:
                raise TimeoutError("replication did not finish")
            await asyncio.sleep(0.001)
        throughput_s = time.perf_counter() - start
        # latency
        sub = b.daemon.subscribe(["bench.ping"])
        lat: list[float] = []
        for i in range(args.pings):
            t0 = time.perf_counter()
            await a.daemon.append("bench.ping", {"i": i})
            while True:
                ev = await asyncio.wait_for(sub.queue.get(), 10)
                if ev.body == {"i": i}:
                    break
            lat.append((time.perf_counter() - t0) * 1000)
        b.daemon.unsubscribe(sub)
    return throughput_s, statistics.median(lat), sample


async def _raw_run(n: int, frame: bytes, pings: int) -> tuple[float, float]:
    a, b = Identity.from_seed(b"\x11" * 32), Identity.from_seed(b"\x12" * 32)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    pong_channel: list[SecureChannel] = []

    async def consume(ch: SecureChannel) -> None:
        pong_channel.append(ch)
        count = 0
        try:
            while count < n:
                count += len(await ch.recv_batch(4096))
            done.set_result(None)
            while True:  # echo for the latency run
                await ch.send(await ch.recv())
        except ConnectionClosed:
            pass

    listener = await serve(HOST, 0, b, authorize=lambda _: True, on_channel=consume)
    ch = await connect(HOST, listener.port, a, authorize=lambda _: True, expect_address=b.address)
    start = time.perf_counter()
    for _ in range(n):
        try:
            ch.send_nowait(frame)
        except WouldBlock:
            await ch.send(frame)
    await asyncio.wait_for(done, 120)
    throughput_s = time.perf_counter() - start
    one_way: list[float] = []
    for _ in range(pings):
        t0 = time.perf_counter()
        await ch.send(frame)
        await asyncio.wait_for(ch.recv(), 10)
        one_way.append((time.perf_counter() - t0) * 1000 / 2)
    ch.close()
    listener.close()
    await listener.wait_closed()
    return throughput_s, statistics.median(one_way)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def run(args: argparse.Namespace) -> BenchResult:
    """Run both variants and compare."""
    with tempfile.TemporaryDirectory(prefix="hivemesh-bench-") as tmp:
        ours_s, ours_lat, frame = asyncio.run(_nodes_run(args, Path(tmp)))
    raw_s, raw_lat = asyncio.run(_raw_run(args.events, frame, args.pings))
    return BenchResult(
        name="runtime",
        metrics=[
            Metric(
                "replicated events/s (stored on B)",
                args.events / ours_s,
                args.events / raw_s,
                "events/s",
                baseline_name="bare channel",
            ),
            Metric(
                "write -> visible on B, p50",
                ours_lat,
                raw_lat,
                "ms",
                baseline_name="bare one-way",
                higher_is_better=False,
            ),
        ],
        details={
            "events": args.events,
            "batch": args.batch,
            "event_bytes": len(frame),
            "pings": args.pings,
            "nodes": "2 full nodes in one process: SQLite, Noise/TCP loopback, SWIM",
        },
    )
