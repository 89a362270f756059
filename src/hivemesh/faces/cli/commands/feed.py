"""``hivemesh feed status|accept-loss``: the node's own feed and its write gate.

A node refuses writes while its store lacks part of its own feed that may
have left it (store deleted, restored from an older copy, damaged append
log), and recovers that part from its peers first (see
:mod:`hivemesh.core.ownfeed`). ``status`` shows why; ``accept-loss`` is the
operator's way on when no peer can supply it: the node writes on from what
its store holds, and any peer that still holds the lost events will see a
fork and refuse the node's new events from there.
"""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.client.cli import add_common, emit_error, run_command
from hivemesh.commands import FeedAcceptLoss, FeedStatus
from hivemesh.errors import InvalidArgument


def register(sub: Any) -> None:
    """Add the ``feed`` subcommand."""
    p = sub.add_parser("feed", help="the node's own feed: status, accept a loss")
    add_common(p)
    fsub = p.add_subparsers(dest="feed_cmd", metavar="ACTION", required=True)
    s = fsub.add_parser("status", help="whether the node writes its feed, and why not")
    add_common(s)
    s.set_defaults(func=_status)
    a = fsub.add_parser(
        "accept-loss",
        help="write on from what the store holds, giving up what no peer could supply",
        description=(
            "Use only when the peers that held the missing part of this node's feed are "
            "gone for good: the node then writes those seqs again with other events, and a "
            "peer that still holds the lost ones will see a fork and refuse the node's "
            "new events from there."
        ),
    )
    a.add_argument("--yes", action="store_true", help="confirm (required)")
    add_common(a)
    a.set_defaults(func=_accept_loss)


def _status_text(st: dict[str, Any]) -> str:
    lines = [f"state     {st['state']}", f"held      #{st['held']}", f"mark      #{st['mark']}"]
    if st["reason"]:
        lines.append(f"why       {st['reason']}")
    if st["accepted_loss"]:
        lost = st["accepted_loss"]
        lines.append(f"accepted  loss of #{lost['from']}..#{lost['upto']} (an operator decided)")
    if st.get("deferred"):
        lines.append(f"deferred  {st['deferred']} own observations wait to be written")
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    return run_command(args, FeedStatus(), _status_text)


def _accept_loss(args: argparse.Namespace) -> int:
    if not args.yes:
        return emit_error(
            args, InvalidArgument("accept-loss gives up part of this node's feed: add --yes")
        )
    return run_command(
        args,
        FeedAcceptLoss(confirm=True),
        lambda r: (
            f"accepted the loss of own feed #{r['lost_from']}..#{r['lost_upto']}; "
            f"writing on from #{r['held'] + 1}"
        ),
    )
