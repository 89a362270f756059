"""``hivemesh inbox``: direct messages this node received (oldest first), and the
questions agents escalated to the operator (answer with ``hivemesh answer ID TEXT``).

``--json`` prints the messages as before; ``--questions`` prints only the
open questions (``--json``: a list of ``{id, audit, shop, question, ...}``).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from hivemesh.client.cli import add_common, run_command, run_with_client
from hivemesh.commands import AuditInbox, Inbox


def register(sub: Any) -> None:
    """Add the ``inbox`` subcommand."""
    p = sub.add_parser("inbox", help="list received direct messages")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--take", action="store_true", help="remove the listed messages")
    p.add_argument("--questions", action="store_true", help="only the escalated questions")
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


def _questions_text(qs: list[dict[str, Any]]) -> str:
    if not qs:
        return "no open questions"
    lines = [f"{len(qs)} open question(s) -- answer with: hivemesh answer ID TEXT"]
    lines += [f"  {q['id']}  [{q['shop']}] {q['question']}" for q in qs]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    if args.questions:
        return run_with_client(
            args, lambda c: c.run(AuditInbox()).to_wire()["questions"], _questions_text
        )
    if args.json:
        return run_command(args, Inbox(limit=args.limit, remove=args.take), _text)

    def both(c: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        qs = c.run(AuditInbox()).to_wire()["questions"]
        return qs, c.run(Inbox(limit=args.limit, remove=args.take)).to_wire()

    def text(got: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> str:
        qs, msgs = got
        return (_questions_text(qs) + "\n" if qs else "") + _text(msgs)

    return run_with_client(args, both, text)
