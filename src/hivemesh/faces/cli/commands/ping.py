"""``hivemesh ping ADDRESS``: round-trip time to a connected peer."""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.client.cli import add_common, run_command
from hivemesh.commands import Ping


def register(sub: Any) -> None:
    """Add the ``ping`` subcommand."""
    p = sub.add_parser("ping", help="measure the round trip to a peer")
    p.add_argument("address", help="address or name of a connected peer")
    p.add_argument("--timeout-s", type=float, default=5.0)
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_command(
        args,
        Ping(address=args.address, timeout_s=args.timeout_s),
        lambda r: f"pong from {r['address'][:16]}: {r['rtt_ms']:.1f} ms",
    )
