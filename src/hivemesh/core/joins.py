"""Invite probation and joins: the part of a Peer that admits new nodes.

Theory of operation
-------------------
Tokens, proofs and ``trust.json`` are :mod:`hivemesh.trust`'s and stay with
the driver (a file shared with the CLI under a lock); every *decision* is
here. The transport authorises a peer by address only, so the proof travels
in the first frame after the handshake:

* **Inviter.** While the node remembers invites it issued (the driver says
  so: ``invites_open``), its handshake admits an unknown, unrevoked address
  *on probation* (:meth:`Joins.admit_channel`), at most
  :data:`MAX_PROBATION` at once: the link is up, but nothing is sent on it,
  the peer is not a member and does not replicate. Its first frame must be
  ``RT_JOIN`` with a proof; any other frame closes the link with
  ``unknown_peer`` (counted ``probation_violation``), as does silence for
  :data:`PROBATION_MS` (``probation_expired``). A proof goes to the driver
  (:class:`~hivemesh.core.effects.Redeem`), whose trust store checks it and
  marks the invite used; its answer (:meth:`Joins.redeemed`) either admits
  the joiner -- we vouch for it into the invite's swarm, answer
  ``RT_JOINED`` naming that swarm, and the link proceeds as any other -- or
  closes the link with the cause as its CLOSE code (``invite_used``,
  ``invite_expired``, ``invite_unknown``, ``invite_revoked``; counted
  ``join_refused_<code>``). An ``RT_JOIN`` from a peer we admit already is
  answered on the open link: ``RT_JOINED`` again (our first answer was lost
  with its link), or ``RT_JOIN_REFUSED`` with the cause.
* **Joiner.** The driver checks the token and starts a join
  (:class:`~hivemesh.commands.peer.StartJoin`): the inviter, which only this
  *pending join* authorises, is dialled. On its link the node sends
  ``RT_JOIN`` and nothing else until ``RT_JOINED`` (other frames for the
  inviter are dropped, counted ``dropped_before_admission``). Admitted, it
  trusts the inviter, records the swarm it joined and vouches for the
  inviter into it (:class:`~hivemesh.core.effects.TrustEdit` effects the
  driver writes to ``trust.json``) -- unless it is in that swarm already and
  the inviter is not (a claim that would merge swarms: then it trusts the
  inviter alone, counted ``join_swarm_conflict``) -- and membership starts
  through it. A refusal (the inviter's CLOSE code or ``RT_JOIN_REFUSED``,
  ``unknown_peer`` in the handshake, every endpoint of the token proving to
  be another node) or the join's deadline ends it: the command gets the
  typed error, it is counted (``join_failed_<code>``), logged and kept for
  ``status``, and the inviter is no longer dialled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hivemesh.core.effects import Close, Dial, Effect, Redeem, Reply, TrustEdit
from hivemesh.core.frames import FrameType, decode_frame, encode_frame
from hivemesh.errors import (
    DeadlineExceeded,
    DecodeError,
    HivemeshError,
    InvalidArgument,
    InviteError,
    InviteExpired,
    InviteRevoked,
    InviteUnknown,
    InviteUsed,
    PeerIdentityMismatch,
    UnknownPeer,
)

__all__ = ["JOIN_REFUSALS", "MAX_PROBATION", "PROBATION_MS", "Joins"]

RT_JOIN = int(FrameType.RT_JOIN)
RT_JOINED = int(FrameType.RT_JOINED)
RT_JOIN_REFUSED = int(FrameType.RT_JOIN_REFUSED)
_RT_JOIN_BYTE = bytes([FrameType.RT_JOIN])
#: How long an unknown peer may stay linked without presenting a proof.
PROBATION_MS = 10_000
#: Unknown peers on probation at once; more are refused in the handshake.
MAX_PROBATION = 32
_CLOSING = -1  # a probation that ended unadmitted: drop what else arrives until it is gone
_RESULTS_KEPT = 16
#: A refused join's code -> the error the joiner raises, and its text (a
#: CLOSE code or an ``RT_JOIN_REFUSED``).
JOIN_REFUSALS: dict[str, tuple[type[HivemeshError], str]] = {
    InviteUsed.code: (InviteUsed, "the invite was already used by another node"),
    InviteExpired.code: (InviteExpired, "the invite expired (by the inviter's clock)"),
    InviteUnknown.code: (InviteUnknown, "the inviter holds no such invite (foreign or forgotten)"),
    InviteRevoked.code: (InviteRevoked, "the inviter revoked this node"),
}


@dataclass(slots=True)
class _PendingJoin:
    inviter: str
    endpoints: tuple[str, ...]
    proof: bytes
    started_ms: int
    deadline_ms: int
    rid: int


def _short(address: str) -> str:
    return address[:12]


class Joins:
    """Probation for invitees, pending joins for joiners (module docs).

    The Peer passes its effect list and what the rules need of it:
    ``authorize``, ``revoked`` (by ``trust.json``), ``count``, ``log``,
    ``send`` (a frame to a linked peer), ``vouch`` (append our vouch for an
    address into a swarm), ``swarm_members`` (the members of a swarm in our
    web of trust, None if we are not in it),
    ``trust_changed`` (this node trusted an address or joined a swarm: the
    Peer's copy of the trust file follows at once), ``inviters`` (the set of
    inviters the Peer admits while a join runs) and ``link`` (run the Peer's
    link-up rules for a peer now admitted).
    """

    def __init__(
        self,
        fx: list[Effect],
        *,
        authorize: Callable[[str], bool],
        revoked: Callable[[str], bool],
        count: Callable[[str], None],
        log: Callable[[str, str], None],
        send: Callable[[str, bytes], None],
        vouch: Callable[[str, str, int], None],
        swarm_members: Callable[[str], frozenset[str] | None],
        trust_changed: Callable[[str, str | None], None],
        inviters: set[str],
        link: Callable[[str, bytes, int, str | None], None],
    ) -> None:
        self._fx = fx
        self._authorize = authorize
        self._revoked = revoked
        self._count = count
        self._log = log
        self._send = send
        self._vouch = vouch
        self._swarm_members = swarm_members
        self._trust_changed = trust_changed
        self._inviters = inviters
        self._link = link
        #: unknown peers on probation -> when it ends (ms), or _CLOSING
        self.probation: dict[str, int] = {}
        #: links up but not yet admitted (probation, or an inviter not admitting
        #: us yet): peer -> (boot id, endpoint)
        self._held: dict[str, tuple[bytes, str | None]] = {}
        self._redeeming: dict[str, bool] = {}  # peer -> its proof came on probation
        self.joins: dict[str, _PendingJoin] = {}
        #: inviters that do not admit us yet: only RT_JOIN goes to them
        self.awaiting: set[str] = set()
        #: the last joins' outcomes, for ``status``
        self.results: deque[dict[str, Any]] = deque(maxlen=_RESULTS_KEPT)

    # -- the handshake and links ----------------------------------------------------

    def admit_channel(self, address: str, invites_open: bool, now_ms: int) -> bool:
        """Handshake policy: members as usual, unknown peers on probation
        while ``invites_open`` (the node remembers invites it issued)."""
        if self._authorize(address):
            return True
        if not invites_open or self._revoked(address):
            return False
        if address not in self.probation and len(self.probation) >= MAX_PROBATION:
            self._count("probation_full")
            return False
        if self.probation.get(address, _CLOSING) == _CLOSING:
            self.probation[address] = now_ms + PROBATION_MS
        return True

    def link_up(self, peer: str, boot_id: bytes, now_ms: int, endpoint: str | None) -> bool:
        """A link to ``peer`` is up; True if it is admitted now (the Peer
        then runs its link-up rules), False while it is held back."""
        if peer in self.probation:
            self._held[peer] = (boot_id, endpoint)
            return False
        pending = self.joins.get(peer)
        if pending is not None:
            self._send(peer, encode_frame(RT_JOIN, pending.proof))
            if peer in self.awaiting:  # once it admits us
                self._held[peer] = (boot_id, endpoint)
                return False
        return True

    def link_down(self, peer: str) -> None:
        """The link to ``peer`` is gone."""
        self.probation.pop(peer, None)
        self._held.pop(peer, None)
        self._redeeming.pop(peer, None)

    def held(self, peer: str) -> bool:
        """Is ``peer``'s link up but not admitted (its frames are ours)?"""
        return peer in self.probation

    def allowed(self, peer: str, frame: bytes) -> bool:
        """May ``frame`` go to ``peer`` now (only RT_JOIN to an inviter not admitting us)?"""
        if peer in self.awaiting and frame[2:3] != _RT_JOIN_BYTE:
            self._count("dropped_before_admission")
            return False
        return True

    def trust_rechecked(self, now_ms: int) -> None:
        """Trust changed: a peer on probation vouched for meanwhile is a peer
        like any other."""
        for peer in sorted(self.probation):
            if self.probation[peer] != _CLOSING and self._authorize(peer):
                del self.probation[peer]
                self._release(peer, now_ms)

    # -- inviter ----------------------------------------------------------------------

    def probation_frame(self, peer: str, frame: bytes, now_ms: int) -> None:
        """The first frame from a peer on probation: a join proof, or it goes."""
        if self.probation.get(peer) == _CLOSING:  # refused: its link is being closed
            self._count("probation_ignored")
            return
        self.probation[peer] = _CLOSING
        try:
            ftype, fields = decode_frame(frame)
            if ftype != RT_JOIN:
                raise UnknownPeer("on probation: the first frame must be a join proof")
            proof = _proof(fields)
        except (UnknownPeer, DecodeError) as exc:
            self._count("probation_violation")
            err = exc if isinstance(exc, UnknownPeer) else UnknownPeer(str(exc))
            self._fx.append(Close(peer, "probation violated", code=err.code))
            return
        self._redeeming[peer] = True
        self._fx.append(Redeem(peer, proof))

    def on_join(self, peer: str, fields: list[Any], now_ms: int) -> None:
        """``RT_JOIN`` from a peer we admit already (our answer was lost)."""
        proof = _proof(fields)
        self._redeeming[peer] = False
        self._fx.append(Redeem(peer, proof))

    def redeemed(
        self, peer: str, swarm: str | None, new: bool, error: HivemeshError | None, now_ms: int
    ) -> None:
        """The driver's trust store answered ``peer``'s proof: admitted into
        ``swarm`` (``new``: the invite was unused), or refused with ``error``."""
        on_probation = self._redeeming.pop(peer, None)
        if on_probation is None:
            self._count("redeemed_unexpected")
            return
        if error is not None or swarm is None:
            err = error or InvalidArgument("no swarm")
            self._count("join_refused")
            self._count(f"join_refused_{err.code}")
            self._log("info", f"refused the join of {_short(peer)}: {err} [{err.code}]")
            if on_probation:
                self._fx.append(Close(peer, "join refused", code=err.code))
            elif isinstance(err, InviteError):
                self._send(peer, encode_frame(RT_JOIN_REFUSED, err.code))
            return
        self._trust_changed(peer, None)  # the store trusts it now
        if new:
            self._count("invites_redeemed")
            self._vouch(peer, swarm, now_ms)
        self._send(peer, encode_frame(RT_JOINED, bytes.fromhex(swarm)))
        if on_probation:
            self.probation.pop(peer, None)
            self._release(peer, now_ms)

    def _release(self, peer: str, now_ms: int) -> None:
        held = self._held.pop(peer, None)
        if held is not None:
            self._link(peer, held[0], now_ms, held[1])

    # -- joiner -----------------------------------------------------------------------

    def start(
        self,
        rid: int,
        inviter: str,
        endpoints: tuple[str, ...],
        proof: bytes,
        timeout_ms: int,
        linked: bool,
        now_ms: int,
    ) -> None:
        """Join through ``inviter`` (command ``rid``; ``linked``: a link to it is up)."""
        old = self.joins.pop(inviter, None)
        if old is not None:
            self._finish(old, None, InvalidArgument("superseded by a newer join"))
        if not self._authorize(inviter):
            self.awaiting.add(inviter)
        self.joins[inviter] = _PendingJoin(
            inviter, endpoints, proof, now_ms, now_ms + timeout_ms, rid
        )
        self._inviters.add(inviter)  # it may connect while the join runs
        self._count("joins_started")
        if linked:
            self._send(inviter, encode_frame(RT_JOIN, proof))
        self._fx.append(Dial(inviter, endpoints))

    def on_joined(self, peer: str, fields: list[Any], now_ms: int) -> None:
        """The inviter admitted us into its swarm ``fields[0]``."""
        if len(fields) != 1 or type(fields[0]) is not bytes or len(fields[0]) != 16:
            raise DecodeError("RT_JOINED takes the 16-byte swarm id")
        pending = self.joins.pop(peer, None)
        if pending is None:
            self._count("joined_unexpected")
            return
        self.awaiting.discard(peer)
        swarm = fields[0].hex()
        self._fx.append(TrustEdit(peer, note="inviter"))
        self._trust_changed(peer, None)
        members = self._swarm_members(swarm)
        if members is None or peer in members:
            self._fx.append(TrustEdit(peer, swarm=swarm))
            self._trust_changed(peer, swarm)
            self._vouch(peer, swarm, now_ms)
        else:  # it claims a swarm we are in without being in it: we admit it, no more
            self._count("join_swarm_conflict")
            self._log("warning", f"{_short(peer)} claims a swarm it is not in; trusting it alone")
        self._count("joins_completed")
        seconds = round((now_ms - pending.started_ms) / 1000, 3)
        self._log("info", f"joined through {_short(peer)} in {seconds:.1f} s")
        result = {"inviter": peer, "endpoints": list(pending.endpoints), "seconds": seconds}
        self._finish(pending, result, None)
        self._release(peer, now_ms)

    def on_join_refused(self, peer: str, fields: list[Any], now_ms: int) -> None:
        """The inviter, which admits us already, refused this join."""
        if len(fields) != 1 or type(fields[0]) is not str or fields[0] not in JOIN_REFUSALS:
            raise DecodeError(f"RT_JOIN_REFUSED takes a refusal's code, got {fields!r:.60}")
        cls, text = JOIN_REFUSALS[fields[0]]
        self.refused(peer, cls(text), True, now_ms)

    def refused(self, peer: str, error: HivemeshError, exhausted: bool, now_ms: int) -> None:
        """``peer`` turned us away (``exhausted``: every endpoint we dial for
        it refused, for an identity mismatch)."""
        if peer not in self.joins:
            return
        if isinstance(error, PeerIdentityMismatch):  # one stale endpoint: try the others
            if not exhausted:
                return
            error = PeerIdentityMismatch(
                f"no endpoint in the invite answers as the inviter {_short(peer)}: {error}"
            )
        else:
            error = type(error)(f"the inviter {_short(peer)} refused the join: {error}")
        self.fail(peer, error)

    def fail(self, inviter: str, error: HivemeshError) -> None:
        """End the pending join through ``inviter`` (if any) with ``error``."""
        pending = self.joins.pop(inviter, None)
        if pending is None:
            return
        self.awaiting.discard(inviter)
        self._inviters.discard(inviter)  # before asking whether it may still connect
        self._count(f"join_failed_{error.code}")
        self._log("warning", f"join through {_short(inviter)} failed: {error} [{error.code}]")
        if not self._authorize(inviter):  # nothing else lets us talk to it: stop dialling
            self._held.pop(inviter, None)
            self._fx.append(Close(inviter, "join failed", forget=True))
        self._finish(pending, None, error)

    def _finish(
        self, pending: _PendingJoin, result: dict[str, Any] | None, error: HivemeshError | None
    ) -> None:
        self._inviters.discard(pending.inviter)
        self.results.append(
            {
                "inviter": pending.inviter,
                "started_ms": pending.started_ms,
                "ok": error is None,
                "code": None if error is None else error.code,
                "message": None if error is None else str(error),
            }
        )
        self._fx.append(Reply(pending.rid, result, error))

    # -- time ---------------------------------------------------------------------------

    def handle_timer(self, now_ms: int) -> None:
        """Close links whose probation ran out; fail joins past their deadline."""
        for peer in sorted(self.probation):
            if _CLOSING < self.probation[peer] <= now_ms:
                self.probation[peer] = _CLOSING
                self._count("probation_expired")
                self._fx.append(Close(peer, "no join proof in time", code=UnknownPeer.code))
        for inviter in sorted(self.joins):
            pending = self.joins[inviter]
            if pending.deadline_ms <= now_ms:
                seconds = (pending.deadline_ms - pending.started_ms) / 1000
                self.fail(
                    inviter,
                    DeadlineExceeded(
                        f"no answer from the inviter {_short(inviter)} within {seconds:.0f} s"
                    ),
                )

    def next_deadline(self) -> int | None:
        """The earliest probation end or join deadline."""
        if not self.probation and not self.joins:
            return None  # asked after every input: the common case first
        deadlines = [t for t in self.probation.values() if t != _CLOSING]
        deadlines += [j.deadline_ms for j in self.joins.values()]
        return min(deadlines, default=None)

    def status(self) -> dict[str, Any]:
        """Probation, joins in progress and the last joins' outcomes."""
        return {
            "probation": len(self.probation),
            "joining": {
                j.inviter: {"endpoints": list(j.endpoints), "since_ms": j.started_ms}
                for j in self.joins.values()
            },
            "joins": list(self.results),
        }


def _proof(fields: list[Any]) -> bytes:
    if len(fields) != 1 or type(fields[0]) is not bytes:
        raise DecodeError("RT_JOIN takes one proof")
    proof: bytes = fields[0]
    return proof
