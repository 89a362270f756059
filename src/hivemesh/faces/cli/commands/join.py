"""``hivemesh join TOKEN``: join the swarm of the node that issued TOKEN.

The local daemon must be running (``hivemesh up``). It verifies the token,
dials the inviter and proves it holds the token; the command waits (up to
``--timeout-s``) until the inviter admits this node -- then membership
introduces the rest of the swarm -- or refuses it, and says why. Surrounding
whitespace (a copy-paste artifact) is ignored; the token itself must be in
its one canonical form.

Exit codes name the outcome (``--json`` prints ``{"error": {type, code,
message}}`` on failure, as every command does):

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

from hivemesh.errors import HivemeshError
from hivemesh.runtime.cliutil import add_common, data_dir_of, emit, emit_error

#: Exit code per error code (module docs); any other failure exits 1.
EXIT_CODES: dict[str, int] = {
    "invite_error": 10,
    "invite_malformed": 10,
    "invite_noncanonical": 10,
    "invite_bad_signature": 10,
    "invite_expired": 11,
    "invite_used": 12,
    "invite_unknown": 13,
    "invite_revoked": 14,
    "unknown_peer": 14,
    "identity_mismatch": 15,
    "deadline_exceeded": 16,
}


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
    from hivemesh.runtime.client import Client

    client = Client(data_dir_of(args), timeout_s=args.timeout_s)
    try:
        result = client.call("join", timeout_s=args.timeout_s, token=args.token.strip())
    except HivemeshError as exc:
        code = emit_error(args, exc)
        return EXIT_CODES.get(exc.code, code)
    emit(
        args,
        result,
        lambda r: (
            f"joined through {r['inviter']} at {', '.join(r['endpoints'])} in {r['seconds']:.1f} s"
        ),
    )
    return 0
