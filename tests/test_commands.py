"""The typed command table: complete, explicit, and strict about its input.

Unit tests of :mod:`hivemesh.commands` and of the daemon's handler table;
the faces (control socket, CLI, ``hivemesh.Node``) are exercised against a
real daemon in ``test_e2e_commands.py``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from hivemesh import commands as c
from hivemesh.commands import COMMANDS, COMMON_ERRORS, Command, Reply, command_class
from hivemesh.core.plan_events import MAX_DEPTH
from hivemesh.errors import InvalidArgument, UnknownCommand
from hivemesh.runtime.handlers import HANDLERS, STREAMS
from hivemesh.telemetry.schema import KINDS


def test_every_command_has_exactly_one_handler() -> None:
    assert set(HANDLERS) | set(STREAMS) == set(COMMANDS.values())
    assert not set(HANDLERS) & set(STREAMS)
    assert {cls for cls in COMMANDS.values() if cls.stream} == set(STREAMS)


def test_every_command_is_typed_and_documented() -> None:
    for op, cls in COMMANDS.items():
        assert cls.op == op
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert issubclass(cls.reply, Reply) and dataclasses.is_dataclass(cls.reply)
        assert cls.__doc__ and cls.__doc__.strip(), op
        assert all(isinstance(code, str) and code for code in cls.errors), op
        assert not set(cls.errors) & set(COMMON_ERRORS), op


def test_the_table_is_the_public_surface() -> None:
    exported = {id(getattr(c, n)) for n in c.__all__}
    assert all(id(cls) in exported for cls in COMMANDS.values())
    assert len(COMMANDS) == len({cls.op for cls in COMMANDS.values()})


def test_constants_mirrored_from_the_core_and_telemetry_agree() -> None:
    from hivemesh.commands.metrics import METRIC_KINDS
    from hivemesh.commands.plan import MAX_PLAN_DEPTH

    assert sorted(METRIC_KINDS) == sorted(KINDS)
    assert MAX_PLAN_DEPTH == MAX_DEPTH


def test_importing_the_package_registers_nothing_and_loads_no_runtime() -> None:
    code = (
        "import sys, hivemesh.commands as c; "
        "bad = [m for m in sys.modules if m.startswith(('hivemesh.runtime', 'hivemesh.core',"
        " 'hivemesh.roles', 'asyncio'))]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_unknown_command_is_typed() -> None:
    with pytest.raises(UnknownCommand) as info:
        command_class("ctx.frobnicate")
    assert info.value.code == "unknown_command"
    assert isinstance(info.value, InvalidArgument)  # counted as a bad request
    with pytest.raises(UnknownCommand):
        command_class(17)


@pytest.mark.parametrize(
    ("cls", "args", "message"),
    [
        (c.CtxSet, {"value": 1}, "ctx.set: missing field 'key'"),
        (c.CtxSet, {"key": 3, "value": 1}, "ctx.set: key must be a string"),
        (c.CtxSet, {"key": "k", "value": 1, "vaule": 2}, "ctx.set: unknown field 'vaule'"),
        (c.CtxAdd, {"set": "s", "elements": ["a", 1]}, "elements[1] must be a string"),
        (c.CtxAdd, {"set": "s", "elements": []}, "non-empty"),
        (c.CtxRemove, {"set": "s", "elements": ["a"], "grow_only": True}, "no remove"),
        (c.Inbox, {"limit": True}, "inbox: limit must be an integer"),
        (c.Inbox, {"limit": 0}, "limit must be 1..10000"),
        (c.Send, {"to": "x", "data": 1, "timeout_s": 0}, "timeout_s must be a number"),
        (c.Status, {"timeout_s": "soon"}, "status: timeout_s must be a number"),
        (c.Status, None, ""),
        (c.Status, [1], "args must be an object"),
        (c.LeaseRenew, {"resource": "r", "holder": "h", "token": 0}, "token must be"),
        (c.MetricsRecord, {"name": "m", "kind": "nope"}, "kind must be one of"),
        (c.MetricsRecord, {"name": "m", "attrs": []}, "attrs must be an object"),
        (c.MetricsQuery, {"what": "query"}, "query needs sql"),
        (c.PlanGoal, {"title": "t", "quorum": "most"}, "quorum must be"),
        (c.FeedAcceptLoss, {}, "confirm=true"),
        (c.Append, {"kind": "ctx.x"}, "reserved"),
    ],
)
def test_bad_fields_are_invalid_argument_with_a_clear_message(
    cls: type[Command], args: object, message: str
) -> None:
    if not message:
        cls.from_wire(args)
        return
    with pytest.raises(InvalidArgument) as info:
        cls.from_wire(args)
    assert message in str(info.value)
    assert type(info.value) is InvalidArgument


def test_requests_round_trip_through_the_wire() -> None:
    samples: list[Command] = [
        c.CtxSet(key="k", value={"a": [1, 2]}, context="x"),
        c.CtxAdd(set="s", elements=("a", "b"), grow_only=True),
        c.EventsWatch(kinds=("ctx.update",)),
        c.MetricsRecord(name="m", value=2.5, attrs={"k": "v"}, wait_s=3.0),
        c.LeaseAcquire(resource="r", holder="h", ttl_ms=1000, timeout_s=1.5),
        c.Status(),
    ]
    for req in samples:
        assert type(req).from_wire(req.to_wire()) == req


def test_replies_round_trip_through_the_wire() -> None:
    samples: list[Reply] = [
        c.CtxSetReply(context="x", key="k", events=1, seq=4),
        c.LeaseShowReply(held=False),
        c.LeaseShowReply(held=True, holder="h", fencing_token=3, remaining_ms=900),
        c.MetricsRecordReply(recorded=1, first_seq=1, last_seq=1, stored=None),
        c.Record({"any": ["shape"]}),
    ]
    for reply in samples:
        assert type(reply).from_wire(reply.to_wire()) == reply
    assert c.LeaseShowReply(held=False).to_wire() == {"held": False}
