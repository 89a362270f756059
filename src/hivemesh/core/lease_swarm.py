"""The swarm's lease quorum inside a Peer: every node votes, any node proposes.

Theory of operation
-------------------
The protocol is :mod:`hivemesh.core.lease_quorum` (sans-IO :class:`Voter`
and :class:`Proposer`); :class:`SwarmLeases` is the part of a
:class:`~hivemesh.core.peer.Peer` that runs one of each over the node's links
and decides everything around them. Its driver moves the bytes and the voter
log's I/O and decides nothing.

* **Transport.** Lease messages travel as ``FrameType.LEASE`` frames
  ``[40, sub, message]`` over the node's authenticated, encrypted links
  (``sub`` 0 = request to a voter, 1 = reply to a proposer), as
  :class:`~hivemesh.core.effects.Send` effects queued at once (lease frames
  need no ordering with the journal's). A request is voted on only when the
  Peer's ``authorize`` admits its sender, so a revoked or untrusted node
  never votes or gets a vote; the proposer ignores replies from outside its
  voter set. The node's own votes are taken in process, without a frame,
  after the frames to the other voters were queued (their disk work then
  overlaps with the other voters' work).
* **Durability.** A vote that changes the voter's durable state (per
  resource a token bound, and the longest TTL) asks the driver to write it to
  the voter log (:class:`~hivemesh.core.effects.LeaseLog`). *Group commit:*
  a reply made after a write waits until the driver reports that log synced
  (:class:`~hivemesh.core.effects.LeaseSync` effect, then the input
  ``Peer.lease_synced(upto)``); replies leave in the order they were made,
  and none before every write made up to it is synced (a reply may depend on
  earlier state even when it changed nothing itself). *Token reserve:* the
  bound written is the token plus :data:`TOKEN_RESERVE`, so a resource's next
  1024 grants at this voter write nothing (:mod:`hivemesh.core.lease_voter`).
  A failed write or sync stops the voter for good (``disk_error``): its
  memory may be ahead of its disk, and a retransmitted request would be
  acknowledged from memory alone; the rest of the quorum carries on.
* **Clocks.** Voter expiries and proposer deadlines use the Peer's ``now``,
  which the daemon takes from a monotonic clock; only rates matter (see
  :mod:`hivemesh.leases._api`).
* **Voter set.** Every proposer must use the *same* voter set, else two
  majorities need not intersect. It is the configured one (``lease_voters``,
  the recommended way) or, when empty: the set saved by an earlier life
  (``lease_voters.json``, read by the driver), else the earliest set
  published in the journal (``lease.voters`` events, :class:`VotersView`),
  else this node and every member it sees up *when it first needs the set*
  (then published). A set fixed here is handed to the driver to save
  (:class:`~hivemesh.core.effects.SaveVoters`). That default is only right
  for a swarm that is fully formed before the first lease operation.
  **Reconfiguration is not supported online:** stop lease users, give every
  node the same new list, restart; tokens stay monotonic only if the new
  set's majorities intersect the old set's.
* **Thrifty rounds.** Each phase is first sent to a majority only: this
  node's own voter and the voters with a live link that membership sees up;
  the rest are asked at the first retransmission (50 ms).
* **Fast acquire.** A resource this node already ran operations on is
  acquired in one round; any refusal falls back to prepare + accept.
* **Failure.** A crashed holder's lease expires after its TTL at the voters;
  up to ``N - majority`` voters may be down. Every operation has the
  caller's deadline; no majority in time -> an ``unknown`` outcome.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hivemesh.core.effects import Effect, LeaseLog, LeaseSync, SaveVoters, Send
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.hlc import MAX_DRIFT_MS
from hivemesh.core.identity import public_key_of
from hivemesh.core.lease_quorum import Op, Outcome, Proposer, Voter
from hivemesh.core.witness import KIND_WITNESS, WitnessIndex
from hivemesh.errors import ConfigError, DecodeError, InvalidAddress

__all__ = ["KIND_VOTERS", "SUB_REPLY", "SUB_REQUEST", "TOKEN_RESERVE", "SwarmLeases", "VotersView"]

SUB_REQUEST, SUB_REPLY = 0, 1
#: Token bound written ahead per resource (see :mod:`hivemesh.core.lease_voter`):
#: a voter writes its log about once per this many acquires of a resource.
TOKEN_RESERVE = 1024
KIND_VOTERS = "lease.voters"
#: A proposer's default deadline and retransmission period.
_TIMEOUT_MS, _RETRANSMIT_MS = 2000, 50


class VotersView:
    """The earliest ``lease.voters {v: [addresses]}`` event by ``(order_hlc, author)``.

    A node that fixes its voter set from membership publishes it; a node that
    needs a set later adopts the earliest published one, so late joiners use
    the swarm's set instead of their own view of membership. *Earliest* is
    judged by witnesses (:mod:`hivemesh.core.witness`, window
    ``MAX_DRIFT_MS``), so a trusted peer cannot impose its own voter set on
    late joiners by stamping it ``hlc=1``.
    """

    kinds = frozenset({KIND_VOTERS, KIND_WITNESS})
    #: Kinds the node must witness for this view's order (core.witness).
    witnessed_kinds = frozenset({KIND_VOTERS})

    def __init__(self) -> None:
        self._sets: dict[tuple[bytes, int], tuple[int, list[str]]] = {}  # (author, seq) -> hlc, v
        self.witnesses = WitnessIndex()
        self.rejected = 0

    @property
    def earliest(self) -> list[str] | None:
        """The earliest published voter set, or None."""
        if not self._sets:
            return None
        order = self.witnesses.order

        def key(item: tuple[tuple[bytes, int], tuple[int, list[str]]]) -> tuple[int, bytes]:
            (author, seq), (hlc, _v) = item
            return order(author, seq, hlc, MAX_DRIFT_MS), author

        return min(self._sets.items(), key=key)[1][1]

    def apply(self, event: Any) -> None:
        """Fold one ``lease.voters`` or witness event in (malformed bodies are counted)."""
        if event.kind == KIND_WITNESS:
            self.witnesses.apply(event)
            return
        body = event.body
        v = body.get("v") if isinstance(body, dict) else None
        if not (isinstance(v, list) and 0 < len(v) <= 99 and all(isinstance(a, str) for a in v)):
            self.rejected += 1
            return
        try:
            for a in v:
                public_key_of(a)
        except InvalidAddress:
            self.rejected += 1
            return
        self._sets[(event.author, event.seq)] = (event.hlc, sorted(set(v)))


@dataclass(frozen=True, slots=True)
class LeaseSetup:
    """What a node's leases start from (read by the driver, passed to the Peer)."""

    #: the voter's durable state (:meth:`Voter.snapshot`; None: a new voter)
    voter_state: dict[str, Any] | None = None
    #: the voter set an earlier life fixed (``lease_voters.json``; None: none)
    saved_voters: tuple[str, ...] | None = None


class SwarmLeases:
    """One node's voter and proposer (module docs).

    ``fx`` is the Peer's effect list (appended to), ``authorize`` its
    admission check, ``live`` lists the voters to ask first (self, then the
    live ones), ``members_up`` the members seen up now, ``publish`` appends
    a ``lease.voters`` event, ``nonce`` draws the proposer id's randomness.
    """

    def __init__(
        self,
        address: str,
        setup: LeaseSetup,
        configured: Iterable[str],
        now_ms: int,
        *,
        fx: list[Effect],
        authorize: Callable[[str], bool],
        live: Callable[[list[str]], list[str]],
        members_up: Callable[[], list[str]],
        publish: Callable[[list[str], int], None],
        nonce: Callable[[], int],
    ) -> None:
        self.address = address
        self.counters: Counter[str] = Counter()
        self.voter = Voter(
            address, state=setup.voter_state, now_ms=now_ms, token_reserve=TOKEN_RESERVE
        )
        self.published = VotersView()
        self._configured = sorted(set(configured))
        self._saved = setup.saved_voters
        self._fx = fx
        self._authorize = authorize
        self._live = live
        self._members_up = members_up
        self._publish = publish
        self._nonce = nonce
        self.proposer: Proposer | None = None
        self._rids: dict[int, int] = {}  # proposer rid -> the Peer's command rid
        self._outcomes: list[tuple[int, Outcome]] = []
        self._own: list[Any] = []  # own votes, taken after the frames to others
        self._written = 0  # voter log writes asked for
        self._synced = 0  # ... of which the driver reported synced
        self._sync_asked = 0  # the highest LeaseSync(upto) asked for
        self._held: list[tuple[int, str, list[object]]] = []  # (write, peer, reply)
        #: set when the voter log failed: this voter votes no more (fail-stop)
        self.disk_error: str | None = None

    # -- the voter set ----------------------------------------------------------------

    def voters(self, now_ms: int) -> list[str]:
        """The voter set this node proposes to (fixed at first use; module docs)."""
        if self.proposer is not None:
            return list(self.proposer.voters)
        if self._configured:
            voters = list(self._configured)
        elif self._saved is not None:
            voters = sorted(self._saved)
        elif self.published.earliest is not None:
            voters = list(self.published.earliest)  # a late joiner adopts the swarm's set
            self._fx.append(SaveVoters(tuple(voters)))
        else:
            voters = sorted({self.address, *self._members_up()})
            self._fx.append(SaveVoters(tuple(voters)))
            self._publish(voters, now_ms)
        for v in voters:
            try:
                public_key_of(v)
            except InvalidAddress as e:
                raise ConfigError(f"lease voter {v!r} is not an address") from e
        self.proposer = Proposer(
            voters,
            timeout_ms=_TIMEOUT_MS,
            retransmit_ms=_RETRANSMIT_MS,
            proposer_id=f"{self.address[:20]}/{self._nonce():012x}",
            fanout=len(voters) // 2 + 1,  # thrifty: ask a majority of live voters first
            fast_acquire=True,  # known resource: accept without prepare (one round)
        )
        return list(voters)

    # -- inputs (the Peer calls these) ------------------------------------------------------

    def start(self, rid: int, op: Op, timeout_ms: int, now_ms: int) -> None:
        """Run ``op`` for the Peer's command ``rid`` (its outcome via :meth:`outcomes`)."""
        self.voters(now_ms)
        p = self.proposer
        assert p is not None
        p.prefer(self._live(p.voters))
        self._rids[p.start(op, now_ms, timeout_ms=max(1, timeout_ms))] = rid
        self.pump(now_ms)

    def on_frame(self, peer: str, fields: list[Any], now_ms: int) -> None:
        """A ``LEASE`` frame from ``peer`` (the Node's frame handler)."""
        if len(fields) != 2 or fields[0] not in (SUB_REQUEST, SUB_REPLY):
            raise DecodeError("lease frame must be [sub, message]")
        sub, msg = fields
        if sub == SUB_REQUEST:
            if not self._authorize(peer):
                self.counters["lease_unauthorized"] += 1
                return
            reply = self._vote(msg, now_ms)
            if reply is not None:
                self._answer(peer, reply, now_ms)
            return
        if self.proposer is None:
            self.counters["lease_stale_reply"] += 1
            return
        self.proposer.receive(peer, msg, now_ms)
        self.pump(now_ms)

    def synced(self, upto: int, error: str | None, now_ms: int) -> None:
        """The driver synced the voter log's writes up to ``upto`` (or a
        write or the sync failed with ``error``)."""
        if self.disk_error is not None:
            return
        if error is not None:
            self._disk_failed(error)
            return
        self._synced = max(self._synced, upto)
        if self._synced >= self._written:
            self.counters["voter_fsync"] += 1
        ready = [h for h in self._held if h[0] <= self._synced]
        if len(ready) > 1:
            self.counters["voter_group_commit_replies"] += len(ready)
        for i, (_w, peer, reply) in enumerate(self._held):
            if _w > self._synced:
                self._held = self._held[i:]
                self._ask_sync()
                break
            self._deliver(peer, reply, now_ms)
        else:
            self._held = []
        self.pump(now_ms)

    def handle_timer(self, now_ms: int) -> None:
        """Retransmit, end operations whose deadline passed."""
        if self.proposer is not None:
            self.proposer.handle_timer(now_ms)
            self.pump(now_ms)

    # -- outputs ---------------------------------------------------------------------

    def outcomes(self) -> list[tuple[int, Outcome]]:
        """Finished operations as ``(command rid, outcome)`` (drains)."""
        out, self._outcomes = self._outcomes, []
        return out

    def next_deadline(self) -> int | None:
        """The proposer's next retransmission or deadline (None: idle)."""
        return None if self.proposer is None else self.proposer.next_deadline()

    def statistics(self) -> dict[str, Any]:
        """Counters of the voter, proposer and this part, the voter set if
        fixed, and why the voter stopped (``disk_error``, None while it votes)."""
        p = self.proposer
        return {
            "voters": list(p.voters) if p else None,
            "voter": dict(sorted(self.voter.counters.items())),
            "proposer": dict(sorted(p.counters.items())) if p else {},
            "mesh": dict(sorted(self.counters.items())),
            "disk_error": self.disk_error,
        }

    # -- internals ---------------------------------------------------------------------

    def pump(self, now_ms: int) -> None:
        """Frames to other voters first, then the own votes, then outcomes."""
        p = self.proposer
        if p is None:
            return
        while True:
            for vid, msg in p.outbox():
                if vid == self.address:
                    self._own.append(msg)
                else:
                    self._send(vid, SUB_REQUEST, msg)
            if not self._own:
                break
            own, self._own = self._own, []
            for msg in own:
                try:
                    reply = self._vote(msg, now_ms)
                except DecodeError:
                    self.counters["lease_local_decode"] += 1
                    continue
                if reply is not None:
                    self._answer(self.address, reply, now_ms)
        for ev in p.events():
            rid = self._rids.pop(ev.rid, None)
            if rid is not None:
                self._outcomes.append((rid, ev))

    def _vote(self, msg: Any, now_ms: int) -> list[object] | None:
        """Apply a request; ask for any durable change to be written. The
        reply, or None if the voter stopped on a disk error."""
        if self.disk_error is not None:
            self.counters["voter_stopped_disk_error"] += 1
            return None
        resource = msg[2] if isinstance(msg, list) and len(msg) > 2 else None
        before = self.voter.durable(resource) if isinstance(resource, str) else None
        reply = self.voter.receive(msg, now_ms)  # DecodeError: counted by the node
        if before is not None:
            after = self.voter.durable(str(resource))
            if after != before:
                self._written += 1
                self._fx.append(LeaseLog(str(resource), after[0], after[1]))
                self.counters["voter_log_write"] += 1
        return reply

    def _answer(self, peer: str, reply: list[object], now_ms: int) -> None:
        """Send ``reply`` -- after the voter log's sync if a write made up
        to now is not synced yet (module docs: in order)."""
        if self._synced >= self._written and not self._held:
            self._deliver(peer, reply, now_ms)
            return
        self._held.append((self._written, peer, reply))
        self._ask_sync()

    def _ask_sync(self) -> None:
        if self._sync_asked < self._written:
            self._sync_asked = self._written
            self._fx.append(LeaseSync(self._written))

    def _deliver(self, peer: str, reply: list[object], now_ms: int) -> None:
        if peer != self.address:
            self._send(peer, SUB_REPLY, reply)
            self.counters["voted"] += 1
        elif self.proposer is not None:
            self.proposer.receive(peer, reply, now_ms)

    def _send(self, peer: str, sub: int, msg: list[object]) -> None:
        self._fx.append(Send(peer, encode_frame(FrameType.LEASE, sub, msg)))

    def _disk_failed(self, error: str) -> None:
        self.disk_error = error
        self.counters["voter_disk_error"] += 1
        self._held.clear()
