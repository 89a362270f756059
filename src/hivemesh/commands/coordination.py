"""Commands for coordination: leases on the swarm's quorum, optimistic claims.

Every lease command has a deadline (``timeout_s``, default 2 s) for its
quorum round trips; ``backend_unavailable`` means no majority answered in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hivemesh.commands._base import Command, Reply, check_timeout
from hivemesh.commands.node import WRITE_ERRORS
from hivemesh.errors import InvalidArgument

__all__ = [
    "Claim",
    "ClaimDone",
    "ClaimDoneReply",
    "ClaimRelease",
    "ClaimReleaseReply",
    "ClaimReply",
    "ClaimShow",
    "ClaimWait",
    "ClaimWaitReply",
    "LeaseAcquire",
    "LeaseAcquireReply",
    "LeaseOkReply",
    "LeaseRelease",
    "LeaseRenew",
    "LeaseShow",
    "LeaseShowReply",
    "LeaseVoters",
]

#: Codes of a quorum round (lease commands).
QUORUM_ERRORS: tuple[str, ...] = ("backend_unavailable", "lease_contended", "lease_unavailable")
_LEASE_TIMEOUT_S = 2.0


def _check(cmd: Command, timeout_s: float, token: int | None = None) -> None:
    check_timeout(cmd.op, timeout_s)
    if token is not None and token < 1:
        raise InvalidArgument("token must be a positive int")


@dataclass(frozen=True, slots=True)
class LeaseAcquireReply(Reply):
    """The new fencing token, or None if another holder has the lease."""

    token: int | None


@dataclass(frozen=True, slots=True)
class LeaseAcquire(Command):
    """Acquire ``resource`` for ``holder`` for ``ttl_ms`` (one attempt)."""

    op: ClassVar[str] = "lease.acquire"
    reply: ClassVar[type[Reply]] = LeaseAcquireReply
    errors: ClassVar[tuple[str, ...]] = QUORUM_ERRORS
    resource: str
    holder: str
    ttl_ms: int = 5000
    timeout_s: float = _LEASE_TIMEOUT_S

    def check(self) -> None:
        """The deadline's range (resource, holder and TTL: the lease layer's)."""
        _check(self, self.timeout_s)


@dataclass(frozen=True, slots=True)
class LeaseOkReply(Reply):
    """Whether a majority renewed (or released) the lease."""

    ok: bool


@dataclass(frozen=True, slots=True)
class LeaseRenew(Command):
    """Renew the lease ``token`` of ``holder`` on ``resource``."""

    op: ClassVar[str] = "lease.renew"
    reply: ClassVar[type[Reply]] = LeaseOkReply
    errors: ClassVar[tuple[str, ...]] = QUORUM_ERRORS
    resource: str
    holder: str
    token: int
    ttl_ms: int = 5000
    timeout_s: float = _LEASE_TIMEOUT_S

    def check(self) -> None:
        """Deadline and token ranges."""
        _check(self, self.timeout_s, self.token)


@dataclass(frozen=True, slots=True)
class LeaseRelease(Command):
    """Release the lease ``token`` of ``holder`` on ``resource``."""

    op: ClassVar[str] = "lease.release"
    reply: ClassVar[type[Reply]] = LeaseOkReply
    errors: ClassVar[tuple[str, ...]] = QUORUM_ERRORS
    resource: str
    holder: str
    token: int
    timeout_s: float = _LEASE_TIMEOUT_S

    def check(self) -> None:
        """Deadline and token ranges."""
        _check(self, self.timeout_s, self.token)


@dataclass(frozen=True, slots=True)
class LeaseShowReply(Reply):
    """The current holder of a lease, if any (a majority read)."""

    held: bool
    holder: str | None = None
    fencing_token: int | None = None
    remaining_ms: int | None = None

    def to_wire(self) -> dict[str, object]:
        """``{"held": false}``, or every field."""
        if not self.held:
            return {"held": False}
        return {
            "held": True,
            "holder": self.holder,
            "fencing_token": self.fencing_token,
            "remaining_ms": self.remaining_ms,
        }


@dataclass(frozen=True, slots=True)
class LeaseShow(Command):
    """Who holds ``resource`` now."""

    op: ClassVar[str] = "lease.show"
    reply: ClassVar[type[Reply]] = LeaseShowReply
    errors: ClassVar[tuple[str, ...]] = ("backend_unavailable",)
    resource: str
    timeout_s: float = _LEASE_TIMEOUT_S

    def check(self) -> None:
        """The deadline's range."""
        _check(self, self.timeout_s)


@dataclass(frozen=True, slots=True)
class LeaseVoters(Command):
    """The quorum's voters, the majority and the proposer's statistics."""

    op: ClassVar[str] = "lease.voters"


@dataclass(frozen=True, slots=True)
class ClaimReply(Reply):
    """The claim's seq in our feed and the current winner (None: undecided)."""

    resource: str
    seq: int
    winner: str | None


@dataclass(frozen=True, slots=True)
class Claim(Command):
    """Register this node's claim on ``resource`` in the journal."""

    op: ClassVar[str] = "claim"
    reply: ClassVar[type[Reply]] = ClaimReply
    errors: ClassVar[tuple[str, ...]] = WRITE_ERRORS
    resource: str


@dataclass(frozen=True, slots=True)
class ClaimWaitReply(Reply):
    """The decided winner of ``resource`` and whether it is this node."""

    resource: str
    winner: str | None
    ours: bool


@dataclass(frozen=True, slots=True)
class ClaimWait(Command):
    """Wait until the claim on ``resource`` is decided (settle window)."""

    op: ClassVar[str] = "claim.wait"
    reply: ClassVar[type[Reply]] = ClaimWaitReply
    resource: str
    timeout_s: float = _LEASE_TIMEOUT_S

    def check(self) -> None:
        """The deadline's range."""
        _check(self, self.timeout_s)


@dataclass(frozen=True, slots=True)
class ClaimReleaseReply(Reply):
    """How many live claims of this node on the resource were released."""

    released: int


@dataclass(frozen=True, slots=True)
class ClaimRelease(Command):
    """Release this node's claim on ``resource``."""

    op: ClassVar[str] = "claim.release"
    reply: ClassVar[type[Reply]] = ClaimReleaseReply
    errors: ClassVar[tuple[str, ...]] = WRITE_ERRORS
    resource: str


@dataclass(frozen=True, slots=True)
class ClaimDoneReply(Reply):
    """The work on the resource was reported done."""

    done: bool


@dataclass(frozen=True, slots=True)
class ClaimDone(Command):
    """Report ``resource`` finished."""

    op: ClassVar[str] = "claim.done"
    reply: ClassVar[type[Reply]] = ClaimDoneReply
    errors: ClassVar[tuple[str, ...]] = WRITE_ERRORS
    resource: str


@dataclass(frozen=True, slots=True)
class ClaimShow(Command):
    """The claim state of ``resource`` (or of every resource)."""

    op: ClassVar[str] = "claim.show"
    resource: str | None = None
