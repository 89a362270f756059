"""``hivemesh join TOKEN``: join the swarm of the node that issued TOKEN.

The local daemon must be running (``hivemesh up``). It verifies the token,
dials the inviter and proves it holds the token; the command waits (up to
``--timeout-s``) until the inviter admits this node -- then membership
introduces the rest of the swarm -- or refuses it, and says why. Surrounding
whitespace (a copy-paste artifact) is ignored; the token itself must be in
its one canonical form.

Exit codes name the outcome, as for every command
(:mod:`hivemesh.client.cli`; ``--json`` prints ``{"error": {type, code,
message, exit}}`` on failure, as every command does):

==  ==========================================================================
0   joined
1   another failure
3   no daemon is running on the data dir
10  the token is not a valid invite (malformed, not canonical, bad signature)
11  the invite expired (``invite_expired``)
12  the invite was already used by another node (``invite_used``)
13  the inviter holds no such invite: foreign, forged or forgotten (``invite_unknown``)
14  the inviter refuses this node (``invite_revoked``, or ``unknown_peer`` in the handshake)
15  no endpoint in the token answers as the inviter (``identity_mismatch``)
16  no answer from the inviter in time (``deadline_exceeded``)
==  ==========================================================================
"""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.client.cli import add_common, run_command
from hivemesh.commands import Join


def register(sub: Any) -> None:
    """Add the ``join`` subcommand."""
    p = sub.add_parser(
        "join",
        help="join a swarm with an invite token (waits for the inviter's answer)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("token")
    p.add_argument(
        "--timeout-s", type=float, default=30.0, help="wait this long for the inviter (default 30)"
    )
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_command(
        args,
        Join(token=args.token.strip(), timeout_s=args.timeout_s),
        lambda r: (
            f"joined through {r['inviter']} at {', '.join(r['endpoints'])} in {r['seconds']:.1f} s"
        ),
        timeout_s=args.timeout_s,
    )
