"""One raw JetStream client process for ``bench fanout --mode nats`` (``python -m``).

The baseline of broker mode: a nats-py connection to the same nats-server,
one event per JetStream message on the stream ``--stream`` (subject
``<stream>.events``). Receivers read with an ordered push consumer
(delivering new messages from when they start, or, with ``--replay``, the
whole stream from its first message: the late joiner's baseline). The
publisher publishes each message with its acknowledgement awaited, up to a
window of ``--window`` publishes in flight (JetStream's usual async publish).

Ops as for :mod:`hivemesh.bench._fanout_node`; ``status`` also reports when
the process started (``start_ns``), so a replay's rate counts its consumer's
whole start.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from typing import Any

import nats
from nats.js.api import DeliverPolicy

from hivemesh.bench._fanout_wire import Receipts, body, burst, decode, encode, serve_stdio

START_NS = time.time_ns()


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _main(args: argparse.Namespace) -> None:
    me: int = args.index
    receipts = Receipts(me)
    errors: list[str] = []
    subject = f"{args.stream}.events"

    async def on_error(exc: Exception) -> None:
        errors.append(f"{type(exc).__name__}: {exc}"[:200])

    nc = await nats.connect(
        args.url, connect_timeout=5, max_reconnect_attempts=0, error_cb=on_error
    )
    js = nc.jetstream(timeout=10.0)

    async def on_msg(msg: Any) -> None:
        try:
            receipts.record(decode(msg.data))
        except ValueError:
            receipts.malformed += 1

    policy = DeliverPolicy.ALL if args.replay else DeliverPolicy.NEW
    await js.subscribe(
        subject, cb=on_msg, ordered_consumer=True, deliver_policy=policy, stream=args.stream
    )

    async def status(req: dict[str, Any]) -> dict[str, Any]:
        return {"connected": nc.is_connected, "start_ns": START_NS}

    async def send(phase: str, first: int, stop: int, t: int) -> None:
        for lo in range(first, stop, args.window):
            hi = min(stop, lo + args.window)
            await asyncio.gather(
                *(js.publish(subject, encode(body(me, phase, j, t))) for j in range(lo, hi))
            )

    async def publish(req: dict[str, Any]) -> dict[str, Any]:
        return await burst(req, send, asyncio.sleep)

    async def report(req: dict[str, Any]) -> dict[str, Any]:
        return {
            **receipts.report(str(req["phase"]), samples=bool(req.get("samples", True))),
            "cpu_s": _cpu_s(),
            "dropped_total": 0,
            "counters": {"errors": len(errors)},
        }

    try:
        await serve_stdio(
            {"status": status, "publish": publish, "report": report},
            {"url": args.url, "start_ns": START_NS},
        )
    finally:
        await nc.close()


def main() -> None:
    """Parse the worker's arguments and serve until told to stop."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--url", default="nats://127.0.0.1:4222")
    p.add_argument("--stream", required=True)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--replay", action="store_true")
    args = p.parse_args()
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
