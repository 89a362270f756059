"""Claims inside the swarm: optimistic intent in the journal, decided by a view.

Theory of operation
-------------------
The node's :class:`~hivemesh.core.peer.Peer` holds the
:class:`~hivemesh.core.claims.ClaimsView` and its rules: a ``member.down``
event (written by SWIM failure detection) releases the dead member's
claims, and a restarted node releases the live claims of its previous life.
:class:`MeshClaims` is the daemon's API over it: each call is one Peer
command (``Claim``, ``ClaimRelease``, ``ClaimDone``, ``ClaimWait``: the Peer
appends the events and answers ``ClaimWait`` once the view decided): the
earliest live claim by ``(hlc, author)`` wins once it is older than the
settle window. Cheap and leaderless; a rare duplicate is possible and is detected
(``claim.done`` by two nodes), which is what leases with fencing tokens
(:mod:`hivemesh.runtime.leases`) are for when it must not happen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hivemesh import commands as c
from hivemesh.core.claims import DEFAULT_WINDOW_MS as DEFAULT_SETTLE_MS
from hivemesh.core.claims import ClaimsView, check_resource
from hivemesh.core.identity import address_of

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["DEFAULT_SETTLE_MS", "MeshClaims"]


class MeshClaims:
    """Claims for this node through the journal (:mod:`hivemesh.core.claims`).

    ``claim`` registers intent; ``wait_decided`` returns the winner's address
    once its claim is older than the settle window; the loser moves on. When
    SWIM marks the winner down, its claims are released by the view and the
    next earliest claim (possibly a new one) wins.
    """

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.settle_ms = daemon.peer.config.claim_settle_ms
        self.view: ClaimsView = daemon.peer.claims  # backdating buys at most the window

    async def claim(self, resource: str) -> int:
        """Append ``claim.intent`` for ``resource``; returns the claim's seq.

        If this node already has a live claim on it, returns that claim's seq.
        """
        reply: c.ClaimReply = await self.d.call(c.Claim(check_resource(resource)))
        return reply.seq

    def winner(self, resource: str) -> str | None:
        """The address of the current earliest live claim (may still change)."""
        w = self.view.winner(check_resource(resource))
        return None if w is None else address_of(w.author)

    def decided(self, resource: str, now_ms: int) -> str | None:
        """The winner's address once settled, else None."""
        a = self.view.decided(check_resource(resource), now_ms, self.settle_ms)
        return None if a is None else address_of(a)

    async def wait_decided(self, resource: str, *, timeout_s: float = 10.0) -> str:
        """Wait until the claim on ``resource`` is decided; the winner's address.

        Raises DeadlineExceeded after ``timeout_s`` (no live claim, or not settled).
        """
        r = check_resource(resource)
        reply: c.ClaimWaitReply = await self.d.call(c.ClaimWait(r, timeout_s))
        assert reply.winner is not None
        return reply.winner

    async def release(self, resource: str) -> int:
        """Release this node's live claims on ``resource``; returns how many."""
        reply: c.ClaimReleaseReply = await self.d.call(c.ClaimRelease(check_resource(resource)))
        return reply.released

    async def done(self, resource: str) -> None:
        """Report ``resource`` finished (ends claiming; duplicates are detected)."""
        await self.d.call(c.ClaimDone(check_resource(resource)))
