"""SWIM membership and failure detection (with Lifeguard-style suspicion).

Theory of operation
-------------------
Every node runs one :class:`Membership`: a sans-IO state machine fed with
frames (:meth:`Membership.receive`, or the handlers :meth:`attach` registers
on a core :class:`~hivemesh.core.node.Node`) and timer ticks
(:meth:`handle_timer`), emitting frames through the injected ``send`` and
state changes through :meth:`changes`. Time is ``now_ms``; randomness is the
injected ``Random``.

**Probing** (SWIM, Das et al. 2002). Each ``probe_interval_ms`` the node
probes the next member of a freshly shuffled round-robin list (every member
is probed once per round, in random order): ``PING`` the target; no ``ACK``
within ``probe_timeout_ms`` -> ``PING_REQ`` to ``indirect_checks`` other
members, which ping the target and relay its ``ACK`` back; still no ``ACK``
at the end of the period -> the target becomes **suspect**.

**Suspicion** (Lifeguard-lite). A suspect is declared **down** when its
suspicion timer fires. The timer starts at ``max = suspicion_max_timeout_mult
* min`` and shrinks towards ``min = suspicion_mult * max(1, log10(n)) *
probe_interval_ms`` as independent members confirm the suspicion (Dadgar et
al., "Lifeguard", 2017; hashicorp/memberlist uses the same formula), so a
node that only one member cannot reach is not killed quickly, while a real
crash, seen by many, is.

**Stalls.** When :meth:`handle_timer` runs more than a probe interval late
(the event loop was blocked), the current probe is abandoned rather than
failed and due suspicion timers get one more interval, since ACKs and
refutations may be waiting unread.

**Incarnations and refutation.** Every node owns an incarnation number. News
about a member is ordered by it: ``alive(i)`` overrides ``suspect(j)`` and
``dead(j)`` only when ``i > j``; ``suspect(i)`` overrides ``alive(i)``. A live
node that hears itself suspected or declared dead at incarnation ``i``
refutes by announcing ``alive(i + 1)``. A restarted node therefore comes
back up as soon as it hears of its own death (the push-pull exchange of
:meth:`join` tells it at once).

A member probing a suspect puts the suspicion in the ``PING`` itself
(Lifeguard's "buddy system"), so a live suspect learns of it at once and its
``ACK`` already carries the refutation.

**Dissemination.** Alive/suspect/dead/left updates ride on every ``PING``,
``PING_REQ`` and ``ACK`` and on ``GOSSIP`` frames sent every
``gossip_interval_ms`` to ``gossip_nodes`` members while news is pending;
each is retransmitted ``retransmit_mult * ceil(log10(n + 1))`` times (see
:mod:`hivemesh.core.pex`). Alive updates carry the member's dialable
endpoints, so membership is also the peer exchange. Every
``push_pull_interval_ms`` a full-state ``SYNC`` with a random member repairs
whatever gossip missed (dead entries in a full state are downgraded to
suspect, so a live node can still refute them), and a second ``SYNC`` goes
to a random *down* member, kept for ``down_retention_ms``: if it was only
cut off, it refutes its death and a healed partition merges by itself.

Defaults are hashicorp/memberlist's ``DefaultLANConfig`` (probe interval 1 s,
probe timeout 500 ms, 3 indirect checks, suspicion multiplier 4, max timeout
multiplier 6, retransmit multiplier 4, gossip every 200 ms to 3 nodes,
push-pull every 30 s). :meth:`MembershipConfig.detection_bound_ms` gives the
worst-case time for every live member to mark a crashed member down.

**Layout.** The rules that order news by incarnation (the table of what an
``alive``/``suspect``/``dead``/``left`` update does to a member) live in
:mod:`hivemesh.core.membership_news`, mixed into :class:`Membership`; this
module keeps probing, timers and the wire.

**For the runtime.** Drain :meth:`changes` after each input: on ``up`` dial
the member's endpoints and ``node.add_peer``; on ``down``/``left``
``node.remove_peer``, and append a journal event ``member.down`` /
``member.left`` with body ``{"address", "incarnation", "observed_ms"}`` so
that views (claims, leases, health) can release a down member's work
deterministically from the journal (every observer appends its own; views
key them by ``(address, incarnation)``); ``member.up`` likewise on recovery.

Wire frames (fields after the frame type; ``updates`` is a list of
:class:`~hivemesh.core.pex.Update` records):

====================  ======================================
``PING`` (30)         seq, target address, updates
``PING_REQ`` (31)     seq, target address, updates
``ACK`` (32)          seq, updates
``SYNC`` (33)         full state (updates), reply wanted
``GOSSIP`` (34)       updates
====================  ======================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from random import Random
from typing import TYPE_CHECKING, Any

from hivemesh.core.frames import FrameType, decode_frame, encode_frame
from hivemesh.core.membership_news import MemberRecord, NewsRules
from hivemesh.core.pex import (
    UPDATE_OF,
    BroadcastQueue,
    Member,
    MemberChange,
    MembershipConfig,
    MemberState,
    Update,
    UpdateState,
    check_address,
    decode_updates,
    retransmit_limit,
)
from hivemesh.errors import DecodeError, InvalidArgument, RemoteProtocolError, UntrustedAuthor

if TYPE_CHECKING:
    from hivemesh.core.node import Node

# Records and tuning live in pex (shared with peer exchange); re-exported here.
__all__ = ["Member", "MemberChange", "MemberState", "Membership", "MembershipConfig"]

_MAX_SEQ = 2**63 - 1
_LIVE_STATES = (MemberState.UP, MemberState.SUSPECT)


@dataclass(slots=True)
class _Probe:
    seq: int
    target: str
    timeout_at_ms: int
    acked: bool = False
    indirect_sent: bool = False


@dataclass(slots=True)
class _Relay:
    requester: str
    their_seq: int
    expires_ms: int


class Membership(NewsRules):
    """SWIM membership of one node (see the module docstring).

    ``send(address, frame)`` queues a frame for a member (normally
    ``node.send``; the runtime dials the member's endpoints from
    :meth:`members`). ``incarnation`` lets a restarted node start above its
    previous life (optional: refutation gets there anyway). ``admit(address)``
    filters both frames and news: unadmitted peers' frames are refused
    (:class:`~hivemesh.errors.UntrustedAuthor`) and unadmitted members are
    never added (pass ``TrustStore.is_trusted``).
    """

    def __init__(
        self,
        self_address: str,
        endpoints: list[str] | tuple[str, ...],
        rng: Random,
        config: MembershipConfig | None,
        now_ms: int,
        send: Callable[[str, bytes], None],
        *,
        incarnation: int = 0,
        admit: Callable[[str], bool] | None = None,
    ) -> None:
        self.address = check_address(self_address, "self address")
        self.endpoints = tuple(endpoints)
        self.rng = rng
        self.config = config or MembershipConfig()
        self.incarnation = incarnation
        self.counters: Counter[str] = Counter()
        self._send = send
        self._admit = admit
        self._members: dict[str, MemberRecord] = {}
        self._live_n = 0
        self._suspects: set[str] = set()
        self._live_sorted: list[str] | None = None
        self._changes: list[MemberChange] = []
        self._queue = BroadcastQueue(capacity=self.config.max_members)
        self._seq = 0
        self._probe: _Probe | None = None
        self._order: list[str] = []
        self._relays: dict[int, _Relay] = {}
        self._joins: dict[str, int] = {}
        self._left = False
        cfg = self.config
        self._next_probe_ms = now_ms + rng.randrange(cfg.probe_interval_ms)
        self._next_gossip_ms = now_ms + cfg.gossip_interval_ms
        self._next_push_pull_ms = now_ms + self._jitter(cfg.push_pull_interval_ms)
        self._next_join_ms = now_ms + cfg.probe_interval_ms
        self._next_prune_ms = now_ms + cfg.probe_interval_ms * 10
        self._handlers: dict[int, Callable[[str, list[Any], int], None]] = {
            FrameType.PING: self._on_ping,
            FrameType.PING_REQ: self._on_ping_req,
            FrameType.ACK: self._on_ack,
            FrameType.SYNC: self._on_sync,
            FrameType.GOSSIP: self._on_gossip,
        }

    # -- wiring and outputs -------------------------------------------------------

    def attach(self, node: Node) -> None:
        """Register this protocol's frame handlers on a core node."""
        for ftype in sorted(self._handlers):
            node.register_handler(ftype, self._handlers[ftype])

    def receive(self, peer: str, frame: bytes, now_ms: int) -> None:
        """Handle one frame directly (when not attached to a node); counts bad input."""
        try:
            ftype, fields = decode_frame(frame)
            handler = self._handlers.get(ftype)
            if handler is None:
                raise DecodeError(f"not a membership frame type {ftype}")
            handler(peer, fields, now_ms)
        except RemoteProtocolError as exc:
            self.counters[exc.code] += 1

    def members(self) -> list[Member]:
        """Every known member except this node, sorted by address."""
        return [
            Member(r.address, r.state, r.incarnation, r.endpoints, r.since_ms)
            for r in (self._members[a] for a in sorted(self._members))
        ]

    def member(self, address: str) -> Member | None:
        """One member's snapshot, or None if unknown."""
        r = self._members.get(address)
        return (
            None
            if r is None
            else Member(r.address, r.state, r.incarnation, r.endpoints, r.since_ms)
        )

    def state_of(self, address: str) -> MemberState | None:
        """One member's state (None if unknown): :meth:`member` without the snapshot."""
        r = self._members.get(address)
        return None if r is None else r.state

    def changes(self) -> list[MemberChange]:
        """State changes since the last call, in order (drains)."""
        out, self._changes = self._changes, []
        return out

    def next_deadline(self) -> int:
        """When :meth:`handle_timer` should next run (ms)."""
        # asked after every input: comparisons, not min() calls
        d = self._next_probe_ms
        if self._next_push_pull_ms < d:
            d = self._next_push_pull_ms
        if self._next_prune_ms < d:
            d = self._next_prune_ms
        if self._next_gossip_ms < d and self._queue:
            d = self._next_gossip_ms
        if self._next_join_ms < d and self._joins:
            d = self._next_join_ms
        p = self._probe
        if p is not None and p.timeout_at_ms < d and not p.acked and not p.indirect_sent:
            d = p.timeout_at_ms
        if self._suspects:
            members = self._members
            for a in self._suspects:
                t = members[a].suspect_deadline_ms
                if t < d:
                    d = t
        if self._relays:
            for relay in self._relays.values():
                if relay.expires_ms < d:
                    d = relay.expires_ms
        return d

    # -- commands -----------------------------------------------------------------

    def join(self, address: str, endpoints: list[str] | tuple[str, ...], now_ms: int) -> None:
        """Join the swarm through ``address`` (a seed) reachable at ``endpoints``.

        The seed is recorded as up (so the runtime dials it) and a full-state
        ``SYNC`` is exchanged with it, retried every probe interval until it
        answers or ``join_timeout_ms`` passes.
        """
        check_address(address, "seed address")
        if address == self.address:
            raise InvalidArgument("cannot join through ourselves")
        if address not in self._members:
            self._add(address, 0, tuple(endpoints), now_ms)
        elif endpoints and not self._members[address].endpoints:
            self._members[address].endpoints = tuple(endpoints)
        self._joins[address] = now_ms + self.config.join_timeout_ms
        self._send_sync(address, reply=True)

    def leave(self, now_ms: int) -> None:
        """Leave gracefully: announce ``left`` to every live member and stop probing."""
        if self._left:
            return
        self._left = True
        self.incarnation += 1
        frame = encode_frame(FrameType.GOSSIP, [self._self_update(UpdateState.LEFT).encode()])
        for addr in self._live(exclude=None):
            self._send(addr, frame)
        self._probe = None

    def forget(self, address: str, now_ms: int) -> None:
        """Drop ``address`` locally (e.g. its trust was revoked); reported as down.

        Gossip may re-introduce it unless ``admit`` now refuses it.
        """
        rec = self._members.pop(address, None)
        self._joins.pop(address, None)
        if rec is not None and rec.state in (MemberState.UP, MemberState.SUSPECT):
            self._live_n -= 1
            self._suspects.discard(address)
            self._live_sorted = None
            self._changes.append(
                MemberChange(
                    address, rec.state, MemberState.DOWN, rec.incarnation, rec.endpoints, now_ms
                )
            )

    def handle_timer(self, now_ms: int) -> None:
        """Advance probes, suspicion timers, gossip, push-pull and joins."""
        cfg = self.config
        # Far past the probe deadline: our own loop stalled, so a missing ACK
        # proves nothing, and refutations may still sit unread.
        stalled = now_ms - self._next_probe_ms > cfg.probe_interval_ms
        if stalled:
            self.counters["timer_stall"] += 1
            self._probe = None
        p = self._probe
        if p is not None and not p.acked and not p.indirect_sent and now_ms >= p.timeout_at_ms:
            self._send_indirect(p)
        if now_ms >= self._next_probe_ms:
            self._finish_probe(now_ms)
            self._next_probe_ms = now_ms + cfg.probe_interval_ms
            if not self._left:
                self._start_probe(now_ms)
        for addr in sorted(self._suspects):
            r = self._members[addr]
            if now_ms < r.suspect_deadline_ms:
                continue
            if stalled:
                r.suspect_deadline_ms = now_ms + cfg.probe_interval_ms
            else:
                self._set_state(r, MemberState.DOWN, now_ms)
                self._broadcast(
                    Update(UpdateState.DEAD, addr, r.incarnation, r.endpoints, self.address)
                )
        for seq in sorted(self._relays):
            if now_ms >= self._relays[seq].expires_ms:
                del self._relays[seq]
                self.counters["relay_timeout"] += 1
        if now_ms >= self._next_gossip_ms:
            self._next_gossip_ms = now_ms + cfg.gossip_interval_ms
            self._gossip()
        if now_ms >= self._next_push_pull_ms:
            self._next_push_pull_ms = now_ms + self._jitter(cfg.push_pull_interval_ms)
            live = self._live(exclude=None)
            if live and not self._left:
                self._send_sync(self.rng.choice(live), reply=True)
            down = [a for a in sorted(self._members) if self._members[a].state is MemberState.DOWN]
            if down and not self._left:
                # Reconnect attempt (as serf does): heals partitions by itself.
                self._send_sync(self.rng.choice(down), reply=True)
        if self._joins and now_ms >= self._next_join_ms:
            self._next_join_ms = now_ms + cfg.probe_interval_ms
            for addr in sorted(self._joins):
                if now_ms >= self._joins[addr]:
                    del self._joins[addr]
                    self.counters["join_timeout"] += 1
                else:
                    self._send_sync(addr, reply=True)
        if now_ms >= self._next_prune_ms:
            self._next_prune_ms = now_ms + cfg.probe_interval_ms * 10
            for addr in sorted(self._members):
                r = self._members[addr]
                gone = r.state in (MemberState.DOWN, MemberState.LEFT)
                if gone and now_ms - r.since_ms >= cfg.down_retention_ms:
                    del self._members[addr]
                    self._live_sorted = None

    # -- probing ------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq = self._seq + 1 if self._seq < _MAX_SEQ else 1
        return self._seq

    def _start_probe(self, now_ms: int) -> None:
        target = None
        for _ in range(2):
            while self._order:
                cand = self._order.pop()
                r = self._members.get(cand)
                if r is not None and r.state in (MemberState.UP, MemberState.SUSPECT):
                    target = cand
                    break
            if target is not None:
                break
            self._order = self._live(exclude=None)
            self.rng.shuffle(self._order)
        if target is None:
            self._probe = None
            return
        seq = self._next_seq()
        self._probe = _Probe(seq, target, now_ms + self.config.probe_timeout_ms)
        piggy = self._piggyback()
        r = self._members[target]
        if r.state is MemberState.SUSPECT:
            # Lifeguard's buddy system: tell a suspect directly, so it can refute.
            news = Update(UpdateState.SUSPECT, target, r.incarnation, r.endpoints, self.address)
            piggy.insert(0, news.encode())
        self._send(target, encode_frame(FrameType.PING, seq, target, piggy))
        self.counters["probes"] += 1

    def _send_indirect(self, p: _Probe) -> None:
        p.indirect_sent = True
        helpers = self._live(exclude=p.target, up_only=True)
        k = min(self.config.indirect_checks, len(helpers))
        for h in self.rng.sample(helpers, k):
            self._send(h, encode_frame(FrameType.PING_REQ, p.seq, p.target, self._piggyback()))
        self.counters["indirect_probes"] += 1

    def _finish_probe(self, now_ms: int) -> None:
        p, self._probe = self._probe, None
        if p is None or p.acked:
            return
        self.counters["probe_failed"] += 1
        r = self._members.get(p.target)
        if r is None:
            return
        fresh = r.state is MemberState.UP
        if fresh or (r.state is MemberState.SUSPECT and self.address not in r.confirmers):
            # A new suspicion, or our independent confirmation of one.
            self._suspect(r, r.incarnation, self.address, now_ms)
            news = Update(UpdateState.SUSPECT, r.address, r.incarnation, r.endpoints, self.address)
            self._broadcast(news)

    # -- frame handlers -------------------------------------------------------------

    def _check_peer(self, peer: str) -> None:
        if self._admit is not None and not self._admit(peer):
            raise UntrustedAuthor(f"membership frame from unadmitted peer {peer[:12]}")

    def _on_ping(self, peer: str, fields: list[Any], now_ms: int) -> None:
        seq, target, updates = self._probe_fields(fields, "PING")
        self._check_peer(peer)
        self._merge(updates, now_ms)
        if target != self.address:
            self.counters["misrouted_ping"] += 1
            return
        piggy = self._piggyback()
        r = self._members.get(peer)
        if r is not None and r.state is MemberState.DOWN:
            # It thinks it is alive but we hold it dead: tell it, so it refutes.
            piggy.insert(
                0, [int(UpdateState.DEAD), peer, r.incarnation, list(r.endpoints), self.address]
            )
        self._send(peer, encode_frame(FrameType.ACK, seq, piggy))

    def _on_ping_req(self, peer: str, fields: list[Any], now_ms: int) -> None:
        seq, target, updates = self._probe_fields(fields, "PING_REQ")
        self._check_peer(peer)
        self._merge(updates, now_ms)
        if target == self.address:
            self._send(peer, encode_frame(FrameType.ACK, seq, self._piggyback()))
            return
        if len(self._relays) >= self.config.max_relays:
            self.counters["relay_dropped"] += 1
            return
        mine = self._next_seq()
        self._relays[mine] = _Relay(peer, seq, now_ms + self.config.probe_timeout_ms)
        self._send(target, encode_frame(FrameType.PING, mine, target, self._piggyback()))

    def _on_ack(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 2 or type(fields[0]) is not int:
            raise DecodeError("ACK takes seq, updates")
        updates = decode_updates(fields[1])
        self._check_peer(peer)
        self._merge(updates, now_ms)
        seq = fields[0]
        p = self._probe
        if p is not None and p.seq == seq:
            p.acked = True
            return
        relay = self._relays.pop(seq, None)
        if relay is not None:
            self._send(
                relay.requester, encode_frame(FrameType.ACK, relay.their_seq, self._piggyback())
            )
            return
        self.counters["late_ack"] += 1

    def _on_sync(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 2 or type(fields[1]) is not bool:
            raise DecodeError("SYNC takes updates, reply")
        updates = decode_updates(fields[0])
        self._check_peer(peer)
        self._merge(updates, now_ms, full_state=True)
        self._joins.pop(peer, None)
        if fields[1]:
            self._send_sync(peer, reply=False)

    def _on_gossip(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 1:
            raise DecodeError("GOSSIP takes updates")
        updates = decode_updates(fields[0])
        self._check_peer(peer)
        self._merge(updates, now_ms)

    @staticmethod
    def _probe_fields(fields: list[Any], name: str) -> tuple[int, str, list[Update]]:
        if len(fields) != 3 or type(fields[0]) is not int:
            raise DecodeError(f"{name} takes seq, target, updates")
        return fields[0], check_address(fields[1], f"{name} target"), decode_updates(fields[2])

    # -- helpers -----------------------------------------------------------------------

    def _live(self, *, exclude: str | None, up_only: bool = False) -> list[str]:
        if exclude is None and not up_only:  # the common question, kept between changes
            if self._live_sorted is None:
                self._live_sorted = [
                    a for a in sorted(self._members) if self._members[a].state in _LIVE_STATES
                ]
            return self._live_sorted[:]
        ok = (MemberState.UP,) if up_only else _LIVE_STATES
        return [a for a in sorted(self._members) if a != exclude and self._members[a].state in ok]

    def _piggyback(self) -> list[Any]:
        limit = retransmit_limit(self.config.retransmit_mult, self._cluster_size())
        return [u.encode() for u in self._queue.take(self.config.max_piggyback, limit)]

    def _gossip(self) -> None:
        if not self._queue:
            return
        live = self._live(exclude=None)
        for addr in self.rng.sample(live, min(self.config.gossip_nodes, len(live))):
            updates = self._piggyback()
            if not updates:
                break
            self._send(addr, encode_frame(FrameType.GOSSIP, updates))

    def _full_state(self) -> list[Any]:
        state = UpdateState.LEFT if self._left else UpdateState.ALIVE
        out = [self._self_update(state).encode()]
        for addr in sorted(self._members):
            r = self._members[addr]
            out.append(
                [int(UPDATE_OF[r.state]), addr, r.incarnation, list(r.endpoints), self.address]
            )
        return out

    def _send_sync(self, address: str, *, reply: bool) -> None:
        self._send(address, encode_frame(FrameType.SYNC, self._full_state(), reply))

    def _jitter(self, interval_ms: int) -> int:
        return interval_ms // 2 + self.rng.randrange(interval_ms)
