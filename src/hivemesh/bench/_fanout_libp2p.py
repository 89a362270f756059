"""One py-libp2p gossipsub peer for ``bench fanout`` (the original design's engine).

Run as a script by the interpreter of the optional venv that
``scripts/bench-env.sh`` creates (py-libp2p 0.8.1 is trio-only and does not
mix with an asyncio program); it imports nothing from hivemesh but the
standard-library helpers in ``_fanout_wire.py`` beside it.

Configured for a fair baseline (see ``shared/FACTS.md``): gossipsub v1.1
only, 1 s heartbeat, spam protection off. Its 32-message outbound and
subscription queues drop silently on overflow while ``publish()`` still
succeeds, so the parent counts what arrived; nothing here assumes delivery.

Ops: ``connect`` (dial the given multiaddrs), ``status`` (mesh size of the
topic), ``publish``, ``pace``, ``report`` -- as for the other workers.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from typing import Any

import multiaddr  # type: ignore[import-not-found,import-untyped,unused-ignore]
import trio  # type: ignore[import-not-found,import-untyped,unused-ignore]
from _fanout_wire import Receipts, body, burst, decode, encode, paced  # type: ignore[import-not-found,import-untyped,unused-ignore]
from libp2p import new_host  # type: ignore[import-not-found,import-untyped,unused-ignore]
from libp2p.crypto.ed25519 import create_new_key_pair  # type: ignore[import-not-found,import-untyped,unused-ignore]
from libp2p.peer.peerinfo import info_from_p2p_addr  # type: ignore[import-not-found,import-untyped,unused-ignore]
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, GossipSub  # type: ignore[import-not-found,import-untyped,unused-ignore]
from libp2p.pubsub.pubsub import Pubsub  # type: ignore[import-not-found,import-untyped,unused-ignore]
from libp2p.tools.anyio_service.context import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
    background_trio_service,
)

TOPIC = "hivemesh-bench-fanout"


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return float(ru.ru_utime + ru.ru_stime)


async def _main(args: argparse.Namespace) -> None:
    me: int = args.index
    receipts = Receipts(me)
    listen = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
    host = new_host(key_pair=create_new_key_pair(), listen_addrs=[listen])
    router = GossipSub(
        protocols=[PROTOCOL_ID_V11],
        degree=6,
        degree_low=4,
        degree_high=12,
        heartbeat_interval=1,
        spam_protection_enabled=False,
    )
    pubsub = Pubsub(host, router)

    async def receive(sub: Any) -> None:
        while True:
            msg = await sub.get()
            try:
                receipts.record(decode(msg.data))
            except ValueError:
                receipts.malformed += 1

    async def send(phase: str, first: int, stop: int, t: int) -> None:
        for j in range(first, stop):
            await pubsub.publish(TOPIC, encode(body(me, phase, j, t)))

    async def publish(req: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = await burst(req, send, trio.sleep)
        return out

    async def pace(req: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = await paced(req, send, trio.sleep, trio.current_time)
        return out

    async def connect(req: dict[str, Any]) -> dict[str, Any]:
        for a in req["addrs"]:
            with trio.fail_after(20):
                await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(a)))
        return {"connected": len(req["addrs"])}

    async def status(req: dict[str, Any]) -> dict[str, Any]:
        return {"peers": len(pubsub.peers), "mesh": len(router.mesh.get(TOPIC, ()))}

    async def report(req: dict[str, Any]) -> dict[str, Any]:
        rep = receipts.report(str(req["phase"]), samples=bool(req.get("samples", True)))
        return {**rep, "cpu_s": _cpu_s(), "dropped_total": 0, "counters": {}}

    handlers = {
        "connect": connect,
        "status": status,
        "publish": publish,
        "pace": pace,
        "report": report,
    }
    async with (
        host.run(listen_addrs=[listen]),
        trio.open_nursery() as nursery,
        background_trio_service(pubsub),
        background_trio_service(router),
    ):
        await pubsub.wait_until_ready()
        sub = await pubsub.subscribe(TOPIC)
        nursery.start_soon(receive, sub)
        _reply({"ok": True, "maddr": str(host.get_addrs()[0])})
        await _serve(handlers)
        nursery.cancel_scope.cancel()


async def _serve(handlers: dict[str, Any]) -> None:
    """Answer the parent's JSON-line requests until ``stop`` or EOF."""
    stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = await stdin.receive_some(65536)
            if not chunk:
                return
            buf += chunk
        line, _, buf = buf.partition(b"\n")
        try:
            req = json.loads(line)
            if req["op"] == "stop":
                _reply({"ok": True})
                return
            result = await handlers[req["op"]](req)
        except Exception as exc:  # reported to the parent, which fails the run
            _reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        _reply({"ok": True, **result})


def main() -> None:
    """Parse the worker's arguments and serve until told to stop."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--index", type=int, required=True)
    args = p.parse_args()
    trio.run(_main, args)


if __name__ == "__main__":
    main()
