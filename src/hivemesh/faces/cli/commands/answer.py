"""``hivemesh answer ID TEXT``: answer a question an agent escalated.

The open questions are listed by ``hivemesh inbox``. The answer is appended
to the node's journal (``audit.answer``) and reaches every agent; an id no
audit asked is refused (``unknown_escalation``). See :mod:`hivemesh.audit.ops`.
"""

from __future__ import annotations

import argparse
from typing import Any

from hivemesh.client.cli import add_common, run_command
from hivemesh.commands import AuditAnswer

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``answer`` subcommand."""
    p = sub.add_parser("answer", help="answer an escalated question (see `hivemesh inbox`)")
    p.add_argument("id", help="the question's id (q-...)")
    p.add_argument("text", nargs="+", help="the answer")
    add_common(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    text = " ".join(args.text)
    return run_command(
        args, AuditAnswer(id=args.id, text=text), lambda r: f"answered {r['answered']}"
    )
