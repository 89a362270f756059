"""The CLI's explicit subcommand table names every command module, so a
command added as a module cannot be left unreachable (``hivemesh audit``
was, after the table replaced discovery by import)."""

from __future__ import annotations

import pkgutil

import hivemesh.faces.cli.commands as commands
from hivemesh.faces.cli import SUBCOMMANDS, build_parser


def test_every_command_module_is_in_the_table() -> None:
    found = pkgutil.iter_modules(commands.__path__)
    modules = {m.name for m in found if not m.name.startswith("_")}
    assert modules == set(SUBCOMMANDS.values())


def test_every_subcommand_parses() -> None:
    for name in SUBCOMMANDS:
        parser = build_parser(name)
        assert name in parser.format_help()
