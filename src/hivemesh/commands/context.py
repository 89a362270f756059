"""Commands on shared contexts: registers, lists, counters, add-wins and
grow-only sets, watch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from hivemesh.commands._base import Command, Reply
from hivemesh.commands.node import WRITE_ERRORS
from hivemesh.errors import InvalidArgument

#: Most items one ``ctx.append`` may add.
MAX_APPEND_ITEMS = 1000

__all__ = [
    "CtxAdd",
    "CtxAppend",
    "CtxAppendReply",
    "CtxContexts",
    "CtxGet",
    "CtxIncr",
    "CtxIncrReply",
    "CtxMembers",
    "CtxRemove",
    "CtxSet",
    "CtxSetReply",
    "CtxWatch",
    "MembersReply",
    "SetChangeReply",
]


@dataclass(frozen=True, slots=True)
class CtxGet(Command):
    """A context's state, or with ``key`` ``{key, found, value}``."""

    op: ClassVar[str] = "ctx.get"
    errors: ClassVar[tuple[str, ...]] = ("context_broken",)
    context: str = "default"
    key: str | None = None


@dataclass(frozen=True, slots=True)
class CtxContexts(Command):
    """The contexts this replica holds, with how many keys each has
    (registers, lists, counters, texts and sets together):
    ``{"contexts": {name: keys}}`` (names sorted)."""

    op: ClassVar[str] = "ctx.contexts"
    errors: ClassVar[tuple[str, ...]] = ("context_broken",)


@dataclass(frozen=True, slots=True)
class CtxSetReply(Reply):
    """Where the write went: the events appended and our feed's seq."""

    context: str
    key: str
    events: int
    seq: int


@dataclass(frozen=True, slots=True)
class CtxSet(Command):
    """Set ``key`` of ``context`` to a JSON ``value`` (replicated)."""

    op: ClassVar[str] = "ctx.set"
    reply: ClassVar[type[Reply]] = CtxSetReply
    errors: ClassVar[tuple[str, ...]] = WRITE_ERRORS
    key: str
    value: Any
    context: str = "default"


@dataclass(frozen=True, slots=True)
class CtxAppendReply(Reply):
    """The list's length after the append and the events appended."""

    length: int
    events: int


@dataclass(frozen=True, slots=True)
class CtxAppend(Command):
    """Append JSON ``values`` to list ``list`` of ``context`` (concurrent
    appends all land; their order is the merge's)."""

    op: ClassVar[str] = "ctx.append"
    reply: ClassVar[type[Reply]] = CtxAppendReply
    errors: ClassVar[tuple[str, ...]] = WRITE_ERRORS
    list: str
    values: tuple[Any, ...]
    context: str = "default"

    def check(self) -> None:
        """1..1000 values."""
        if not 0 < len(self.values) <= MAX_APPEND_ITEMS:
            raise InvalidArgument(f"values must be a list of 1..{MAX_APPEND_ITEMS} JSON values")


@dataclass(frozen=True, slots=True)
class CtxIncrReply(Reply):
    """The counter's value after the increment and the events appended."""

    value: float
    events: int


@dataclass(frozen=True, slots=True)
class CtxIncr(Command):
    """Add ``by`` (may be negative) to counter ``counter`` of ``context``
    (concurrent increments all count)."""

    op: ClassVar[str] = "ctx.incr"
    reply: ClassVar[type[Reply]] = CtxIncrReply
    errors: ClassVar[tuple[str, ...]] = WRITE_ERRORS
    counter: str
    by: float = 1.0
    context: str = "default"

    def check(self) -> None:
        """A finite increment."""
        if not math.isfinite(self.by):
            raise InvalidArgument("by must be a finite number")


@dataclass(frozen=True, slots=True)
class SetChangeReply(Reply):
    """The set's members after the change and the events appended."""

    members: list[str]
    events: int


@dataclass(frozen=True, slots=True)
class MembersReply(Reply):
    """The sorted members of a set."""

    members: list[str]


@dataclass(frozen=True, slots=True)
class _SetEdit(Command):
    """Fields of a change to set ``set`` of ``context``."""

    reply: ClassVar[type[Reply]] = SetChangeReply
    errors: ClassVar[tuple[str, ...]] = WRITE_ERRORS
    set: str
    elements: tuple[str, ...]
    context: str = "default"
    grow_only: bool = False

    def check(self) -> None:
        """At least one element."""
        if not self.elements:
            raise InvalidArgument("elements must be a non-empty list of strings")


@dataclass(frozen=True, slots=True)
class CtxAdd(_SetEdit):
    """Add ``elements`` to set ``set`` of ``context`` (add-wins, or grow-only)."""

    op: ClassVar[str] = "ctx.add"


@dataclass(frozen=True, slots=True)
class CtxRemove(_SetEdit):
    """Remove ``elements`` from the add-wins set ``set`` of ``context``."""

    op: ClassVar[str] = "ctx.remove"

    def check(self) -> None:
        """At least one element; a grow-only set has no remove."""
        if self.grow_only:
            raise InvalidArgument("a grow-only set has no remove")
        _SetEdit.check(self)


@dataclass(frozen=True, slots=True)
class CtxMembers(Command):
    """The members of set ``set`` of ``context``."""

    op: ClassVar[str] = "ctx.members"
    reply: ClassVar[type[Reply]] = MembersReply
    set: str
    context: str = "default"
    grow_only: bool = False


@dataclass(frozen=True, slots=True)
class CtxWatch(Command):
    """Stream ``context``'s state now and after every change to it."""

    op: ClassVar[str] = "ctx.watch"
    stream: ClassVar[bool] = True
    context: str = "default"
