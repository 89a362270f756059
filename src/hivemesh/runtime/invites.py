"""Invite and join over live channels (``hivemesh invite`` / ``hivemesh join``).

Theory of operation
-------------------
Tokens, proofs and the trust file are :mod:`hivemesh.trust`'s. The transport
authorises a peer by address only, so the proof travels in the first frame
after the handshake instead of inside it:

* **Inviter.** While it remembers invites it issued (redeemable, used or
  expired: :data:`~hivemesh.trust.INVITE_MEMORY_S`), its handshake admits an
  unknown, unrevoked address *on probation*, at most :data:`MAX_PROBATION`
  at once: the channel is up, but nothing is sent on it, the peer is not a
  member and does not replicate. Its first frame must be ``RT_JOIN`` with a
  proof; any other frame closes the channel with ``unknown_peer`` (counted
  ``probation_violation``), as does silence for :data:`PROBATION_MS`
  (``probation_expired``). A proof :meth:`TrustStore.redeem` accepts
  trusts the joiner, publishes our vouch bringing it into the invite's swarm
  and answers ``RT_JOINED`` naming that swarm; the channel then proceeds as
  any other. Otherwise the channel is closed
  with the cause as its CLOSE code -- ``invite_used``, ``invite_expired``,
  ``invite_unknown`` (not an invite of ours), ``invite_revoked`` -- counted
  ``join_refused_<code>``. An ``RT_JOIN`` from a peer we admit already is
  answered on the open channel: ``RT_JOINED`` again (our first answer was
  lost with its channel), or ``RT_JOIN_REFUSED`` with the cause.
* **Joiner.** :meth:`Invites.join` verifies the token (its expiry with
  :data:`EXPIRY_GRACE_S` of slack: on the edge, the inviter's clock decides)
  and dials the inviter, which only this *pending join* authorises. On the
  channel it sends ``RT_JOIN`` and nothing else until ``RT_JOINED`` (other
  frames for the inviter are dropped, counted ``dropped_before_admission``).
  Admitted, it trusts the inviter (``trust.json``), records the swarm it
  joined and vouches for the inviter into it -- unless it is in that swarm
  already and the inviter is not (a claim that would merge swarms: then it
  trusts the inviter alone, counted ``join_swarm_conflict``) -- and
  membership starts through it. A refusal -- the inviter's CLOSE code, or
  ``unknown_peer`` in the handshake, or every endpoint in the token proving
  to be another node -- or the join's deadline ends it: the waiting caller
  gets the typed error, it is counted (``join_failed_<code>``), logged and
  kept in ``status`` (``trust.joins``), and the inviter is no longer dialled.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hivemesh.core.frames import FrameType, decode_frame, encode_frame
from hivemesh.core.identity import short
from hivemesh.errors import (
    DeadlineExceeded,
    DecodeError,
    HivemeshError,
    InvalidArgument,
    InviteError,
    PeerIdentityMismatch,
    RemoteProtocolError,
    UnknownPeer,
)
from hivemesh.transports.channel import peer_close_error
from hivemesh.trust import accept_invite, join_proof

if TYPE_CHECKING:
    from hivemesh.core.node import Node
    from hivemesh.runtime.daemon import Daemon

__all__ = [
    "EXPIRY_GRACE_S",
    "MAX_PROBATION",
    "PROBATION_MS",
    "RT_JOIN",
    "RT_JOINED",
    "RT_JOIN_REFUSED",
    "Invites",
    "PendingJoin",
]

log = logging.getLogger("hivemesh.runtime.invites")

#: Runtime frame types: a join proof, and the inviter's admission (core.frames table).
RT_JOIN = int(FrameType.RT_JOIN)
RT_JOINED = int(FrameType.RT_JOINED)
RT_JOIN_REFUSED = int(FrameType.RT_JOIN_REFUSED)
#: How long an unknown peer may stay connected without presenting a proof.
PROBATION_MS = 10_000
#: Unknown peers on probation at once; more are refused in the handshake.
MAX_PROBATION = 32
#: A token that expired less than this long ago by our clock is still tried.
EXPIRY_GRACE_S = 120
_MAX_TTL_S = 30 * 86400
_CLOSING = -1  # a probation that ended unadmitted: drop what else arrives until it is gone
_RESULTS_KEPT = 16


@dataclass(slots=True)
class PendingJoin:
    """A join waiting for the inviter's answer."""

    inviter: str
    endpoints: tuple[str, ...]
    proof: bytes
    started_ms: int
    deadline_ms: int
    future: asyncio.Future[dict[str, Any]]


class Invites:
    """Probation for invitees, pending joins for joiners (see module docs)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        #: unknown peers on probation -> when it ends (ms); until their channel is
        #: gone (``on_peer`` down) refused ones stay, marked closing
        self.probation: dict[str, int] = {}
        #: inviter -> our pending join
        self.joins: dict[str, PendingJoin] = {}
        #: inviters that do not admit us yet: only RT_JOIN goes to them
        self.awaiting: set[str] = set()
        #: the last joins' outcomes, for ``status``
        self.results: deque[dict[str, Any]] = deque(maxlen=_RESULTS_KEPT)

    def attach(self, node: Node) -> None:
        """Handle ``RT_JOIN`` from admitted peers and ``RT_JOINED`` on ``node``."""
        node.register_handler(RT_JOIN, self._on_join)
        node.register_handler(RT_JOINED, self._on_joined)
        node.register_handler(RT_JOIN_REFUSED, self._on_join_refused)

    # -- inviter -----------------------------------------------------------------

    def admit_channel(self, address: str, now_ms: int) -> bool:
        """Handshake policy: members as usual, unknown peers on probation."""
        d = self.daemon
        if d.authorize(address):
            return True
        if d.trust.is_revoked(address) or d.trust.remembered_invites(now_ms // 1000) == 0:
            return False
        if address not in self.probation and len(self.probation) >= MAX_PROBATION:
            d.counters["probation_full"] += 1
            return False
        if self.probation.get(address, _CLOSING) == _CLOSING:
            self.probation[address] = now_ms + PROBATION_MS
        return True

    def issue(self, ttl_s: int, now_ms: int, swarm: str | None = None) -> dict[str, Any]:
        """A new single-use invite token into ``swarm`` (default: our home swarm)."""
        if not 0 < ttl_s <= _MAX_TTL_S:
            raise InvalidArgument(f"ttl_s must be 1..{_MAX_TTL_S}")
        d = self.daemon
        now_s = now_ms // 1000
        token = d.trust.issue_invite(d.identity, [d.advertised], ttl_s, now_s, swarm=swarm)
        swarm = swarm or d.trust.swarms()[0]
        return {"token": token, "inviter": d.address, "expires_s": now_s + ttl_s, "swarm": swarm}

    def on_probation_frame(self, peer: str, frame: bytes, now_ms: int) -> bool:
        """Handle a frame from a peer on probation; True if it was admitted."""
        d = self.daemon
        if self.probation.get(peer) == _CLOSING:  # refused: its channel is being closed
            d.counters["probation_ignored"] += 1
            return False
        self.probation[peer] = _CLOSING
        try:
            ftype, fields = decode_frame(frame)
            if ftype != RT_JOIN:
                raise UnknownPeer("on probation: the first frame must be a join proof")
            new, swarm = d.trust.redeem(peer, _proof(fields), now_ms // 1000)
        except UnknownPeer as exc:
            d.counters["probation_violation"] += 1
            d.disconnect_later(peer, "probation violated", error=exc)
            return False
        except HivemeshError as exc:  # a bad proof, or our store failed: its code says which
            d.counters["join_refused"] += 1
            d.counters[f"join_refused_{exc.code}"] += 1
            log.info("refused the join of %s: %s [%s]", short(peer), exc, exc.code)
            d.disconnect_later(peer, "join refused", error=exc)
            return False
        del self.probation[peer]
        self._admitted(peer, new, swarm)
        return True

    def _on_join(self, peer: str, fields: list[Any], now_ms: int) -> None:
        """``RT_JOIN`` from a peer we admit already (our answer was lost)."""
        d = self.daemon
        try:
            new, swarm = d.trust.redeem(peer, _proof(fields), now_ms // 1000)
        except RemoteProtocolError:
            raise  # a malformed frame: the core counts it
        except HivemeshError as exc:
            d.counters["join_refused"] += 1
            d.counters[f"join_refused_{exc.code}"] += 1
            if isinstance(exc, InviteError):
                d.node.send(peer, encode_frame(RT_JOIN_REFUSED, exc.code))
            return
        self._admitted(peer, new, swarm)

    def _admitted(self, peer: str, new: bool, swarm: str) -> None:
        """We brought ``peer`` into ``swarm``: say so in the journal, and to it."""
        d = self.daemon
        if new:
            d.counters["invites_redeemed"] += 1
            d.vouch(peer, swarm)
        d.node.send(peer, encode_frame(RT_JOINED, bytes.fromhex(swarm)))

    def expire(self, now_ms: int) -> None:
        """Close channels whose probation ran out; fail joins past their deadline."""
        for peer in sorted(self.probation):
            if _CLOSING < self.probation[peer] <= now_ms:
                self.probation[peer] = _CLOSING
                self.daemon.counters["probation_expired"] += 1
                self.daemon.disconnect_later(
                    peer, "probation expired", error=UnknownPeer("no join proof in time")
                )
        for inviter in sorted(self.joins):
            pending = self.joins[inviter]
            if pending.deadline_ms <= now_ms:
                seconds = (pending.deadline_ms - pending.started_ms) / 1000
                last = self._last_error(inviter)
                self.fail(
                    inviter,
                    DeadlineExceeded(
                        f"no answer from the inviter {short(inviter)} within {seconds:.0f} s"
                        + (f" (last error: {last})" if last else "")
                    ),
                )

    def next_deadline(self) -> int | None:
        """The earliest probation end or join deadline."""
        deadlines = [t for t in self.probation.values() if t != _CLOSING]
        deadlines += [j.deadline_ms for j in self.joins.values()]
        return min(deadlines, default=None)

    # -- joiner ------------------------------------------------------------------

    def join(self, token: str, now_ms: int, *, timeout_ms: int) -> asyncio.Future[dict[str, Any]]:
        """Start joining through ``token``'s inviter; the future resolves once
        it admits us, or fails with the typed cause (module docs)."""
        d = self.daemon
        invite = accept_invite(token, now_ms // 1000 - EXPIRY_GRACE_S)
        if invite.inviter == d.address:
            raise InvalidArgument("this node issued the invite: run join on the new node")
        inviter = invite.inviter
        old = self.joins.pop(inviter, None)
        if old is not None:
            self._finish(old, None, InvalidArgument("superseded by a newer join"))
        if not d.authorize(inviter):
            self.awaiting.add(inviter)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.joins[inviter] = PendingJoin(
            inviter,
            invite.endpoints,
            join_proof(invite, d.address),
            now_ms,
            now_ms + timeout_ms,
            future,
        )
        d.peer.expect_inviter(inviter)  # it may connect while the join runs
        d.counters["joins_started"] += 1
        if inviter in d.conns.links:
            self.send_proof(inviter)
        d.learn(inviter, list(invite.endpoints))
        return future

    def send_proof(self, peer: str) -> None:
        """On a channel to an inviter we are joining through: the proof first."""
        pending = self.joins.get(peer)
        if pending is not None:
            self.daemon.node.send(peer, encode_frame(RT_JOIN, pending.proof))

    def _on_joined(self, peer: str, fields: list[Any], now_ms: int) -> None:
        """The inviter admitted us into its swarm ``fields[0]``."""
        if len(fields) != 1 or type(fields[0]) is not bytes or len(fields[0]) != 16:
            raise DecodeError("RT_JOINED takes the 16-byte swarm id")
        d = self.daemon
        pending = self.joins.pop(peer, None)
        if pending is None:
            d.counters["joined_unexpected"] += 1
            return
        self.awaiting.discard(peer)
        swarm, now_s = fields[0].hex(), now_ms // 1000
        d.trust.add(peer, now_s, note="inviter")
        members = d.web().swarms.get(swarm)
        if members is None or peer in members:
            d.trust.join_swarm(swarm, peer, now_s)
            d.vouch(peer, swarm)
        else:  # it claims a swarm we are in without being in it: we admit it, no more
            d.counters["join_swarm_conflict"] += 1
            log.warning("%s claims a swarm it is not in; trusting it alone", short(peer))
        d.counters["joins_completed"] += 1
        seconds = round((now_ms - pending.started_ms) / 1000, 3)
        log.info("joined through %s in %.1f s", short(peer), seconds)
        result = {"inviter": peer, "endpoints": list(pending.endpoints), "seconds": seconds}
        self._finish(pending, result, None)
        d.member_up(peer)

    def _on_join_refused(self, peer: str, fields: list[Any], now_ms: int) -> None:
        """The inviter, which admits us already, refused this join."""
        if len(fields) != 1 or type(fields[0]) is not str:
            raise DecodeError("RT_JOIN_REFUSED takes the refusal's code")
        error = peer_close_error(fields[0])
        if not isinstance(error, InviteError):
            raise DecodeError(f"RT_JOIN_REFUSED with an unknown code {fields[0]!r:.40}")
        self.on_refused(peer, error)

    def on_refused(self, peer: str, error: HivemeshError) -> None:
        """``peer`` turned us away (the connection manager's ``on_refused``)."""
        if peer not in self.joins:
            return
        if isinstance(error, PeerIdentityMismatch):  # one stale endpoint: try the others
            targets = [t for t in self.daemon.conns.dial_targets() if t["address"] == peer]
            if not all(t["refused"] for t in targets):
                return
            error = PeerIdentityMismatch(
                f"no endpoint in the invite answers as the inviter {short(peer)}: {error}"
            )
        else:
            error = type(error)(f"the inviter {short(peer)} refused the join: {error}")
        self.fail(peer, error)

    def fail(self, inviter: str, error: HivemeshError) -> None:
        """End the pending join through ``inviter`` (if any) with ``error``."""
        pending = self.joins.pop(inviter, None)
        if pending is None:
            return
        d = self.daemon
        self.awaiting.discard(inviter)
        d.peer.forget_inviter(inviter)  # before asking whether it may still connect
        d.counters[f"join_failed_{error.code}"] += 1
        log.warning("join through %s failed: %s [%s]", short(inviter), error, error.code)
        if not d.authorize(inviter):  # nothing else lets us talk to it: stop dialling
            d.conns.forget(inviter)
            d.disconnect_later(inviter, "join failed")
        self._finish(pending, None, error)

    def _finish(
        self, pending: PendingJoin, result: dict[str, Any] | None, error: HivemeshError | None
    ) -> None:
        self.daemon.peer.forget_inviter(pending.inviter)
        self.results.append(
            {
                "inviter": pending.inviter,
                "started_ms": pending.started_ms,
                "ok": error is None,
                "code": None if error is None else error.code,
                "message": None if error is None else str(error),
            }
        )
        if pending.future.done():
            return
        if error is None:
            pending.future.set_result(result or {})
        else:
            pending.future.set_exception(error)
            pending.future.exception()  # retrieved: nobody may be waiting

    def _last_error(self, inviter: str) -> str | None:
        for t in self.daemon.conns.dial_targets():
            if t["address"] == inviter and t["last_error"]:
                return str(t["last_error"])
        return None

    def status(self, now_ms: int) -> dict[str, Any]:
        """Our swarms and whom we admit; invites, probation, joins in progress
        and their last outcomes."""
        d = self.daemon
        web = d.web()
        return {
            "vouches": d.config.trust_vouches,
            "swarms": {s: sorted(m) for s, m in sorted(web.swarms.items())},
            "admitted": sorted(web.admitted),
            "pending_invites": d.trust.pending_invites(now_ms // 1000),
            "probation": len(self.probation),
            "joining": {
                j.inviter: {
                    "endpoints": list(j.endpoints),
                    "since_ms": j.started_ms,
                    "last_error": self._last_error(j.inviter),
                }
                for j in self.joins.values()
            },
            "joins": list(self.results),
            "refused_by": [t for t in d.conns.dial_targets() if t["refused"]],
        }


def _proof(fields: list[Any]) -> bytes:
    if len(fields) != 1 or type(fields[0]) is not bytes:
        raise DecodeError("RT_JOIN takes one proof")
    proof: bytes = fields[0]
    return proof
