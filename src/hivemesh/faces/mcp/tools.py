"""The MCP tools of a node: one row per command of the node's command table.

Each :class:`ToolSpec` names one command of :data:`hivemesh.commands.COMMANDS`;
its input schema is built from the command's typed fields
(:func:`input_schema`), its description from the command's docstring, and a
call is ``Command.from_wire(arguments)`` run against the node: the command
table checks the arguments, the node's handler does the work. Nothing here
decides anything about context, plans, claims or leases.

The one tool that is not a single request is ``ctx_watch``: it opens the
command ``ctx.watch`` (a stream), and answers with the state after the next
change, or the current state when ``timeout_s`` passes without one.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hivemesh import commands as c
from hivemesh.commands import Command

__all__ = ["TOOLS", "WATCH_SCHEMA", "WATCH_TOOL", "ToolSpec", "input_schema", "tool_named"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One MCP tool: its name, the command it runs, and a hint for the model."""

    name: str
    command: type[Command]
    hint: str = ""
    read_only: bool = False

    def description(self) -> str:
        """The command's docstring (first paragraph), its wire name and the hint."""
        doc = inspect.getdoc(self.command) or self.command.op
        first = " ".join(doc.split("\n\n")[0].split())
        return " ".join(x for x in (first, self.hint, f"(command {self.command.op})") if x)


_ANY: dict[str, Any] = {}


def _schema_of(tp: Any) -> dict[str, Any]:
    if tp is Any:
        return dict(_ANY)
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = _schema_of(options[0]) if len(options) == 1 else {}
        if "type" in inner:
            return {**inner, "type": [inner["type"], "null"]}
        return inner
    if origin is tuple:
        return {"type": "array", "items": _schema_of(typing.get_args(tp)[0])}
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return {"type": "object"}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"no JSON schema for field type {tp!r}")  # a command the table cannot show


def input_schema(command: type[Command]) -> dict[str, Any]:
    """The JSON schema of ``command``'s fields (required: those without a default)."""
    hints = typing.get_type_hints(command)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(command):
        prop = _schema_of(hints[f.name])
        if f.default is not dataclasses.MISSING and f.default is not None:
            prop["default"] = list(f.default) if isinstance(f.default, tuple) else f.default
        props[f.name] = prop
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


#: Every tool, in the order a client lists them.
TOOLS: tuple[ToolSpec, ...] = (
    # shared context: a map of keys, lists, counters, sets
    ToolSpec(
        "ctx_get",
        c.CtxGet,
        "Without key: {kv, list, counter, gset, orset} of the context.",
        read_only=True,
    ),
    ToolSpec("ctx_set", c.CtxSet),
    ToolSpec("ctx_append", c.CtxAppend),
    ToolSpec("ctx_incr", c.CtxIncr),
    ToolSpec("ctx_add", c.CtxAdd),
    ToolSpec("ctx_remove", c.CtxRemove),
    ToolSpec("ctx_members", c.CtxMembers, read_only=True),
    # direct messages and names
    ToolSpec("send", c.Send, "`to` is a node's name (see names) or address."),
    ToolSpec("inbox", c.Inbox, read_only=True),
    ToolSpec("names", c.Names, read_only=True),
    # the planner
    ToolSpec("plan_goal", c.PlanGoal, "Decomposers, scorers and executors of the mesh take it."),
    ToolSpec("plan_show", c.PlanShow, "With goal: its tree, status and final answer.", True),
    ToolSpec("plan_cancel", c.PlanCancel),
    # claims: cheap optimistic work registration
    ToolSpec("claim", c.Claim, "Then claim_wait tells whether this node won the task."),
    ToolSpec("claim_wait", c.ClaimWait, read_only=True),
    ToolSpec("claim_done", c.ClaimDone),
    ToolSpec("claim_release", c.ClaimRelease),
    ToolSpec("claim_show", c.ClaimShow, read_only=True),
    # leases with fencing tokens
    ToolSpec(
        "lease_acquire", c.LeaseAcquire, "Pass the fencing token to where the effect happens."
    ),
    ToolSpec("lease_renew", c.LeaseRenew),
    ToolSpec("lease_release", c.LeaseRelease),
    ToolSpec("lease_show", c.LeaseShow, read_only=True),
    # telemetry
    ToolSpec("metrics_record", c.MetricsRecord),
    # escalations to a human (the audit's inbox)
    ToolSpec("audit_inbox", c.AuditInbox, read_only=True),
    ToolSpec("audit_answer", c.AuditAnswer),
    ToolSpec("audit_status", c.AuditStatus, read_only=True),
    # the node
    ToolSpec("status", c.Status, read_only=True),
    ToolSpec("peers", c.Peers, read_only=True),
)

#: The watch tool (a stream of ``ctx.watch`` read up to the next change).
WATCH_TOOL = ToolSpec(
    "ctx_watch",
    c.CtxWatch,
    "Answers {changed, state, author} after the next change, or when timeout_s "
    "(default 10, at most 60) passes with changed=false.",
    read_only=True,
)
#: Its input schema: the command's and a wait.
WATCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "context": {"type": "string", "default": "default"},
        "timeout_s": {"type": "number", "default": 10},
    },
    "additionalProperties": False,
}

_BY_NAME = {t.name: t for t in (*TOOLS, WATCH_TOOL)}


def tool_named(name: str) -> ToolSpec | None:
    """The tool called ``name``, if there is one."""
    return _BY_NAME.get(name)
