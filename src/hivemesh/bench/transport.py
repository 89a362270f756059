"""``hivemesh bench transport``: secure channel throughput beside raw TCP framing.

Both runs use one asyncio loop, loopback TCP, the same frame size and the
same batching strategy on the sending side (many frames per write and
drain). The baseline is plain length-prefixed frames with no encryption and
no queues: ``u32 length || frame`` written in batches and split out of
256 KiB reads. Ours is :mod:`hivemesh.transports` end to end: bounded send
queue, Noise records (AES-256-GCM), reader task, bounded receive queue, and
the consumer calling ``recv()`` per frame (and, as a second figure,
``recv_batch()``).
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import time
from collections.abc import Awaitable, Callable

from hivemesh.bench import BenchResult, Metric
from hivemesh.core.identity import Identity
from hivemesh.errors import ConnectionClosed, WouldBlock
from hivemesh.transports import SecureChannel, connect, serve

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = "frames/s over one secure channel vs raw length-prefixed asyncio TCP"
HOST = "127.0.0.1"
GOAL_FRAMES_PER_S = 100_000
#: The mesh benchmark needs >= 20k events/s delivered to 10 nodes.
GOAL_FANOUT_EVENTS_PER_S = 20_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--frames N``, ``--frame-bytes B``, ``--rounds R`` (best kept), ``--fanout K``."""
    parser.add_argument("--frames", type=int, default=200_000, help="frames per round")
    parser.add_argument("--frame-bytes", type=int, default=200, help="payload bytes per frame")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per variant (best kept)")
    parser.add_argument("--fanout", type=int, default=10, help="channels in the fan-out run")


async def _raw_round(n: int, frame: bytes, fanout: int = 1) -> float:
    """Seconds to deliver ``n`` frames to each of ``fanout`` plain TCP sinks."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    total = [0]
    unpack = struct.Struct(">I").unpack_from

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        buf = b""
        count = 0
        while count < n:
            data = await reader.read(256 * 1024)
            if not data:
                break
            buf += data
            pos, end = 0, len(buf)
            while end - pos >= 4:
                (size,) = unpack(buf, pos)
                if end - pos - 4 < size:
                    break
                _ = buf[pos + 4 : pos + 4 + size]  # hand the frame over, as a consumer would
                pos += 4 + size
                count += 1
            buf = buf[pos:]
        total[0] += count
        if total[0] == n * fanout and not done.done():
            done.set_result(None)
        writer.close()

    server = await asyncio.start_server(sink, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    writers = [(await asyncio.open_connection(HOST, port))[1] for _ in range(fanout)]
    pack = struct.Struct(">I").pack
    per_batch = max(1, (256 * 1024) // (len(frame) + 4))
    start = time.perf_counter()
    sent = 0
    while sent < n:
        parts: list[bytes] = []
        for _ in range(min(per_batch, n - sent)):  # per-frame work, as a real sender does
            parts.append(pack(len(frame)))
            parts.append(frame)
        data = b"".join(parts)  # serialised once, written to every sink
        for writer in writers:
            writer.write(data)
        sent += len(parts) // 2
        for writer in writers:
            await writer.drain()
    await asyncio.wait_for(done, 120)
    elapsed = time.perf_counter() - start
    for writer in writers:
        writer.close()
    server.close()
    await server.wait_closed()
    return elapsed


async def _channel_round(
    n: int, frame: bytes, *, batch: bool, fanout: int = 1
) -> tuple[float, float]:
    """Seconds to deliver ``n`` frames over each of ``fanout`` secure channels,
    and the best connect+handshake time."""
    a, b = Identity.from_seed(b"\x01" * 32), Identity.from_seed(b"\x02" * 32)
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    total = [0]

    async def consume(ch: SecureChannel) -> None:
        count = 0
        try:
            if batch:
                while count < n:
                    count += len(await ch.recv_batch(4096))
            else:
                recv = ch.recv
                while count < n:
                    await recv()
                    count += 1
        except ConnectionClosed:
            pass
        total[0] += count
        if total[0] == n * fanout and not done.done():
            done.set_result(None)

    on_channel: Callable[[SecureChannel], Awaitable[None]] = consume
    listener = await serve(HOST, 0, b, authorize=lambda _: True, on_channel=on_channel)
    channels = []
    handshake_s = float("inf")
    for _ in range(fanout):
        t0 = time.perf_counter()
        channels.append(
            await connect(
                HOST, listener.port, a, authorize=lambda _: True, expect_address=b.address
            )
        )
        handshake_s = min(handshake_s, time.perf_counter() - t0)
    start = time.perf_counter()
    for _ in range(n):
        for ch in channels:
            try:
                ch.send_nowait(frame)
            except WouldBlock:
                await ch.send(frame)
    await asyncio.wait_for(done, 120)
    elapsed = time.perf_counter() - start
    dropped = sum(ch.statistics().frames_dropped for ch in channels)
    for ch in channels:
        ch.close()
    listener.close()
    await listener.wait_closed()
    assert total[0] == n * fanout and dropped == 0, f"lost frames: {total[0]} of {n * fanout}"
    return elapsed, handshake_s


async def _main(args: argparse.Namespace) -> BenchResult:
    n, frame, rounds, fan = args.frames, b"\xa5" * args.frame_bytes, args.rounds, args.fanout
    raw = min([await _raw_round(n, frame) for _ in range(rounds)])
    per_frame = [await _channel_round(n, frame, batch=False) for _ in range(rounds)]
    batched = [await _channel_round(n, frame, batch=True) for _ in range(rounds)]
    n_fan = max(1, n // fan)
    raw_fan = min([await _raw_round(n_fan, frame, fan) for _ in range(rounds)])
    ours_fan = min(
        [(await _channel_round(n_fan, frame, batch=True, fanout=fan))[0] for _ in range(rounds)]
    )
    ours = min(t for t, _ in per_frame)
    ours_batch = min(t for t, _ in batched)
    hs_ms = 1000 * min(h for _, h in per_frame + batched)
    goal = f">= {GOAL_FRAMES_PER_S:,} frames/s"
    fan_goal = f">= {GOAL_FANOUT_EVENTS_PER_S:,} events/s"
    return BenchResult(
        name="transport",
        metrics=[
            Metric(
                "secure channel, recv() per frame",
                n / ours,
                n / raw,
                "frames/s",
                baseline_name="raw asyncio TCP",
                goal=goal,
                goal_met=n / ours >= GOAL_FRAMES_PER_S,
            ),
            Metric(
                "secure channel, recv_batch()",
                n / ours_batch,
                n / raw,
                "frames/s",
                baseline_name="raw asyncio TCP",
                goal=goal,
                goal_met=n / ours_batch >= GOAL_FRAMES_PER_S,
            ),
            Metric(
                f"fan-out to {fan} channels",
                n_fan / ours_fan,
                n_fan / raw_fan,
                "events/s",
                baseline_name="raw asyncio TCP",
                goal=fan_goal,
                goal_met=n_fan / ours_fan >= GOAL_FANOUT_EVENTS_PER_S,
            ),
        ],
        details={
            "frames_per_round": n,
            "fanout_events_per_round": n_fan,
            "frame_bytes": args.frame_bytes,
            "rounds": rounds,
            "cipher": "Noise_XX_25519_AESGCM_SHA256",
            "connect_plus_handshake_ms": round(hs_ms, 2),
            "note": "one process, all ends on one loop over 127.0.0.1; best of rounds; "
            "an event in the fan-out is one frame delivered on every channel",
        },
    )


def run(args: argparse.Namespace) -> BenchResult:
    """Run the benchmark (both variants in the same process and run)."""
    return asyncio.run(_main(args))
