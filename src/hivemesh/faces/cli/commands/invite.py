"""``hivemesh invite``: print a single-use token another node joins with."""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.client.cli import add_common, run_command
from hivemesh.commands import Invite


def register(sub: Any) -> None:
    """Add the ``invite`` subcommand."""
    p = sub.add_parser("invite", help="make a single-use invite token for a new node")
    p.add_argument("--ttl-s", type=int, default=3600, help="token lifetime (default 1 h)")
    p.add_argument(
        "--swarm", help="the swarm to bring the new node into (default: this node's home swarm)"
    )
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_command(
        args,
        Invite(ttl_s=args.ttl_s, swarm=args.swarm or None),
        lambda r: f"{r['token']}\n\non the new node: hivemesh join {r['token'][:16]}…",
    )
