"""``hivemesh call COMMAND [FIELD=VALUE ...]``: any command of the table.

Every command of :data:`hivemesh.commands.COMMANDS` is reachable here by its
wire name, with its fields as ``FIELD=VALUE`` (a text field takes VALUE as
is; any other field takes it as JSON)::

    hivemesh call status
    hivemesh call lease.voters --json
    hivemesh call ctx.set key=goal value='"ship it"'
    hivemesh call events.watch kinds='["app.note"]' --idle-timeout-s 5

The daemon validates the request exactly as it does for every face; errors
and exit codes are those of every command (:mod:`hivemesh.client.cli`).
A streaming command prints one JSON line per event until ``--idle-timeout-s``
passes without one, or the daemon goes away.
"""

from __future__ import annotations

import argparse
import json
import typing
from typing import Any

from hivemesh.client.cli import add_common, data_dir_of, emit, emit_error
from hivemesh.commands import COMMANDS
from hivemesh.errors import HivemeshError, InvalidArgument


def register(sub: Any) -> None:
    """Add the ``call`` subcommand."""
    p = sub.add_parser(
        "call",
        help="run any command of the node's table by its wire name",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("op", metavar="COMMAND", choices=sorted(COMMANDS), help="its wire name")
    p.add_argument("fields", nargs="*", metavar="FIELD=VALUE")
    p.add_argument("--timeout-s", type=float, default=None, help="the client's deadline")
    p.add_argument("--idle-timeout-s", type=float, default=None, help="end a stream after")
    add_common(p)
    p.set_defaults(func=_run)


def parse_fields(op: str, items: list[str]) -> dict[str, Any]:
    """The request's ``args`` from ``FIELD=VALUE`` words (see module docs)."""
    hints = typing.get_type_hints(COMMANDS[op])
    out: dict[str, Any] = {}
    for item in items:
        name, eq, raw = item.partition("=")
        if not eq or not name:
            raise InvalidArgument(f"{item!r} is not FIELD=VALUE")
        if hints.get(name) is str:
            out[name] = raw
            continue
        try:
            out[name] = json.loads(raw)
        except ValueError:
            out[name] = raw  # not JSON: text (the daemon says if that is wrong)
    return out


def _run(args: argparse.Namespace) -> int:
    from hivemesh.client.blocking import Client

    try:
        fields = parse_fields(args.op, args.fields)
        client = Client(data_dir_of(args), timeout_s=args.timeout_s or 10.0)
        if COMMANDS[args.op].stream:
            for event in client.stream(args.op, idle_timeout_s=args.idle_timeout_s, **fields):
                print(json.dumps(event, sort_keys=True), flush=True)
            return 0
        timeout_s = fields.pop("timeout_s", args.timeout_s)
        result = client.call(args.op, timeout_s=timeout_s, **fields)
    except HivemeshError as exc:
        return emit_error(args, exc)
    emit(args, result, lambda r: json.dumps(r, indent=2, sort_keys=True))
    return 0
