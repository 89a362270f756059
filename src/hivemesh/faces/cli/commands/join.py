"""``hivemesh join TOKEN``: join the swarm of the node that issued TOKEN.

The local daemon must be running (``hivemesh up``). It verifies the token,
trusts the inviter, dials it and proves it holds the token; the inviter then
trusts this node, and membership introduces the rest of the swarm.
"""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.runtime.cliutil import add_common, run_with_client


def register(sub: Any) -> None:
    """Add the ``join`` subcommand."""
    p = sub.add_parser("join", help="join a swarm with an invite token")
    p.add_argument("token")
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_with_client(
        args,
        lambda c: c.call("join", token=args.token),
        lambda r: f"joining via {r['inviter'][:16]} at {', '.join(r['endpoints'])}",
    )
