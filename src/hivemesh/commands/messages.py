"""Commands for direct messages: send, inbox, ping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hivemesh.commands._base import Command, Reply, check_timeout
from hivemesh.errors import InvalidArgument

__all__ = ["Inbox", "Ping", "PingReply", "Send"]


@dataclass(frozen=True, slots=True)
class Send(Command):
    """Send an acknowledged direct message to an address or a name; the
    receipt (``acked``, ``to``, ``msg_id``, ``rtt_ms``, ...) once the
    receiver holds it (to ``metrics-collector``: once stored)."""

    op: ClassVar[str] = "send"
    errors: ClassVar[tuple[str, ...]] = (
        "no_handler",
        "spool_full",
        "telemetry_refused",
        "unknown_peer",
        "unreachable",
    )
    to: str
    data: Any
    timeout_s: float = 10.0

    def check(self) -> None:
        """The deadline's range."""
        check_timeout(self.op, self.timeout_s)


@dataclass(frozen=True, slots=True)
class Inbox(Command):
    """Direct messages received, oldest first (``remove`` takes them out)."""

    op: ClassVar[str] = "inbox"
    limit: int = 100
    remove: bool = False

    def check(self) -> None:
        """``limit`` in 1..10000."""
        if not 0 < self.limit <= 10_000:
            raise InvalidArgument("limit must be 1..10000")


@dataclass(frozen=True, slots=True)
class PingReply(Reply):
    """The peer's address and the round-trip time."""

    address: str
    rtt_ms: float


@dataclass(frozen=True, slots=True)
class Ping(Command):
    """Round-trip time to a connected peer (by address or name)."""

    op: ClassVar[str] = "ping"
    reply: ClassVar[type[Reply]] = PingReply
    errors: ClassVar[tuple[str, ...]] = ("unknown_peer", "unreachable")
    address: str
    timeout_s: float = 10.0

    def check(self) -> None:
        """The deadline's range."""
        check_timeout(self.op, self.timeout_s)
