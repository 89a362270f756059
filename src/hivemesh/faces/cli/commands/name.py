"""``hivemesh name claim NAME`` / ``hivemesh name list``."""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.client.cli import add_common, run_command
from hivemesh.commands import NameClaim, Names


def register(sub: Any) -> None:
    """Add the ``name`` subcommand."""
    p = sub.add_parser("name", help="claim or list human names")
    add_common(p)
    nsub = p.add_subparsers(dest="name_cmd", metavar="ACTION", required=True)
    c = nsub.add_parser("claim", help="claim NAME for this node")
    c.add_argument("name")
    add_common(c)
    c.set_defaults(func=_claim)
    ls = nsub.add_parser("list", help="every claimed name and its owner")
    add_common(ls)
    ls.set_defaults(func=_list)


def _claim(args: argparse.Namespace) -> int:
    def text(r: dict[str, Any]) -> str:
        if r["ours"]:
            return f"claimed {r['name']}"
        return f"{r['name']} is held by {r['owner']} (an earlier claim wins)"

    return run_command(args, NameClaim(name=args.name), text)


def _list(args: argparse.Namespace) -> int:
    return run_command(
        args,
        Names(),
        lambda r: "\n".join(f"{n:<24} {a}" for n, a in sorted(r.items())) or "no names",
    )
