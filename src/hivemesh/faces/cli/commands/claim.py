"""``hivemesh claim take|wait|release|done|show RESOURCE``: optimistic claims.

A claim is intent registered in the journal: the earliest ``(hlc, author)``
live claim wins once older than the settle window; a claim of a member that
failure detection marks down is released. ``take`` registers (and, with
``--wait-s``, waits for the decision); exit code 0 when this node won,
5 when another node did (the exit codes of every command:
:mod:`hivemesh.client.cli`)::

    hivemesh claim take report-42 --wait-s 3 && run-the-work && hivemesh claim done report-42
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from hivemesh.client.cli import EXIT_LOST, add_common, run_with_client
from hivemesh.commands import (
    Claim,
    ClaimDone,
    ClaimRelease,
    ClaimShow,
    ClaimWait,
    ClaimWaitReply,
)

if TYPE_CHECKING:
    from hivemesh.client.blocking import Client


def register(sub: Any) -> None:
    """Add the ``claim`` subcommand."""
    p = sub.add_parser("claim", help="optimistic claims on work (journal, settle window)")
    add_common(p)
    csub = p.add_subparsers(dest="claim_cmd", metavar="ACTION", required=True)
    for name, help_ in (
        ("take", "register a claim on RESOURCE"),
        ("wait", "wait until the claim on RESOURCE is decided"),
        ("release", "release this node's claim on RESOURCE"),
        ("done", "report RESOURCE finished"),
        ("show", "show the claim state of RESOURCE"),
    ):
        c = csub.add_parser(name, help=help_)
        c.add_argument("resource")
        if name in ("take", "wait"):
            c.add_argument("--wait-s", type=float, default=0.0 if name == "take" else 5.0)
        add_common(c)
        c.set_defaults(func=_run)


def _act(client: Client, args: argparse.Namespace) -> tuple[int, Any]:
    r = args.resource
    cmd = args.claim_cmd
    if cmd in ("take", "wait"):
        out: dict[str, Any] = {}
        if cmd == "take":
            out = client.run(Claim(resource=r)).to_wire()
        if args.wait_s > 0:
            won = client.run(ClaimWait(resource=r, timeout_s=args.wait_s))
            assert isinstance(won, ClaimWaitReply)
            return (0 if won.ours else EXIT_LOST), won.to_wire()
        return 0, out
    request = {"release": ClaimRelease, "done": ClaimDone, "show": ClaimShow}[cmd](resource=r)
    return 0, client.run(request).to_wire()


def _run(args: argparse.Namespace) -> int:
    rc = 0

    def go(client: Client) -> Any:
        nonlocal rc
        rc, out = _act(client, args)
        return out

    code = run_with_client(args, go, lambda o: " ".join(f"{k}={v}" for k, v in sorted(o.items())))
    return code or rc
