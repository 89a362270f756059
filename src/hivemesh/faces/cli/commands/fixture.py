"""``hivemesh fixture shops``: serve the 50-shop fixture world on loopback.

Prints one line (``--json``: an object) with the shops' URL, the proxy
routes, the market database, the ground-truth file and the operator's access
code for the human-only shop, then serves until SIGINT/SIGTERM. See
:mod:`hivemesh.audit.server`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``fixture`` subcommand."""
    p = sub.add_parser("fixture", help="serve a local fixture world (the 50 shops)")
    fsub = p.add_subparsers(dest="fixture_cmd", metavar="WORLD", required=True)
    s = fsub.add_parser("shops", help="the 50-shop price-audit world")
    s.add_argument("--seed", type=int, default=7, help="the world's seed (default 7)")
    s.add_argument("--shops", type=int, default=50)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0, help="origin port (default: ephemeral)")
    s.add_argument("--out", default=None, help="directory for ground-truth.json")
    s.add_argument("--slow-ms", type=int, default=1500, help="mean delay of the slow shops")
    s.add_argument("--flaky-rate", type=float, default=0.35, help="failure rate of flaky shops")
    s.add_argument("--json", action="store_true", help="print the ready line as JSON")
    s.set_defaults(func=_shops)


def _shops(args: argparse.Namespace) -> int:
    from hivemesh.audit.server import FixtureServer
    from hivemesh.audit.world import WorldOptions, build_world

    try:
        opts = WorldOptions(shops=args.shops, slow_ms=args.slow_ms, flaky_rate=args.flaky_rate)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    world = build_world(args.seed, opts)

    async def serve() -> int:
        server = FixtureServer(world, host=args.host, port=args.port, out_dir=args.out)
        try:
            await server.start()
        except OSError as exc:
            print(f"error: cannot listen on {args.host}:{args.port}: {exc}")
            return 1
        human = next(s.id for s in world.shops if "human-only" in s.behaviours)
        ready = {
            "url": server.url,
            "routes": server.routes,
            "market": server.market_url,
            "ground_truth": str(server.ground_truth_path),
            "operator": {"shop": human, "code": world.operator_code()},
            "seed": args.seed,
        }
        if args.json:
            print(json.dumps(ready, sort_keys=True), flush=True)
        else:
            print(f"shops: {server.url}/  ({len(world.shops)} shops, seed {args.seed})")
            for name, url in server.routes.items():
                print(f"route {name}: {url or 'direct'}")
            print(f"market database: {server.market_url}")
            print(f"ground truth: {server.ground_truth_path}")
            print(f"operator: the access code of {human} is {world.operator_code()}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await server.close()
        return 0

    return asyncio.run(serve())
