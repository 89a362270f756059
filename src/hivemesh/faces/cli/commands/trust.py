"""``hivemesh trust list|revoke|add``: who may connect and write.

With a running daemon the change applies at once (a revoked peer is
disconnected and the revocation is published to the swarm; an added one is
brought into this node's home swarm, as an invite would). Without one,
``trust.json`` is edited directly and the change applies at the next start:
the address is trusted by this node alone, not vouched for in its swarm.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from hivemesh.client.cli import add_common, data_dir_of, emit, emit_error, run_command
from hivemesh.commands import TrustAdmit, TrustList, TrustRevoke
from hivemesh.core.identity import public_key_of
from hivemesh.errors import DaemonNotRunning, HivemeshError, InvalidAddress, InvalidArgument


def register(sub: Any) -> None:
    """Add the ``trust`` subcommand."""
    p = sub.add_parser("trust", help="list, add or revoke trusted addresses")
    add_common(p)
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
        lines += [f"swarm {s}" for s in r.get("swarms", [])]
        lines += [f"trusted {a}" for a in r["trusted"]]
        lines += [f"revoked {a}" for a in r["revoked"]]
        return "\n".join(lines)

    return run_command(args, TrustList(), text)


def _change(args: argparse.Namespace, op: str, key: str, offline: Callable[[Any], None]) -> int:
    from hivemesh.client.blocking import Client

    try:
        public_key_of(args.address)
    except InvalidAddress as exc:
        return emit_error(args, InvalidArgument(str(exc)))
    try:
        request = TrustRevoke(args.address) if op == "trust.revoke" else TrustAdmit(args.address)
        result = Client(data_dir_of(args)).run(request).to_wire()
    except DaemonNotRunning:
        result = None
    except HivemeshError as exc:
        return emit_error(args, exc)
    if result is None:
        from hivemesh.trust import TrustStore

        try:
            offline(TrustStore(data_dir_of(args)))
        except HivemeshError as exc:
            return emit_error(args, exc)
        result = {key: args.address, "offline": True}
    emit(
        args,
        result,
        lambda r: (
            f"{key} {r[key]}"
            + (" (daemon not running: trust.json updated)" if r.get("offline") else "")
        ),
    )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    now_s = int(time.time())
    return _change(args, "trust.revoke", "revoked", lambda t: t.revoke(args.address, now_s))


def _add(args: argparse.Namespace) -> int:
    now_s = int(time.time())
    return _change(args, "trust.admit", "trusted", lambda t: t.add(args.address, now_s))
