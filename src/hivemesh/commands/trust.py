"""Commands on trust: who may join, invites, joining a swarm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hivemesh.commands._base import Command, Reply, check_timeout
from hivemesh.errors import InvalidArgument

__all__ = [
    "Invite",
    "InviteReply",
    "Join",
    "JoinReply",
    "TrustAdmit",
    "TrustAdmitReply",
    "TrustList",
    "TrustListReply",
    "TrustRevoke",
    "TrustRevokeReply",
]


@dataclass(frozen=True, slots=True)
class TrustListReply(Reply):
    """The trust mode and the trusted and revoked addresses and swarms."""

    mode: str
    trusted: list[str]
    revoked: list[str]
    swarms: list[str]


@dataclass(frozen=True, slots=True)
class TrustList(Command):
    """The node's trust mode, trusted and revoked addresses, swarms."""

    op: ClassVar[str] = "trust.list"
    reply: ClassVar[type[Reply]] = TrustListReply


@dataclass(frozen=True, slots=True)
class TrustRevokeReply(Reply):
    """The address revoked."""

    revoked: str


@dataclass(frozen=True, slots=True)
class TrustRevoke(Command):
    """Disconnect ``address`` and refuse its new events."""

    op: ClassVar[str] = "trust.revoke"
    reply: ClassVar[type[Reply]] = TrustRevokeReply
    errors: ClassVar[tuple[str, ...]] = ("feed_not_writable", "store_error")
    address: str


@dataclass(frozen=True, slots=True)
class TrustAdmitReply(Reply):
    """The address trusted."""

    trusted: str


@dataclass(frozen=True, slots=True)
class TrustAdmit(Command):
    """Trust ``address`` (invite mode) and lift a revocation of it."""

    op: ClassVar[str] = "trust.admit"
    reply: ClassVar[type[Reply]] = TrustAdmitReply
    address: str


@dataclass(frozen=True, slots=True)
class InviteReply(Reply):
    """A single-use invite token, who issued it, until when (unix s), into which swarm."""

    token: str
    inviter: str
    expires_s: int
    swarm: str


@dataclass(frozen=True, slots=True)
class Invite(Command):
    """A single-use invite token for a new node into ``swarm`` (default: our home swarm)."""

    op: ClassVar[str] = "invite"
    reply: ClassVar[type[Reply]] = InviteReply
    errors: ClassVar[tuple[str, ...]] = ("feed_not_writable",)
    ttl_s: int = 3600
    swarm: str | None = None

    def check(self) -> None:
        """A positive lifetime."""
        if self.ttl_s <= 0:
            raise InvalidArgument("invite: ttl_s must be positive")


@dataclass(frozen=True, slots=True)
class JoinReply(Reply):
    """The inviter that admitted this node, its endpoints, how long it took."""

    inviter: str
    endpoints: list[str]
    seconds: float


@dataclass(frozen=True, slots=True)
class Join(Command):
    """Join the swarm of the node that issued ``token``, once it admitted
    this node (default deadline: the daemon's control timeout less a second)."""

    op: ClassVar[str] = "join"
    reply: ClassVar[type[Reply]] = JoinReply
    errors: ClassVar[tuple[str, ...]] = (
        "identity_mismatch",
        "invite_bad_signature",
        "invite_error",
        "invite_expired",
        "invite_malformed",
        "invite_noncanonical",
        "invite_revoked",
        "invite_unknown",
        "invite_used",
        "unknown_peer",
        "unreachable",
    )
    token: str
    timeout_s: float | None = None

    def check(self) -> None:
        """The deadline's range."""
        if self.timeout_s is not None:
            check_timeout(self.op, self.timeout_s)
