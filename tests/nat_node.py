"""A node of the NAT traversal tests, run inside a lab host (``python tests/nat_node.py``).

Roles: ``relay`` serves relay channels and writes every forwarded payload to
``--tap``; ``node`` keeps a reservation at the relay, echoes ``SEQ n`` with
``ACK n`` on every channel it accepts, and with ``--peer`` opens a relayed
channel to that peer, punches, and sends a numbered message every 10 ms over
its best path (punched over relayed), re-sending what was not acknowledged
after a path change. Both print one JSON status line every 200 ms; ``stop``
on stdin ends them (a deadline ends them anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from hivemesh.core.identity import Identity
from hivemesh.errors import HivemeshError
from hivemesh.transports import SecureChannel
from hivemesh.transports.quic import QuicEndpoint
from hivemesh.transports.relay import RelayService
from hivemesh.transports.relay_policy import RelayLimits, RelayTable
from hivemesh.transports.traversal import Traversal


def ident(name: str) -> Identity:
    return Identity.from_seed(name.encode().ljust(32, b"."))


def emit(obj: object) -> None:
    print(json.dumps(obj), flush=True)


async def stopped(deadline_s: float) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with asyncio.timeout(deadline_s):
        while (await reader.readline()).strip() not in (b"stop", b""):
            pass


async def relay(args: argparse.Namespace) -> None:
    tap = open(args.tap, "ab")  # noqa: SIM115 - closed below
    service = RelayService(RelayTable(RelayLimits()), tap=tap.write)

    async def no_nodes(ch: SecureChannel) -> None:
        ch.close()

    ep = await QuicEndpoint.open(
        "0.0.0.0",
        args.port,
        ident(args.name),
        authorize=lambda a: True,
        on_channel=no_nodes,
        on_relay_channel=service.handle,
    )
    emit({"ready": True, "address": ident(args.name).address})

    async def report() -> None:
        while True:
            tap.flush()
            emit({"relay": service.counters, "endpoint": ep.counters.snapshot()})
            await asyncio.sleep(0.2)

    task = asyncio.create_task(report())
    try:
        await stopped(args.deadline)
    finally:
        task.cancel()
        tap.close()
        ep.close()


async def node(args: argparse.Namespace) -> None:
    me = ident(args.name)
    channels: dict[str, SecureChannel] = {}
    received: set[int] = set()
    acked: set[int] = set()
    last_ack = [time.monotonic()]
    sent_at: dict[int, float] = {}

    async def serve(ch: SecureChannel) -> None:
        channels[ch.path] = ch
        try:
            while True:
                frame = await ch.recv()
                kind, _, n = frame.partition(b" ")
                if kind == b"SEQ":
                    received.add(int(n.split(b"-")[0]))
                    ch.send_nowait(b"ACK " + n)
                elif kind == b"ACK":
                    acked.add(int(n.split(b"-")[0]))
                    last_ack[0] = time.monotonic()
        except HivemeshError:
            pass
        print(f"channel {ch.path} ended: {ch.close_reason!r}", file=sys.stderr, flush=True)

    def has_direct(peer: str) -> bool:
        return any(p in channels and not channels[p].is_closed for p in ("punched", "udp"))

    ep: QuicEndpoint | None = None

    servers: set[asyncio.Task[None]] = set()

    async def inbound(ch: SecureChannel) -> None:
        channels[ch.path] = ch
        task = asyncio.ensure_future(serve(ch))
        servers.add(task)
        task.add_done_callback(servers.discard)

    ep = await QuicEndpoint.open(
        "0.0.0.0", args.port, me, authorize=lambda a: True, on_channel=lambda ch: trav.inbound(ch)
    )
    trav = Traversal(
        ep,
        me,
        authorize=lambda a: True,
        on_inbound=inbound,
        on_outbound=inbound,
        has_direct=has_direct,
        punch_wait_s=3.0,
    )
    trav.schedule.base_s = 1.0
    trav.schedule.max_s = 4.0
    relay_host, relay_port = args.relay.split(":")
    await trav.add_relay(ident(args.relay_name).address, relay_host, int(relay_port))
    emit({"ready": True, "address": me.address})

    def best() -> SecureChannel | None:
        for path in ("punched", "udp"):
            ch = channels.get(path)
            if ch is not None and not ch.is_closed:
                return ch
        for path, ch in sorted(channels.items()):
            if path.startswith("relay") and not ch.is_closed:
                return ch
        return None

    async def sender() -> None:
        assert args.peer
        await trav.connect_relayed(ident(args.peer).address)
        last_ack[0] = time.monotonic()
        n, last_path = 0, ""
        while True:
            ch = best()
            if ch is None:
                try:
                    await trav.connect_relayed(ident(args.peer).address)
                except HivemeshError:
                    await asyncio.sleep(0.5)
                continue
            if ch.path != last_path:
                last_path = ch.path
                for path, other in list(channels.items()):
                    if other is not ch and path.startswith("relay") and ch.path == "punched":
                        other.close()  # the punched link replaces the relayed one
            now = time.monotonic()
            if now - last_ack[0] > 2.0 and len(sent_at) > len(acked):
                print(f"no ack for 2 s on {ch.path}: closing it", file=sys.stderr, flush=True)
                ch.close()  # silent path: fall back (relay) and punch again
                last_ack[0] = now
                continue
            resend = [k for k, t in sent_at.items() if k not in acked and now - t > 1.0][:50]
            n += 1
            try:
                for k in [*resend, n]:
                    ch.send_nowait(b"SEQ %d-SECRET-PAYLOAD" % k)
                    sent_at[k] = now
            except HivemeshError:
                pass
            trav.tick()
            await asyncio.sleep(0.01)

    async def report() -> None:
        while True:
            b = best()
            emit(
                {
                    "endpoint": ep.counters.snapshot(),
                    "path": b.path if b is not None else None,
                    "paths": sorted(p for p, c in channels.items() if not c.is_closed),
                    "acked": len(acked),
                    "received": len(received),
                    "counters": trav.counters.snapshot(),
                    "observed": trav.observed.candidates(time.monotonic()),
                }
            )
            await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(report())]
    if args.peer:
        tasks.append(asyncio.create_task(sender()))
    try:
        await stopped(args.deadline)
    finally:
        emit({"final": True, "acked": sorted(acked), "received": sorted(received)})
        for t in tasks:
            t.cancel()
        trav.close()
        ep.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["relay", "node"])
    p.add_argument("--name", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--relay", default="")
    p.add_argument("--relay-name", default="c")
    p.add_argument("--peer", default="")
    p.add_argument("--tap", default="/dev/null")
    p.add_argument("--deadline", type=float, default=120.0)
    args = p.parse_args()
    asyncio.run(relay(args) if args.role == "relay" else node(args))


if __name__ == "__main__":
    main()
