"""``hivemesh inbox``: direct messages this node received (oldest first)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from hivemesh.commands import Inbox
from hivemesh.runtime.cliutil import add_common, run_command


def register(sub: Any) -> None:
    """Add the ``inbox`` subcommand."""
    p = sub.add_parser("inbox", help="list received direct messages")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--take", action="store_true", help="remove the listed messages")
    add_common(p)
    p.set_defaults(func=_run)


def _text(msgs: list[dict[str, Any]]) -> str:
    if not msgs:
        return "inbox is empty"
    lines = []
    for m in msgs:
        at = time.strftime("%H:%M:%S", time.localtime(m["received_ms"] / 1000))
        via = f" via {m['relayed_by'][:12]}" if m["relayed_by"] else ""
        lines.append(f"{at} {m['sender'][:16]}{via}: {json.dumps(m['data'], sort_keys=True)}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    return run_command(args, Inbox(limit=args.limit, remove=args.take), _text)
