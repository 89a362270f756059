"""Invite and join over live channels (``hivemesh invite`` / ``hivemesh join``).

Theory of operation
-------------------
Tokens, proofs and the trust file are :mod:`hivemesh.trust`'s. The transport
authorises a peer by address only, so the proof travels in the first frame
after the handshake instead of inside it:

* **Inviter.** While it has unexpired invites, its handshake admits an
  unknown (never a revoked) address *on probation*: the channel is up, but
  every frame from it except ``RT_JOIN`` is dropped (counted
  ``probation_dropped``), it is not a member and it does not replicate. An
  ``RT_JOIN`` frame carrying a proof that :meth:`TrustStore.redeem` accepts
  trusts the address for good and the channel proceeds as any other; a bad
  proof, or none within :data:`PROBATION_MS`, closes the channel
  (``join_refused`` / ``probation_expired``).
* **Joiner.** ``join TOKEN`` verifies the token, trusts the inviter, computes
  the proof bound to both identities and dials the token's endpoints; the
  first frame on the new channel to the inviter is ``RT_JOIN``. Membership
  and peer exchange then introduce the rest of the swarm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hivemesh.core.frames import decode_frame, encode_frame
from hivemesh.errors import DecodeError, InviteError, RemoteProtocolError
from hivemesh.trust import join_proof

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["PROBATION_MS", "RT_JOIN", "Invites"]

#: Runtime frame type carrying a join proof (see core.frames for the table).
RT_JOIN = 62
#: How long an unknown peer may stay connected without a valid proof.
PROBATION_MS = 10_000


class Invites:
    """Probation for invitees and proofs for joins (see module docs)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.probation: dict[str, int] = {}
        self.proofs: dict[str, bytes] = {}

    def admit_channel(self, address: str, now_ms: int) -> bool:
        """Handshake policy: members as usual, unknown peers on probation."""
        d = self.daemon
        if d.authorize(address):
            return True
        if d.trust.is_revoked(address) or d.trust.pending_invites(now_ms // 1000) == 0:
            return False
        self.probation.setdefault(address, now_ms + PROBATION_MS)
        return True

    def issue(self, ttl_s: int, now_ms: int) -> dict[str, Any]:
        """A new single-use invite token for this node."""
        d = self.daemon
        token = d.trust.issue_invite(d.identity, [d.advertised], ttl_s, now_ms // 1000)
        return {"token": token, "inviter": d.address, "expires_s": now_ms // 1000 + ttl_s}

    def join(self, token: str, now_ms: int) -> dict[str, Any]:
        """Accept ``token``: trust the inviter and dial it with our proof."""
        d = self.daemon
        invite = d.trust.accept(token, now_ms // 1000)
        d.vouch(invite.inviter)
        self.proofs[invite.inviter] = join_proof(invite, d.address)
        if invite.inviter in d.conns.links:
            self.send_proof(invite.inviter)
        d.learn(invite.inviter, list(invite.endpoints))
        return {"inviter": invite.inviter, "endpoints": list(invite.endpoints)}

    def send_proof(self, peer: str) -> None:
        """On a new channel to an inviter: present our proof first."""
        proof = self.proofs.get(peer)
        if proof is not None:
            self.daemon.node.send(peer, encode_frame(RT_JOIN, proof))

    def on_probation_frame(self, peer: str, frame: bytes, now_ms: int) -> bool:
        """Handle a frame from a peer on probation; True if it was admitted."""
        d = self.daemon
        try:
            ftype, fields = decode_frame(frame)
            if ftype != RT_JOIN:
                d.counters["probation_dropped"] += 1
                return False
            if len(fields) != 1 or type(fields[0]) is not bytes:
                raise DecodeError("RT_JOIN takes one proof")
            d.trust.redeem(peer, fields[0], now_ms // 1000)
        except (RemoteProtocolError, InviteError) as exc:
            d.counters["join_refused"] += 1
            d.counters[f"join_refused_{exc.code}"] += 1
            self.probation.pop(peer, None)
            d.disconnect_later(peer, "join refused")
            return False
        self.probation.pop(peer, None)
        d.counters["invites_redeemed"] += 1
        d.vouch(peer)
        return True

    def expire(self, now_ms: int) -> None:
        """Close channels whose probation ran out."""
        for peer in sorted(self.probation):
            if self.probation[peer] <= now_ms:
                del self.probation[peer]
                self.daemon.counters["probation_expired"] += 1
                self.daemon.disconnect_later(peer, "probation expired")

    def next_deadline(self) -> int | None:
        """The earliest probation expiry."""
        return min(self.probation.values(), default=None)
