"""The audit's commands are reachable from the CLI (they were left out of
the explicit subcommand table once: ``hivemesh audit node`` could not start)."""

from __future__ import annotations

import pkgutil

from hivemesh.faces.cli import SUBCOMMANDS, build_parser
from hivemesh.faces.cli import commands as command_modules


def test_every_command_module_is_a_subcommand() -> None:
    modules = {m.name for m in pkgutil.iter_modules(command_modules.__path__)}
    assert modules <= set(SUBCOMMANDS.values())
    assert {"audit", "answer", "demo", "inbox", "fixture", "webtools"} <= set(SUBCOMMANDS)


def test_the_audit_command_lines_parse() -> None:
    p = build_parser("audit")
    got = p.parse_args(["audit", "node", "--role", "executor", "--notes-tool", "m.t"])
    assert (got.role, got.notes_tool, got.window) == ("executor", "m.t", 3)
    assert build_parser("answer").parse_args(["answer", "q-1", "12", "34"]).text == ["12", "34"]
    assert build_parser("demo").parse_args(["demo", "mesh", "--nodes", "4"]).which == "mesh"
    assert build_parser("demo").parse_args(["demo"]).which == "audit"
