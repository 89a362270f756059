"""A process of ``hivemesh bench paths`` (run inside a lab host, or on loopback).

``relay``: a QUIC endpoint serving relay channels. ``server``: echoes every
frame on TCP+Noise, direct QUIC and channels relayed to it. ``client``:
measures each path to the server and prints one JSON line of results.
Each prints ``ready`` once listening; ``stop`` on stdin (or EOF) ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from hivemesh.core.identity import Identity
from hivemesh.errors import ConnectionClosed
from hivemesh.transports import SecureChannel, connect, serve
from hivemesh.transports.quic import QuicEndpoint
from hivemesh.transports.relay import RelayClient, RelayService
from hivemesh.transports.relay_policy import RelayLimits, RelayTable

RELAY = Identity.from_seed(b"r" * 32)
SERVER = Identity.from_seed(b"s" * 32)
CLIENT = Identity.from_seed(b"c" * 32)


def _trust(address: str) -> bool:
    return True


async def _echo(channel: SecureChannel) -> None:
    try:
        while True:
            for frame in await channel.recv_batch():
                channel.send_nowait(frame)
    except ConnectionClosed:
        pass


async def _until_stop() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with asyncio.timeout(600):
        while (await reader.readline()).strip() not in (b"stop", b""):
            pass


async def _latency(ch: SecureChannel, rounds: int, max_s: float) -> list[float]:
    frame = b"p" * 200
    out: list[float] = []
    deadline = time.perf_counter() + max_s
    for _ in range(rounds):
        t0 = time.perf_counter()
        await ch.send(frame)
        await ch.recv()
        out.append((time.perf_counter() - t0) * 1000)
        if time.perf_counter() > deadline:
            break
    return out


async def _throughput(ch: SecureChannel, frames: int) -> float:
    frame = b"t" * 1024
    t0 = time.perf_counter()

    async def send() -> None:
        for _ in range(frames):
            await ch.send(frame)

    async def recv() -> None:
        got = 0
        while got < frames:
            got += len(await ch.recv_batch())

    await asyncio.gather(send(), recv())
    return frames / (time.perf_counter() - t0)


async def _measure(ch: SecureChannel, args: argparse.Namespace) -> dict[str, float]:
    await _latency(ch, 50, 5.0)  # warm up
    lat = sorted(await _latency(ch, args.rounds, args.max_s))
    rate = await _throughput(ch, args.frames)
    return {
        "p50_ms": statistics.median(lat),
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "rounds": len(lat),
        "frames_per_s": rate,
    }


async def main(args: argparse.Namespace) -> None:
    if args.role == "relay":
        service = RelayService(RelayTable(RelayLimits(bytes_per_s=1 << 30, burst_bytes=1 << 26)))
        ep = await QuicEndpoint.open(
            "0.0.0.0",
            args.port,
            RELAY,
            authorize=_trust,
            on_channel=_echo,
            on_relay_channel=service.handle,
        )
        print(json.dumps({"ready": True}), flush=True)
        await _until_stop()
        ep.close()
        return
    if args.role == "server":
        listener = await serve("0.0.0.0", args.port, SERVER, authorize=_trust, on_channel=_echo)
        ep = await QuicEndpoint.open(
            "0.0.0.0", args.port, SERVER, authorize=_trust, on_channel=_echo
        )
        rc = RelayClient(
            ep, SERVER, RELAY.address, (args.relay, args.port), authorize=_trust, on_channel=_echo
        )
        await rc.start()
        print(json.dumps({"ready": True}), flush=True)
        await _until_stop()
        rc.close()
        ep.close()
        listener.close()
        return
    ep = await QuicEndpoint.open("0.0.0.0", 0, CLIENT, authorize=_trust, on_channel=_echo)
    results = {}
    tcp = await connect(args.server, args.port, CLIENT, authorize=_trust)
    results["tcp"] = await _measure(tcp, args)
    tcp.close()
    quic = await ep.dial(args.server, args.port, expect_address=SERVER.address)
    results["quic"] = await _measure(quic, args)
    quic.close()
    rc = RelayClient(
        ep, CLIENT, RELAY.address, (args.relay, args.port), authorize=_trust, on_channel=_echo
    )
    await rc.start(reserve=False)
    relayed, _ = await rc.open(SERVER.address)
    results["relayed"] = await _measure(relayed, args)
    relayed.close()
    rc.close()
    ep.close()
    print(json.dumps({"results": results}), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["relay", "server", "client"])
    p.add_argument("--port", type=int, default=4500)
    p.add_argument("--relay", default="127.0.0.1")
    p.add_argument("--server", default="127.0.0.1")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--frames", type=int, default=20000)
    p.add_argument("--max-s", type=float, default=20.0)
    asyncio.run(main(p.parse_args()))
