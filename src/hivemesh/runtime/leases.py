"""Quorum leases and claims inside the swarm: every daemon votes, any daemon proposes.

Theory of operation
-------------------
The protocol is :mod:`hivemesh.core.lease_quorum` (sans-IO ``Voter`` and
``Proposer``); this module is only its pump inside a :class:`~hivemesh.runtime.daemon.Daemon`
(the shape of :mod:`hivemesh.leases._quorum`, with the node's channels instead
of UDP):

* **Transport.** Lease messages travel as ``FrameType.LEASE`` frames
  ``[40, sub, message]`` over the node's authenticated, encrypted channels
  (``sub`` 0 = request to a voter, 1 = reply to a proposer). A frame only
  arrives on a channel whose peer passed the handshake and ``authorize``; the
  voter checks ``authorize`` again, so a revoked or untrusted node never
  votes or gets a vote. The proposer ignores replies from outside its voter
  set. The node's own vote is handled in process, without a frame, after the
  frames to the other voters left. Lease frames go straight onto the peer's
  channel -- onto the socket itself when the channel is idle and this loop
  turn wrote nothing to it yet (``SecureChannel.send_now``) -- not through the core's outbox and the
  daemon's flush; a full or closing channel falls back to that path.
* **Durability.** The voter's durable state (per resource a token bound,
  and the longest TTL) is appended to ``<data_dir>/lease_voter.log``
  (:mod:`hivemesh.runtime.voterlog`). *Group commit:* every vote of one
  event-loop turn writes its change, one ``fdatasync`` follows, and only then
  do the replies leave -- in order, and none before every change made up to
  it is synced (a reply may depend on earlier state even when it changed
  nothing itself). A vote that acknowledged something therefore survives a
  ``kill -9`` or power loss at any point; a restored voter refuses writes
  for the longest TTL it ever granted. *Token reserve:* the bound written is
  the token plus :data:`TOKEN_RESERVE`, so a resource's next 1024 grants at
  this voter sync nothing (:mod:`hivemesh.core.lease_voter` argues why that
  keeps tokens monotonic; they jump by up to that much after a restart). A
  release never changes durable state. A failed log write or sync stops the
  voter for good (``disk_error``; the rest of the quorum carries on): its
  memory may be ahead of its disk, and a retransmitted request would be
  acknowledged from memory alone.
* **Clocks.** Voter expiries and proposer deadlines use the event loop's
  monotonic clock, never wall time; only rates matter (see :mod:`hivemesh.leases._api`).
* **Voter set.** Every proposer must use the *same* voter set, else two
  majorities need not intersect. It is ``lease_voters`` from the config (a
  list of addresses, the recommended way) or, when empty: the earliest set
  published in the journal (``lease.voters`` events, :class:`VotersView`),
  else this node and every member it sees up *when it first needs the set*
  (then published). It is written to ``<data_dir>/lease_voters.json`` and
  reused after restarts. That default is only right for a swarm that is
  fully formed before the first lease operation (the e2e tests check all
  nodes agree, with the ``lease.voters`` op); two nodes fixing their sets at
  the same moment from different membership views would disagree.
  **Reconfiguration is not supported online:** to change the set, stop
  lease users, make every node's set the same new list (config or the json
  file), and restart; tokens stay monotonic only if the new set's
  majorities intersect the old set's majorities (e.g. add or remove one voter
  at a time, with all old voters' state kept).
* **Thrifty rounds.** Each phase is first sent to a majority only: this
  node's own voter and the voters it has a live channel to (membership up);
  the rest are asked at the first retransmission (50 ms) if those do not
  all answer. Half the frames and CPU of asking everyone, same safety.
* **Fast acquire.** A resource this node already ran operations on is
  acquired in one round (accept with the next token; the voters' own checks
  keep it safe); any refusal falls back to prepare + accept.
* **Failure.** A crashed holder's lease simply expires after its TTL at the
  voters (nothing to release); up to ``N - majority`` voters may be down.
  Every operation has the caller's deadline; no majority in time ->
  :class:`~hivemesh.errors.BackendUnavailable` (outcome unknown).

Claims (:class:`MeshClaims`, re-exported here) live in :mod:`hivemesh.runtime.claims`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.hlc import MAX_DRIFT_MS
from hivemesh.core.identity import public_key_of
from hivemesh.core.lease_quorum import Acquire, Op, Outcome, Proposer, Release, Renew, Show, Voter
from hivemesh.core.pex import MemberState
from hivemesh.core.witness import KIND_WITNESS, WitnessIndex
from hivemesh.errors import (
    BackendUnavailable,
    ConfigError,
    DecodeError,
    HivemeshError,
    InvalidAddress,
)
from hivemesh.leases import LeaseClient, LeaseInfo
from hivemesh.leases.errors import LeaseContended
from hivemesh.runtime.claims import MeshClaims
from hivemesh.runtime.voterlog import VoterLog
from hivemesh.stores.private import write_private

if TYPE_CHECKING:
    from hivemesh.runtime.daemon import Daemon

__all__ = [
    "TOKEN_RESERVE",
    "DaemonLeaseBackend",
    "MeshClaims",
    "MeshLeases",
    "VotersView",
    "attach",
]

log = logging.getLogger("hivemesh.runtime.leases")

SUB_REQUEST, SUB_REPLY = 0, 1
#: Token bound written ahead per resource (see :mod:`hivemesh.core.lease_voter`):
#: a voter syncs its log about once per this many acquires of a resource.
TOKEN_RESERVE = 1024
_VOTER_STATE = "lease_voter.log"
_VOTERS_FILE = "lease_voters.json"


KIND_VOTERS = "lease.voters"


def wall_ms() -> int:
    """Wall-clock milliseconds (event timestamps)."""
    return time.time_ns() // 1_000_000


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


def _mono_ms() -> int:
    return int(asyncio.get_running_loop().time() * 1000)


class MeshLeases:
    """One daemon's voter and proposer (see module docs)."""

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.counters: Counter[str] = Counter()
        self.log = VoterLog(daemon.config.data_dir / _VOTER_STATE)
        state = self.log.open()
        self.voter = Voter(
            daemon.address, state=state, now_ms=_mono_ms(), token_reserve=TOKEN_RESERVE
        )
        self._proposer: Proposer | None = None
        self._futures: dict[int, asyncio.Future[Outcome]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._client: LeaseClient | None = None
        self._local: list[Any] = []  # own votes waiting for _local_votes
        self._local_scheduled = False
        self._held: list[tuple[str, list[object]]] = []  # replies waiting for the sync
        self._commit_scheduled = False
        #: set when the voter log failed: this voter stops voting (fail-stop)
        self.disk_error: str | None = None
        self._closed = False
        self.published = VotersView()
        daemon.node.add_view(self.published)
        daemon.node.register_handler(FrameType.LEASE, self._on_frame)

    # -- voter set ----------------------------------------------------------------

    def voters(self) -> list[str]:
        """The voter set this node proposes to (fixed at first use; see module docs)."""
        if self._proposer is not None:
            return list(self._proposer.voters)
        configured = self.d.config.lease_voters
        path = self.d.config.data_dir / _VOTERS_FILE
        if configured:
            voters = sorted(set(configured))
        elif path.exists():
            try:
                voters = sorted(json.loads(path.read_text())["voters"])
            except (ValueError, KeyError, TypeError) as e:
                raise ConfigError(f"bad {path}: {e!r}") from e
        elif self.published.earliest is not None:
            voters = list(self.published.earliest)  # a late joiner adopts the swarm's set
            self._save_voters(path, voters)
        else:
            up = [
                m.address
                for m in self.d.peer.membership.members()
                if m.state in (MemberState.UP, MemberState.SUSPECT)
            ]
            voters = sorted({self.d.address, *up})
            self._save_voters(path, voters)
            self.d.node.append(KIND_VOTERS, {"v": voters}, wall_ms())
            self.d._schedule_flush()
        for v in voters:
            try:
                public_key_of(v)
            except InvalidAddress as e:
                raise ConfigError(f"lease voter {v!r} is not an address") from e
        self._proposer = Proposer(
            voters,
            timeout_ms=2000,
            retransmit_ms=50,
            proposer_id=f"{self.d.address[:20]}/{secrets.token_hex(6)}",
            fanout=len(voters) // 2 + 1,  # thrifty: ask a majority of live voters first
            fast_acquire=True,  # known resource: accept without prepare (one round)
        )
        return list(voters)

    @staticmethod
    def _save_voters(path: Path, voters: list[str]) -> None:
        write_private(path, json.dumps({"voters": voters}).encode())

    # -- voter side -----------------------------------------------------------------

    def _vote(self, msg: Any) -> list[object] | None:
        """Apply a request, write any durable change to the log (synced by
        :meth:`_commit` before the reply leaves); the reply, or None if the
        voter stopped on a disk error."""
        if self.disk_error is not None or self._closed:
            self.counters["voter_stopped_disk_error" if self.disk_error else "voter_closed"] += 1
            return None
        resource = msg[2] if isinstance(msg, list) and len(msg) > 2 else None
        before = self.voter.durable(resource) if isinstance(resource, str) else None
        reply = self.voter.receive(msg, _mono_ms())  # DecodeError: counted by the node
        if before is not None:
            after = self.voter.durable(str(resource))
            if after != before:
                try:
                    self.log.write(str(resource), *after)
                except OSError as e:
                    self._disk_failed(e)
                    return None
                self.counters["voter_log_write"] += 1
        return reply

    def _disk_failed(self, e: OSError) -> None:
        """Fail-stop: the voter's memory may now be ahead of its disk, and a
        retransmitted request could be acknowledged from memory alone, so it
        answers nothing more (the other voters carry on; restart the node)."""
        self.disk_error = f"{type(e).__name__}: {e}"
        self.counters["voter_disk_error"] += 1
        self._held.clear()
        log.error("lease voter log %s failed, voter stopped: %s", self.log.path, e)

    def _answer(self, peer: str, reply: list[object]) -> None:
        """Send ``reply`` to ``peer`` (this node: its own proposer) -- after
        the group commit if any change is written and not yet synced.

        Replies leave in the order they were made, and none before every
        change made up to it is durable: a reply may depend on earlier state
        (a renew or prepare after an accept) even when it changed nothing.
        """
        if not (self.log.pending or self._held):
            self._deliver(peer, reply)
            return
        self._held.append((peer, reply))
        if not self._commit_scheduled:
            self._commit_scheduled = True
            asyncio.get_running_loop().call_soon(self._commit)

    def _commit(self) -> None:
        """Group commit: one ``fdatasync`` for the votes of this event-loop
        turn, then their replies, in order."""
        self._commit_scheduled = False
        if self._closed:
            return
        try:
            if self.log.sync():
                self.counters["voter_fsync"] += 1
        except OSError as e:
            self._disk_failed(e)
            return
        held, self._held = self._held, []
        if len(held) > 1:
            self.counters["voter_group_commit_replies"] += len(held)
        for peer, reply in held:
            self._deliver(peer, reply)
        self._pump()

    def _deliver(self, peer: str, reply: list[object]) -> None:
        if peer != self.d.address:
            self._send(peer, encode_frame(FrameType.LEASE, SUB_REPLY, reply))
            self.counters["voted"] += 1
        elif self._proposer is not None:
            self._proposer.receive(peer, reply, _mono_ms())

    def _send(self, peer: str, frame: bytes) -> None:
        """Put ``frame`` on the peer's channel now -- on the socket itself when
        the channel is idle -- without a trip through the core's outbox and the
        daemon's flush (lease frames need no ordering with the journal's
        frames). A full or closing channel takes the daemon's path, which
        waits or counts the drop."""
        link = self.d.conns.links.get(peer)
        if link is not None:
            try:
                link.channel.send_now(frame)  # written now if the channel is idle
                return
            except HivemeshError:
                self.counters["lease_send_via_flush"] += 1
        self.d.node.send(peer, frame)
        self.d._schedule_flush()

    def _local_votes(self) -> None:
        """This node's own votes, run after the frames to the other voters left:
        its log write and sync overlap with the other voters' work instead of
        delaying it."""
        todo, self._local, self._local_scheduled = self._local, [], False
        if self._proposer is None or not self.d._started:
            return
        for msg in todo:
            try:
                reply = self._vote(msg)
            except DecodeError:
                self.counters["lease_local_decode"] += 1
                continue
            if reply is not None:
                self._answer(self.d.address, reply)
        self._pump()

    def _on_frame(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 2 or fields[0] not in (SUB_REQUEST, SUB_REPLY):
            raise DecodeError("lease frame must be [sub, message]")
        sub, msg = fields
        if sub == SUB_REQUEST:
            if not self.d.authorize(peer):
                self.counters["lease_unauthorized"] += 1
                return
            reply = self._vote(msg)
            if reply is not None:
                self._answer(peer, reply)
            return
        if self._proposer is None:
            self.counters["lease_stale_reply"] += 1
            return
        self._proposer.receive(peer, msg, _mono_ms())
        self._pump()

    # -- proposer side --------------------------------------------------------------

    def _pump(self) -> None:
        """Flush the proposer: frames to voters, own votes, outcomes, the timer."""
        p = self._proposer
        if p is None:
            return
        local = False
        for vid, msg in p.outbox():
            if vid == self.d.address:
                self._local.append(msg)
                local = True
            else:
                self._send(vid, encode_frame(FrameType.LEASE, SUB_REQUEST, msg))
        if local and not self._local_scheduled:
            self._local_scheduled = True
            # after the frames above are on their sockets (or their writers,
            # woken by _send, ran: callbacks run in FIFO order)
            asyncio.get_running_loop().call_soon(self._local_votes)
        for ev in p.events():
            fut = self._futures.pop(ev.rid, None)
            if fut is not None and not fut.done():
                fut.set_result(ev)
        deadline = p.next_deadline()
        # Re-arm only for an earlier deadline: a timer that fires early finds
        # nothing due and re-arms (one timer per retransmit period, not per op).
        if deadline is not None and (self._timer is None or deadline < self._timer_at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = asyncio.get_running_loop().call_at(deadline / 1000.0, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self._proposer is not None:
            self._proposer.handle_timer(_mono_ms())
            self._pump()

    def _live_first(self, voters: list[str]) -> list[str]:
        """Self, then voters with an open channel that membership sees up."""
        links = self.d.conns.links
        live = [
            v
            for v in voters
            if v in links and self.d.peer.member_state(v) in (MemberState.UP, None)
        ]
        return [self.d.address, *live]

    async def run(self, op: Op, timeout_s: float) -> Outcome:
        """Run one lease operation against a majority; raises BackendUnavailable."""
        what = type(op).__name__.lower()
        if not self.d._started:
            raise BackendUnavailable(f"lease {what}: the node is not running")
        self.voters()
        p = self._proposer
        assert p is not None
        p.prefer(self._live_first(p.voters))
        rid = None
        try:
            async with asyncio.timeout(timeout_s):
                fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
                rid = p.start(op, _mono_ms(), timeout_ms=max(1, int(timeout_s * 1000)))
                self._futures[rid] = fut
                self._pump()
                ev = await fut
        except TimeoutError as e:
            if rid is not None:
                self._futures.pop(rid, None)
                p.cancel(rid, _mono_ms())
                self._pump()
            raise BackendUnavailable(f"lease {what}: no majority within {timeout_s:.3f}s") from e
        if ev.status == "unknown":
            raise BackendUnavailable(f"lease {what}: no majority of {p.voters} answered in time")
        return ev

    def close(self) -> None:
        """Stop the timer and close the log; pending operations fail (BackendUnavailable).
        Replies still waiting for a sync are dropped (never sent unsynced)."""
        self._closed = True
        self._held.clear()
        self.log.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(BackendUnavailable("node stopped"))
        self._futures.clear()

    def client(self) -> LeaseClient:
        """A LeaseClient over this quorum, holder id = this node's address (cached)."""
        if self._client is None:
            self._client = LeaseClient(DaemonLeaseBackend(self), self.d.address)
        return self._client

    def statistics(self) -> dict[str, Any]:
        """Counters of the voter, proposer and pump, the voter set if fixed, and
        why the voter stopped (``disk_error``, None while it votes)."""
        return {
            "voters": list(self._proposer.voters) if self._proposer else None,
            "voter": dict(sorted(self.voter.counters.items())),
            "proposer": dict(sorted(self._proposer.counters.items())) if self._proposer else {},
            "mesh": dict(sorted(self.counters.items())),
            "disk_error": self.disk_error,
        }


class DaemonLeaseBackend:
    """A :class:`~hivemesh.leases.LeaseBackend` over the daemon's own quorum (in process)."""

    def __init__(self, leases: MeshLeases) -> None:
        self._leases = leases

    @property
    def url(self) -> str:
        """``mesh://`` and this node's data dir."""
        return f"mesh://{self._leases.d.config.data_dir}"

    async def acquire(
        self, resource: str, holder: str, ttl_ms: int, *, timeout_s: float
    ) -> int | None:
        """Two-phase majority acquire; the token or None if held."""
        ev = await self._leases.run(Acquire(resource, holder, ttl_ms), timeout_s)
        if ev.status == "fail" and ev.partial:
            raise LeaseContended(f"{resource!r}: lost a race after reaching some voters")
        return ev.token if ev.status == "ok" else None

    async def renew(
        self, resource: str, holder: str, token: int, ttl_ms: int, *, timeout_s: float
    ) -> bool:
        """Majority renew."""
        ev = await self._leases.run(Renew(resource, holder, token, ttl_ms), timeout_s)
        return ev.status == "ok"

    async def release(self, resource: str, holder: str, token: int, *, timeout_s: float) -> bool:
        """Majority release (a partial one counts: some voters did let go)."""
        ev = await self._leases.run(Release(resource, holder, token), timeout_s)
        return ev.status == "ok" or ev.partial

    async def show(self, resource: str, *, timeout_s: float) -> LeaseInfo | None:
        """Majority read of the current holder."""
        ev = await self._leases.run(Show(resource), timeout_s)
        if not ev.holder or ev.token is None:
            return None
        return LeaseInfo(resource, ev.holder, ev.token, max(0, ev.remaining_ms))

    async def aclose(self) -> None:
        """Nothing to close (the daemon owns the quorum)."""


def attach(daemon: Daemon) -> tuple[MeshLeases, MeshClaims]:
    """Wire leases and claims into ``daemon``: call after its core node exists
    and *before* rehydration, so the views get the stored events in that one
    replay (membership and channels are only used later, lazily)."""
    leases = MeshLeases(daemon)
    claims = MeshClaims(daemon)  # over the Peer's claims view
    return leases, claims
