"""The MCP tool table: one command of the node's table per tool, schemas from
the commands' fields, and every refusal typed (nothing reaches a node here)."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from hivemesh.client.aio import AsyncClient
from hivemesh.commands import COMMANDS
from hivemesh.errors import (
    InputTooDeep,
    InputTooLarge,
    InvalidArgument,
    InvalidEncoding,
    UnknownCommand,
)
from hivemesh.faces.mcp.server import MAX_ARGUMENT_BYTES, MeshMcp
from hivemesh.faces.mcp.tools import TOOLS, WATCH_TOOL
from hivemesh.runtime.handlers import HANDLERS, STREAMS

FACE = MeshMcp(AsyncClient("/nonexistent/hivemesh-test"))


def test_every_tool_is_one_command_of_the_table() -> None:
    names = [t.name for t in FACE.tools()]
    assert len(names) == len(set(names)) == len(TOOLS) + 1
    for spec in TOOLS:
        assert COMMANDS[spec.command.op] is spec.command
        assert spec.command in HANDLERS  # a request-reply command
    assert WATCH_TOOL.command in STREAMS
    for tool in FACE.tools():
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        assert tool.description and "(command " in tool.description


def test_schemas_accept_what_the_commands_accept() -> None:
    schemas = {t.name: t.input_schema for t in FACE.tools()}
    good: dict[str, dict[str, Any]] = {
        "ctx_set": {"key": "k", "value": {"any": ["json", 1, None]}, "context": "c"},
        "ctx_append": {"list": "chat", "values": ["hi", 2]},
        "ctx_incr": {"counter": "n", "by": -1.5},
        "lease_acquire": {"resource": "r", "holder": "h", "ttl_ms": 1000},
        "metrics_record": {"name": "m", "value": 2, "attrs": {"model": "x"}},
        "plan_show": {"goal": None},
    }
    for name, args in good.items():
        jsonschema.validate(args, schemas[name])
        FACE.request_of(name, args)  # and the command table takes them
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"key": 5, "value": 1}, schemas["ctx_set"])


def test_refusals_are_typed() -> None:
    deep: Any = "x"
    for _ in range(5000):
        deep = [deep]
    cases: list[tuple[Any, Any, type[Exception]]] = [
        ("nope", {}, UnknownCommand),
        (None, {}, UnknownCommand),
        ("ctx_set", [1, 2], InvalidArgument),
        ("ctx_set", {"key": "k", "value": deep}, InputTooDeep),
        ("ctx_set", {"key": "k", "value": "v" * (MAX_ARGUMENT_BYTES + 1)}, InputTooLarge),
        ("ctx_set", {"key": "k", "value": float("nan")}, InvalidArgument),
        ("ctx_set", {"key": "k", "value": "\udc80"}, InvalidEncoding),
        ("ctx_set", {"key": "k", "value": {1: 2}}, InvalidArgument),
        ("ctx_set", {"key": "k"}, InvalidArgument),
        ("ctx_watch", {"timeout_s": True}, InvalidArgument),
        ("ctx_watch", {"timeout_s": 0}, InvalidArgument),
        ("ctx_append", {"list": "l", "values": []}, InvalidArgument),
    ]
    for name, args, kind in cases:
        with pytest.raises(kind):
            FACE.request_of(name, args)
