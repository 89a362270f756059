"""The ``hivemesh`` command line.

Subcommands live one per module in :mod:`hivemesh.faces.cli.commands`; each
module defines ``register(subparsers)`` which adds its parser and sets
``func`` (``(args) -> int`` exit code). :data:`SUBCOMMANDS` lists them
explicitly; :func:`main` imports only the module of the command being run
(every module for ``--help``), so a quick command such as ``hivemesh
status`` loads the client and nothing of the daemon, the simulator or the
LLM providers.

``--data-dir`` and ``--json`` are accepted before the command, after it and
after its action; errors and exit codes are the same for every command
(:mod:`hivemesh.client.cli`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from hivemesh.client.cli import add_common

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

#: Every subcommand and the module of :mod:`hivemesh.faces.cli.commands` that defines it.
SUBCOMMANDS: dict[str, str] = {
    "a2a": "a2a",
    "agent": "agent",
    "alerts": "alerts",
    "answer": "answer",
    "audit": "audit",
    "bench": "bench",
    "call": "call",
    "chaos": "chaos",
    "claim": "claim",
    "ctx": "ctx",
    "dashboard": "dashboard",
    "demo": "demo",
    "feed": "feed",
    "fixture": "fixture",
    "fuzz": "fuzz",
    "inbox": "inbox",
    "init": "init",
    "invite": "invite",
    "join": "join",
    "lease": "lease",
    "mcp": "mcp",
    "metrics": "metrics",
    "name": "name",
    "peers": "peers",
    "ping": "ping",
    "plan": "plan",
    "send-message": "send_message",
    "sim": "sim",
    "status": "status",
    "trust": "trust",
    "up": "up",
    "webtools": "webtools",
}

_PACKAGE = "hivemesh.faces.cli.commands"
#: Options of the top-level parser that take a value.
_VALUED = ("--data-dir",)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors, with ``--json`` on the command
    line, are the one JSON error shape of every command (exit 2)."""

    json_errors = False

    def error(self, message: str) -> NoReturn:
        """Report a usage error (JSON with ``--json``) and exit 2."""
        if not _Parser.json_errors:
            super().error(message)
        from hivemesh.client.cli import error_json
        from hivemesh.errors import InvalidArgument

        exc = InvalidArgument(f"{self.prog}: {message}")
        print(json.dumps(error_json(exc), sort_keys=True))
        sys.exit(2)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every subcommand (or only ``only``)."""
    parser = _Parser(
        prog="hivemesh", description="Leaderless coordination fabric for teams of AI agents."
    )
    add_common(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in [only] if only is not None else sorted(SUBCOMMANDS):
        importlib.import_module(f"{_PACKAGE}.{SUBCOMMANDS[name]}").register(sub)
    return parser


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` runs, if it names one (skipping top-level options)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _VALUED:
            i += 2
        elif arg.startswith("--data-dir=") or arg == "--json":
            i += 1
        else:
            return arg if arg in SUBCOMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse ``argv`` and run the chosen subcommand."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = "--json" in argv
    parser = build_parser(_chosen(argv))
    args = parser.parse_args(argv)
    for name, default in (("data_dir", None), ("json", False)):  # options are suppressed
        if not hasattr(args, name):
            setattr(args, name, default)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code: int = func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
