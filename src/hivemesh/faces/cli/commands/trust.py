"""``hivemesh trust list|revoke|add``: who may connect and write."""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.runtime.cliutil import add_common, run_with_client


def register(sub: Any) -> None:
    """Add the ``trust`` subcommand."""
    p = sub.add_parser("trust", help="list, add or revoke trusted addresses")
    tsub = p.add_subparsers(dest="trust_cmd", metavar="ACTION", required=True)
    ls = tsub.add_parser("list", help="trust mode, trusted and revoked addresses")
    add_common(ls)
    ls.set_defaults(func=_list)
    rv = tsub.add_parser("revoke", help="disconnect ADDRESS and refuse its new events")
    rv.add_argument("address")
    add_common(rv)
    rv.set_defaults(func=_revoke)
    ad = tsub.add_parser("add", help="trust ADDRESS (invite mode) and lift a revocation")
    ad.add_argument("address")
    add_common(ad)
    ad.set_defaults(func=_add)


def _list(args: argparse.Namespace) -> int:
    def text(r: dict[str, Any]) -> str:
        lines = [f"mode: {r['mode']}"]
        lines += [f"trusted {a}" for a in r["trusted"]]
        lines += [f"revoked {a}" for a in r["revoked"]]
        return "\n".join(lines)

    return run_with_client(args, lambda c: c.call("trust.list"), text)


def _revoke(args: argparse.Namespace) -> int:
    return run_with_client(
        args,
        lambda c: c.call("trust.revoke", address=args.address),
        lambda r: f"revoked {r['revoked']}",
    )


def _add(args: argparse.Namespace) -> int:
    return run_with_client(
        args,
        lambda c: c.call("trust.admit", address=args.address),
        lambda r: f"trusted {r['trusted']}",
    )
