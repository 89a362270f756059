"""Commands about the node itself: status, peers, stop, its own feed, raw appends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hivemesh.commands._base import Command, Reply
from hivemesh.errors import InvalidArgument

__all__ = [
    "Append",
    "EventReply",
    "EventsWatch",
    "FeedAcceptLoss",
    "FeedStatus",
    "Peers",
    "Status",
    "Stop",
    "StopReply",
]

#: Codes of a write to the node's own feed (any command that appends).
WRITE_ERRORS: tuple[str, ...] = (
    "context_broken",
    "context_catching_up",
    "feed_diverged",
    "feed_not_writable",
    "feed_recovering",
    "store_error",
)


@dataclass(frozen=True, slots=True)
class Status(Command):
    """The node's status record: journal (with every feed's head seq and
    hash under ``journal.heads``), members, trust, counters, drops."""

    op: ClassVar[str] = "status"


@dataclass(frozen=True, slots=True)
class Peers(Command):
    """Known members with their channel figures (a list)."""

    op: ClassVar[str] = "peers"


@dataclass(frozen=True, slots=True)
class StopReply(Reply):
    """The daemon is shutting down."""

    stopping: bool


@dataclass(frozen=True, slots=True)
class Stop(Command):
    """Shut the daemon down cleanly (answers first)."""

    op: ClassVar[str] = "stop"
    reply: ClassVar[type[Reply]] = StopReply


@dataclass(frozen=True, slots=True)
class FeedStatus(Command):
    """Whether the node writes its own feed, and why not."""

    op: ClassVar[str] = "feed.status"


@dataclass(frozen=True, slots=True)
class FeedAcceptLoss(Command):
    """Write on from what the store holds, giving up the part of the own
    feed no peer could supply (``confirm`` must be true)."""

    op: ClassVar[str] = "feed.accept_loss"
    errors: ClassVar[tuple[str, ...]] = ("store_error",)
    confirm: bool = False

    def check(self) -> None:
        """``confirm`` is required."""
        if not self.confirm:
            raise InvalidArgument(
                "feed.accept_loss needs confirm=true (see `hivemesh feed --help`)"
            )


@dataclass(frozen=True, slots=True)
class EventReply(Reply):
    """One journal event as JSON (bytes in the body as ``{"$bytes": b64}``)."""

    author: str
    seq: int
    hlc: int
    kind: str
    id: str
    body: Any


@dataclass(frozen=True, slots=True)
class Append(Command):
    """Append an application event of ``kind`` to the node's own feed."""

    op: ClassVar[str] = "append"
    reply: ClassVar[type[Reply]] = EventReply
    errors: ClassVar[tuple[str, ...]] = WRITE_ERRORS
    kind: str
    body: Any = None

    def check(self) -> None:
        """Kinds of the node's own views are written by their commands."""
        if self.kind.startswith(("ctx.", "name.", "node.")):
            raise InvalidArgument(f"kind {self.kind!r} is reserved; use the matching command")


@dataclass(frozen=True, slots=True)
class EventsWatch(Command):
    """Stream new events (of ``kinds``, or all) until the client hangs up."""

    op: ClassVar[str] = "events.watch"
    stream: ClassVar[bool] = True
    kinds: tuple[str, ...] | None = None
