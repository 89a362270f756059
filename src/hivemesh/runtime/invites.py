"""Invites and joins: the daemon's half (tokens, ``trust.json``).

Theory of operation
-------------------
Every decision of probation and joins is the Peer's
(:mod:`hivemesh.core.joins`: who is on probation and for how long, what a
proof or a refusal does, when a join fails, what reaches an inviter that does
not admit us yet). Tokens, proofs and the trust file are
:mod:`hivemesh.trust`'s, and this module does their I/O for the daemon:

* :meth:`Invites.issue` writes a new invite to ``trust.json`` and returns
  its token (``hivemesh invite``);
* :meth:`Invites.join` checks a token (its signature and form, its expiry
  with :data:`EXPIRY_GRACE_S` of slack: on the edge, the inviter's clock
  decides) and hands the join to the Peer (``StartJoin``), whose reply ends
  the ``hivemesh join`` command;
* :meth:`Invites.redeem` carries out the Peer's ``Redeem`` effect: the trust
  store checks the proof and marks its invite used (under the file's lock,
  shared with the CLI), and the answer goes back as ``Peer.redeemed``;
  :meth:`Invites.edit` carries out ``TrustEdit`` (trust an address, record a
  swarm joined);
* :meth:`Invites.refused` passes a peer's refusal from the connection
  manager to the Peer (``Peer.join_refused``), with whether every endpoint
  dialled for it has proved to be another node;
* :meth:`Invites.status` is ``status``'s ``trust`` section.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from hivemesh.commands.peer import StartJoin
from hivemesh.core.dialer import last_error, refused_everywhere
from hivemesh.core.effects import Redeem, TrustEdit
from hivemesh.core.joins import MAX_PROBATION, PROBATION_MS
from hivemesh.errors import HivemeshError, InvalidArgument
from hivemesh.runtime.clock import now_ms
from hivemesh.trust import accept_invite, join_proof

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = ["EXPIRY_GRACE_S", "MAX_PROBATION", "PROBATION_MS", "Invites"]

#: A token that expired less than this long ago by our clock is still tried.
EXPIRY_GRACE_S = 120
_MAX_TTL_S = 30 * 86400


class Invites:
    """The daemon's invite and join I/O (see module docs)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def admit_channel(self, address: str) -> bool:
        """The connection manager's handshake policy: the Peer's decision."""
        d = self.daemon
        t = now_ms()
        return d.peer.admit_channel(address, d.trust.remembered_invites(t // 1000) > 0, t)

    def issue(self, ttl_s: int, now_ms: int, swarm: str | None = None) -> dict[str, Any]:
        """A new single-use invite token into ``swarm`` (default: our home swarm)."""
        if not 0 < ttl_s <= _MAX_TTL_S:
            raise InvalidArgument(f"ttl_s must be 1..{_MAX_TTL_S}")
        d = self.daemon
        now_s = now_ms // 1000
        token = d.trust.issue_invite(d.identity, [d.advertised], ttl_s, now_s, swarm=swarm)
        swarm = swarm or d.trust.swarms()[0]
        return {"token": token, "inviter": d.address, "expires_s": now_s + ttl_s, "swarm": swarm}

    def join(self, token: str, now_ms: int, *, timeout_s: float) -> asyncio.Future[Any]:
        """Start joining through ``token``'s inviter; the future resolves once
        it admits us, or fails with the typed cause (:mod:`hivemesh.core.joins`)."""
        d = self.daemon
        invite = accept_invite(token, now_ms // 1000 - EXPIRY_GRACE_S)
        proof = join_proof(invite, d.address)
        return d.call(StartJoin(invite.inviter, tuple(invite.endpoints), proof, timeout_s))

    def redeem(self, e: Redeem) -> None:
        """Carry out ``Redeem``: the trust store's answer goes to the Peer."""
        d = self.daemon
        t = now_ms()
        try:
            new, swarm = d.trust.redeem(e.peer, e.proof, t // 1000)
        except HivemeshError as exc:  # a bad proof, or our store failed: its code says which
            d.peer.redeemed(e.peer, None, False, exc, t)
            return
        d.peer.redeemed(e.peer, swarm, new, None, t)

    def edit(self, e: TrustEdit) -> None:
        """Carry out ``TrustEdit`` in ``trust.json``."""
        trust, now_s = self.daemon.trust, now_ms() // 1000
        if e.swarm is None:
            trust.add(e.address, now_s, note=e.note)
        else:
            trust.join_swarm(e.swarm, e.address, now_s)

    def refused(self, peer: str, error: HivemeshError) -> None:
        """``peer`` turned us away (the connection manager's ``on_refused``)."""
        d = self.daemon
        exhausted = refused_everywhere(d.conns.dial_targets(), peer)
        d.peer.join_refused(peer, error, exhausted, now_ms())
        d._schedule_flush()

    def status(self, now_ms: int) -> dict[str, Any]:
        """Our swarms and whom we admit; invites, probation, joins in progress
        and their last outcomes."""
        d = self.daemon
        web = d.web()
        joins, targets = d.peer.joins.status(), d.conns.dial_targets()
        for inviter, row in joins["joining"].items():
            row["last_error"] = last_error(targets, inviter)
        return {
            "vouches": d.config.trust_vouches,
            "swarms": {s: sorted(m) for s, m in sorted(web.swarms.items())},
            "admitted": sorted(web.admitted),
            "pending_invites": d.trust.pending_invites(now_ms // 1000),
            **joins,
            "refused_by": [t for t in targets if t["refused"]],
        }
