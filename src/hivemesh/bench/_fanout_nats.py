"""One NATS core pub/sub client process for ``bench fanout`` (run with ``python -m``).

The baseline's equivalent of a node: a nats-py connection to the real
nats-server on loopback, subscribed to one subject, with ``no_echo`` so a
publisher does not receive its own messages (as a hivemesh node does not
"deliver" its own events). Core NATS is at-most-once: a subscriber that falls
behind is cut off by the server (slow consumer), so delivery is counted
exactly, never assumed.

Ops as for :mod:`hivemesh.bench._fanout_node`.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from typing import Any

import nats
from nats.aio.msg import Msg

from hivemesh.bench._fanout_wire import (
    Receipts,
    body,
    burst,
    decode,
    encode,
    paced,
    serve_stdio,
)

SUBJECT = "hivemesh.bench.fanout"


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _main(args: argparse.Namespace) -> None:
    me: int = args.index
    receipts = Receipts(me)
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(f"{type(exc).__name__}: {exc}"[:200])

    nc = await nats.connect(
        args.url,
        no_echo=True,
        connect_timeout=5,
        max_reconnect_attempts=0,
        error_cb=on_error,
    )

    async def on_msg(msg: Msg) -> None:
        try:
            receipts.record(decode(msg.data))
        except ValueError:
            receipts.malformed += 1

    await nc.subscribe(SUBJECT, cb=on_msg)
    await nc.flush(timeout=5)

    async def status(req: dict[str, Any]) -> dict[str, Any]:
        return {"connected": nc.is_connected}

    async def send(phase: str, first: int, stop: int, t: int) -> None:
        for j in range(first, stop):
            await nc.publish(SUBJECT, encode(body(me, phase, j, t)))

    async def paced_send(phase: str, first: int, stop: int, t: int) -> None:
        await send(phase, first, stop, t)
        await nc.flush(timeout=5)  # hand it to the server now, as hivemesh's flush does

    async def publish(req: dict[str, Any]) -> dict[str, Any]:
        out = await burst(req, send, asyncio.sleep)
        await nc.flush(timeout=30)
        return {**out, "t1_ns": time.time_ns()}

    async def pace(req: dict[str, Any]) -> dict[str, Any]:
        return await paced(req, paced_send, asyncio.sleep, asyncio.get_running_loop().time)

    async def report(req: dict[str, Any]) -> dict[str, Any]:
        return {
            **receipts.report(str(req["phase"]), samples=bool(req.get("samples", True))),
            "cpu_s": _cpu_s(),
            "dropped_total": 0,  # core NATS drops are visible only as missing counts
            "counters": {"errors": len(errors)},
            "errors": errors[-3:],
        }

    try:
        await serve_stdio(
            {"status": status, "publish": publish, "pace": pace, "report": report},
            {"url": args.url},
        )
    finally:
        await nc.close()


def main() -> None:
    """Parse the worker's arguments and serve until told to stop."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--url", default="nats://127.0.0.1:4222")
    args = p.parse_args()
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
