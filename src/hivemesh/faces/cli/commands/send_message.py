"""``hivemesh send-message TO --data JSON``: an acknowledged direct message.

``TO`` is an address or a claimed name. Returns when the receiver has the
message in its inbox (its node acknowledged it); fails with
``deadline_exceeded`` if no acknowledgement came within ``--timeout-s``.

To the name ``metrics-collector`` the message is telemetry: a batch, or a
flat record such as ``{"agent_id": "agent-7", "tokens_used": 1200,
"duration_ms": 3400}`` (see :mod:`hivemesh.telemetry.flat`). It is reported
delivered only once the collector stored it; otherwise the command fails
with the collector's reason (``telemetry_refused``), or ``no_handler`` when
the node holding the name runs no collector.
"""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.client.cli import add_common, emit_error, run_command
from hivemesh.commands import Send
from hivemesh.commands.wire import decode
from hivemesh.errors import InvalidArgument


def register(sub: Any) -> None:
    """Add the ``send-message`` subcommand."""
    p = sub.add_parser("send-message", help="send an acknowledged direct message")
    p.add_argument("to", metavar="TO", help="address or name of the receiver")
    p.add_argument("--data", required=True, help="the message, as JSON")
    p.add_argument("--timeout-s", type=float, default=10.0, help="give up after (default 10)")
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        data = decode(args.data, what="--data")
    except InvalidArgument as exc:  # not JSON, too deep, not UTF-8: typed either way
        return emit_error(args, exc)
    return run_command(args, Send(to=args.to, data=data, timeout_s=args.timeout_s), _text)


def _text(r: dict[str, Any]) -> str:
    if "stored" in r:  # telemetry to metrics-collector
        dup = f", {r['duplicates']} already stored" if r["duplicates"] else ""
        return (
            f"delivered and stored as telemetry by {r['to'][:16]}: {r['stored']}"
            f" record{'s' if r['stored'] != 1 else ''}{dup} in {r['rtt_ms']:.1f} ms"
        )
    return (
        f"delivered {r['msg_id']} to {r['to'][:16]} in {r['rtt_ms']:.1f} ms"
        f" ({r['attempts']} attempt{'s' if r['attempts'] != 1 else ''})"
    )
