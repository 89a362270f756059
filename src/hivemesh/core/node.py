"""The sans-IO node: feeds, journal and the replication protocol.

Theory of operation
-------------------
A :class:`Node` is a plain object. Inputs are frames from peers
(:meth:`Node.receive`), local appends (:meth:`Node.append`) and timer ticks
(:meth:`Node.handle_timer`), each with the current time ``now_ms``. Outputs
are frames to send (:meth:`Node.outbox`), newly applied events
(:meth:`Node.events`) and the next deadline (:meth:`Node.next_deadline`).
Randomness comes from the injected ``Random``. Same inputs, same
outputs: the simulator and the asyncio runtime drive the same object.

Replication has two halves:

**Push.** A freshly sealed batch goes straight to peers. With fewer than
``push_all_below`` peers it goes to all of them and is not forwarded (no
duplicates); in larger swarms it goes to ``push_fanout`` random peers with a
hop budget and every receiver that found it new forwards it on (epidemic
broadcast; duplicates are dropped cheaply by seq).

**Pull (anti-entropy).** Every ``sync_interval_ms`` (jittered) a node sends
its version vector (HAVE) to a random peer. The receiver asks (WANT) for
exactly the ranges it lacks, each from one peer at a time (in-flight pulls
are tracked, so two peers never send us the same range), and answers with
its own HAVE when the sender lacks something, so the sender pulls too.
A feed that grew by push within the last ``push_grace_ms`` is not pulled
from a HAVE: the rest of that range is almost surely queued behind the push
we just took (pulling it would have it served twice); a push that *was*
lost shows up as a gap at the next push and is requested then, or is
pulled by the first anti-entropy round after the pushes stop.
The same holds for every feed while a broker's log is delivering a backlog
(:meth:`Node.log_backlog`, broker mode's late join): the log brings it all,
so pulls wait until ``push_grace_ms`` after the backlog ends.
Ranges are served in signed chunks. A pull that stalls past
``want_timeout_ms`` is dropped and re-requested from our *current* head, so
an interrupted transfer resumes where it stopped. Late joiners and healed
partitions catch up through this path alone.

**Attested batches.** With ``NodeConfig.defer_direct_verify`` the caller
promises that ``receive(peer, ...)`` names the *authenticated* sender (the
runtime's channels prove it in the handshake). A batch that comes straight
from its author (``peer`` is the author's address) and is not to be
forwarded is then ingested *attested*: applied at once, its head signature
checked by :meth:`Node.settle` for a whole run of batches with one verify
(see :mod:`hivemesh.core.journal`). The runtime settles at its group
commit; with ``settle_delay_ms`` set, :meth:`Node.handle_timer` settles that
long after a run began (the simulator's way). Relayed batches are always
verified before they are applied.

**Who sees what.** With a ``shares(peer, author)`` policy (the runtime's
trust web: a peer sees the feeds of the swarms it shares with us), a feed is
never pushed to, advertised to or served to a peer it is not shared with
(counted ``want_not_shared``); without one, every peer sees every feed.

**Our own feed.** :attr:`Node.feed_gate` (:mod:`hivemesh.core.ownfeed`)
decides whether appends are allowed: never while the store lacks part of
the feed that may have left the node (its durable mark says how far), or
while a peer reports holding more of it. Appends then raise
:class:`~hivemesh.errors.FeedRecovering`, and the node pulls its own feed
from peers like any other (a HAVE naming more of it is also how the gate
learns of it); once recovered the writer continues from there. An own batch
is stored, then the mark is saved, then it is pushed; WANTs are served only
up to the mark. :meth:`Node.append_later` keeps the node's own observations
(membership, endpoints) while appends are refused or the store fails, and
appends them once it can.

**The clock bound.** Every batch goes through the journal with
``horizon(now_ms)``: one stamped beyond our physical clock plus
:data:`~hivemesh.core.hlc.MAX_DRIFT_MS` is held in :attr:`Node.deferrals`,
not applied, not forwarded, and its author's later events wait behind it
(pulls for that author stop short of it); :meth:`Node.handle_timer` ingests
it at its release time, which :meth:`Node.next_deadline` includes (see
:mod:`hivemesh.core.deferral`). Neither a received nor a stored timestamp
moves our clock beyond the bound (:meth:`Node.rehydrate`).

**Witnesses.** Views whose rules let the earliest record win (names, claims,
plan tasks) declare ``witnessed_kinds``. When a batch from another author
brings such records, the node appends one ``witness`` event of its own in
the same :meth:`Node.receive` call, before any view can be queried, so
those views can order records by when other nodes first saw them and not by
their authors' word alone (:mod:`hivemesh.core.witness`).

Bad input from a peer raises a :class:`~hivemesh.errors.RemoteProtocolError`
inside; :meth:`Node.receive` counts it by code in :attr:`Node.counters` and
drops it. Nothing invalid is stored.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from random import Random
from typing import Any

from hivemesh.core.deferral import DEFAULT_MAX_BYTES, Deferrals
from hivemesh.core.event import Event, decode_event, event_hash
from hivemesh.core.feed import MAX_UNSEALED, FeedWriter, Head, head_message
from hivemesh.core.frames import FrameType, decode_frame, encode_frame
from hivemesh.core.hlc import HLC, horizon
from hivemesh.core.identity import Identity, address_of, public_key_of, verify
from hivemesh.core.journal import Journal, View
from hivemesh.core.ownfeed import Mark, MarkStore, MemoryMarkStore, OwnFeedGate
from hivemesh.core.store import FeedStore
from hivemesh.core.witness import KIND_WITNESS, WitnessIndex, witness_bodies
from hivemesh.errors import (
    BrokenChain,
    ClockAhead,
    DecodeError,
    FeedNotWritable,
    ForkError,
    GapError,
    HivemeshError,
    InvalidAddress,
    RemoteProtocolError,
    ReplayError,
    StoreError,
)

__all__ = ["FrameHandler", "Node", "NodeConfig"]

#: ``handler(peer, fields, now_ms)`` for an extension frame type.
FrameHandler = Callable[[str, list[Any], int], None]


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Replication tuning. Units are in the names."""

    sync_interval_ms: int = 1000
    push_fanout: int = 3
    push_all_below: int = 16
    forward_hops: int = 4
    want_timeout_ms: int = 3000
    max_want_events: int = 16384
    max_pending_events: int = 100_000
    push_grace_ms: int = 1000
    #: Push new batches to peers (and forward pushed ones). False in broker
    #: mode, where a shared log (JetStream, Redis Streams) is the push half
    #: and peers only pull (anti-entropy) what it lacks.
    push: bool = True
    #: Ingest batches received from their own author unverified, settling
    #: their signatures in runs (module docs). Only when ``receive``'s
    #: ``peer`` is authenticated.
    defer_direct_verify: bool = False
    #: Settle unsettled runs this long after the first (None: the caller
    #: calls :meth:`Node.settle` itself, as the runtime's group commit does).
    settle_delay_ms: int | None = 20
    #: Own observations :meth:`Node.append_later` keeps while appends fail.
    max_deferred_events: int = 1024
    #: Bytes of batches from beyond the clock bound held until they become
    #: plausible (:mod:`hivemesh.core.deferral`).
    max_deferred_bytes: int = DEFAULT_MAX_BYTES


@dataclass(slots=True)
class _Pull:
    peer: str
    upto: int
    deadline_ms: int


class Node:
    """One replica: its own feed, the journal, and the replication protocol."""

    def __init__(
        self,
        identity: Identity,
        store: FeedStore,
        rng: Random,
        *,
        now_ms: int,
        config: NodeConfig | None = None,
        trusted: Callable[[bytes], bool] | None = None,
        shares: Callable[[str, bytes], bool] | None = None,
        marks: MarkStore | None = None,
    ) -> None:
        """``marks`` keeps the own feed's durable mark (module docs); without
        one the store is taken as the whole feed (tests, tools)."""
        self.identity = identity
        #: ``shares(peer, author)``: may ``peer`` see ``author``'s feed? (module docs)
        self.shares = shares
        self.address = identity.address
        self.config = config or NodeConfig()
        self.rng = rng
        me = identity.public
        if trusted is not None:  # a node always takes its own feed back from peers
            policy = trusted

            def trusted(author: bytes) -> bool:
                return author == me or policy(author)

        self.journal = Journal(store, trusted=trusted)
        self.counters: Counter[str] = self.journal.counters
        self.clock = HLC()
        self._created_ms = now_ms
        own = self.journal.head(me)
        if own.seq:
            last = decode_event(store.read_range(me, own.seq, own.seq)[0])
            self.clock.restore(last.hlc, now_ms)
        if marks is None:
            marks = MemoryMarkStore(Mark(own.seq, own.hash))
        mark = marks.load()
        at_mark = None
        if mark is not None and 0 < mark.seq <= own.seq:
            at_mark = event_hash(store.read_range(me, mark.seq, mark.seq)[0])
        #: The own feed's write gate (:mod:`hivemesh.core.ownfeed`).
        self.feed_gate = OwnFeedGate(marks, own, at_mark, self.counters)
        self.writer = FeedWriter(identity, own, self.clock)
        self._later: deque[tuple[str, Any]] = deque()  # append_later's items
        #: Batches from beyond the clock bound, waiting (module docs).
        self.deferrals = Deferrals(self.config.max_deferred_bytes)
        #: When other nodes first saw each feed (core.witness), and the
        #: events of witnessed kinds applied but not yet witnessed by us.
        self.witnesses = WitnessIndex()
        self._unwitnessed: dict[bytes, int] = {}
        self._peers: list[str] = []
        self._outbox: list[tuple[str, bytes]] = []
        self._events: deque[Event] = deque()
        self._pulls: dict[bytes, _Pull] = {}
        self._pushed_ms: dict[bytes, int] = {}  # author -> last growth by push
        self._backlog_ms: int | None = None  # the log last had a backlog (log_backlog)
        self._peer_keys: dict[str, bytes] = {}  # peer address -> its public key
        self._unsettled_ms: int | None = None  # when the oldest unsettled run began
        self._handlers: dict[int, FrameHandler] = {
            FrameType.EVENTS: self._on_events,
            FrameType.HAVE: self._on_have,
            FrameType.WANT: self._on_want,
        }
        self.journal.add_view(self.witnesses)
        self._next_sync_ms = now_ms + self._jitter(self.config.sync_interval_ms)

    # -- wiring ----------------------------------------------------------------

    def add_view(self, view: View) -> None:
        """Register a view; it sees every event applied from now on.

        A view whose rules order records by time names the kinds it needs
        witnessed in ``witnessed_kinds``: this node then witnesses other
        authors' events of those kinds (:mod:`hivemesh.core.witness`)."""
        self.journal.add_view(view)
        wanted = frozenset(getattr(view, "witnessed_kinds", ())) - self.journal.watched
        if wanted:
            self.journal.watch(wanted, self._saw)

    def _saw(self, ev: Event) -> None:
        """An event of a witnessed kind was applied: witness it (if not ours)."""
        if ev.author != self.identity.public and ev.seq > self._unwitnessed.get(ev.author, 0):
            self._unwitnessed[ev.author] = ev.seq

    def _witness(self, now_ms: int) -> None:
        """Append one witness for what :meth:`_saw` noted and nobody else has
        witnessed yet, covering each such author's feed as far as we hold it.
        While our own feed takes no writes (recovering) they wait, and are
        witnessed by the first timer after it does (a later witness only
        orders those records later, never earlier)."""
        if not self.feed_gate.writable:
            return
        seen, self._unwitnessed = self._unwitnessed, {}
        cover = {
            a: self.journal.head(a).seq
            for a, seq in seen.items()
            if self.witnesses.first_seen(a, seq) is None
        }
        if not cover:
            return
        try:
            self.append_many([(KIND_WITNESS, body) for body in witness_bodies(cover)], now_ms)
        except (HivemeshError, ValueError):  # our own store failed: count it, never raise
            self.counters["witness_failed"] += 1
            return
        self.counters["witnessed"] += len(cover)

    def register_handler(self, ftype: int, handler: FrameHandler) -> None:
        """Route frames of ``ftype`` to ``handler`` (membership, direct, ...)."""
        if ftype in self._handlers:
            raise ValueError(f"frame type {ftype} already has a handler")
        self._handlers[ftype] = handler

    def rehydrate(self, events: Iterable[Event], now_ms: int | None = None) -> int:
        """Rebuild views from stored events (verified by the caller); returns count.

        Stored remote events passed the views' validation when they were
        ingested, so views may take them through their trusted ``replay``.
        The clock moves past the largest stored HLC, but never beyond the
        clock bound at ``now_ms`` (default: when the node was created): a
        store may hold a far-future event accepted by an older version.
        """
        events = events if isinstance(events, list) else list(events)
        self.journal.apply_to_views(events, replay=True)
        n = len(events)
        max_hlc = max(self.clock.last, max((ev.hlc for ev in events), default=0))
        self.clock.restore(max_hlc, self._created_ms if now_ms is None else now_ms)
        return n

    @property
    def peers(self) -> list[str]:
        """Addresses we replicate with, sorted."""
        return list(self._peers)

    def add_peer(self, address: str) -> None:
        """Start replicating with ``address``."""
        if address != self.address and address not in self._peers:
            self._peers.append(address)
            self._peers.sort()
            with contextlib.suppress(InvalidAddress):  # not an identity: never attested
                self._peer_keys[address] = public_key_of(address)
            if not self.feed_gate.writable:  # ask at once how much of our feed it holds
                self.sync_with(address)

    def log_backlog(self, now_ms: int) -> None:
        """The broker's log is handing us a backlog (its reader is behind the
        log's end): hold anti-entropy pulls of every feed until
        ``push_grace_ms`` after the last call, as for a feed that grows by
        push (module docs). Broker mode's reader calls it per entry while
        entries wait behind it, and once before its first read."""
        self._backlog_ms = now_ms

    def remove_peer(self, address: str) -> None:
        """Stop replicating with ``address`` (down, revoked, disconnected)."""
        if address in self._peers:
            self._peers.remove(address)
        self._pushed_ms.clear()  # pushes via that peer may have stopped
        for author in sorted(self._pulls):
            if self._pulls[author].peer == address:
                del self._pulls[author]

    # -- outputs ---------------------------------------------------------------

    def send(self, peer: str, frame: bytes) -> None:
        """Queue a frame for ``peer`` (used by extension handlers too)."""
        self._outbox.append((peer, frame))

    def outbox(self) -> list[tuple[str, bytes]]:
        """Frames to send, in order; drains the queue."""
        out, self._outbox = self._outbox, []
        return out

    @property
    def has_output(self) -> bool:
        """True if frames or events are waiting for :meth:`outbox` / :meth:`events`."""
        return bool(self._outbox or self._events)

    def events(self) -> list[Event]:
        """Events applied since the last call (own and remote), in order."""
        out = list(self._events)
        self._events.clear()
        return out

    def next_deadline(self) -> int:
        """When :meth:`handle_timer` should next be called (ms)."""
        deadline = self._next_sync_ms
        for pull in self._pulls.values():
            if pull.deadline_ms < deadline:
                deadline = pull.deadline_ms
        delay = self.config.settle_delay_ms
        if self._unsettled_ms is not None and delay is not None:
            deadline = min(deadline, self._unsettled_ms + delay)
        if self.deferrals.held:
            release = self.deferrals.next_release()
            if release is not None and release < deadline:
                deadline = release
        return deadline

    # -- inputs ----------------------------------------------------------------

    def append(self, kind: str, body: Any, now_ms: int) -> Event:
        """Append, sign and publish one event of our own."""
        return self.append_many([(kind, body)], now_ms)[0]

    def append_many(self, items: Iterable[tuple[str, Any]], now_ms: int) -> list[Event]:
        """Append several events under as few signatures as possible.

        Raises :class:`~hivemesh.errors.FeedNotWritable` (appending nothing)
        while the feed gate refuses writes (module docs). Every item is
        encoded first, then the events are signed and stored in batches of
        at most ``MAX_UNSEALED``. When this raises (a bad item, a full disk),
        the feed continues from what the store holds: events not stored
        leave no trace in the writer or the clock, so the next append
        continues the stored feed. Batches stored before the failure (only
        when the store fails after the first ``MAX_UNSEALED`` events) stay,
        and are sent like any other.
        """
        return self._append(items, now_ms, acknowledged=True)

    def _append(
        self, items: Iterable[tuple[str, Any]], now_ms: int, *, acknowledged: bool
    ) -> list[Event]:
        self.feed_gate.check()
        clock_before = self.clock.last
        out: list[Event] = []
        try:
            for kind, body in items:
                out.append(self.writer.append(kind, body, now_ms))
            while self.writer.unsealed:
                self._seal(acknowledged)
        except BaseException:
            held = self.journal.head(self.identity.public)
            self.writer.reset(held)
            stored = [e.hlc for e in out if e.seq <= held.seq]
            self.clock.last = max([clock_before, *stored])
            raise
        return out

    def _seal(self, acknowledged: bool) -> None:
        sealed = self.writer.seal(MAX_UNSEALED)
        if sealed is None:
            return
        events, sig = sealed
        self.journal.append_own(events, sig)
        self._emit(events)
        # The mark covers the batch before it is acknowledged or sent.
        head = Head(events[-1].seq, events[-1].id)
        self.feed_gate.stored(head, mark=acknowledged or bool(self._peers))
        self._push(events[0].author, [e.raw for e in events], sig, exclude=None)

    def append_later(self, items: Iterable[tuple[str, Any]], now_ms: int) -> None:
        """Append ``items`` now if the feed takes them, else keep them and
        append them once it does (checked by :meth:`handle_timer` and when
        the feed is recovered). For the node's own observations, which no
        caller waits for and a full disk or a recovering feed must not lose.
        At most ``max_deferred_events`` wait; older ones are dropped first
        (counted ``own_deferred_dropped``)."""
        self._later.extend(items)
        overflow = len(self._later) - self.config.max_deferred_events
        for _ in range(max(0, overflow)):
            self._later.popleft()
            self.counters["own_deferred_dropped"] += 1
        self._append_deferred(now_ms)

    def _append_deferred(self, now_ms: int) -> None:
        if not self._later or not self.feed_gate.writable:
            return
        items = list(self._later)
        before = self.journal.head(self.identity.public).seq
        try:
            self._append(items, now_ms, acknowledged=False)
        except (StoreError, FeedNotWritable):
            self.counters["own_deferred_failed"] += 1
            for _ in range(self.journal.head(self.identity.public).seq - before):
                self._later.popleft()  # stored before the failure
            return
        except HivemeshError:  # an item that can never be appended: drop them all
            self.counters["own_deferred_dropped"] += len(items)
        self._later.clear()

    @property
    def deferred(self) -> int:
        """Items :meth:`append_later` keeps for later."""
        return len(self._later)

    def accept_feed_loss(self, now_ms: int) -> dict[str, Any]:
        """The operator's decision to write on from what the store holds
        (see :meth:`OwnFeedGate.accept_loss <hivemesh.core.ownfeed.OwnFeedGate.accept_loss>`);
        returns what was given up."""
        lost = self.feed_gate.accept_loss()
        self.writer.reset(self.journal.head(self.identity.public))
        self._append_deferred(now_ms)
        return lost

    def receive(self, peer: str, frame: bytes, now_ms: int) -> None:
        """Handle one frame from ``peer``. Bad input is counted, never raised."""
        try:
            ftype, fields = decode_frame(frame)
            handler = self._handlers.get(ftype)
            if handler is None:
                raise DecodeError(f"unknown frame type {ftype}")
            handler(peer, fields, now_ms)
        except (RemoteProtocolError, StoreError) as exc:
            # A store error (a full disk) changed nothing: the peer resends,
            # or anti-entropy pulls the range again once the store takes it.
            self.counters[exc.code] += 1

    def settle(self) -> list[str]:
        """Check the signatures of attested runs now (see the module docs);
        returns the addresses of authors whose signature failed (they are
        refused from now on; the caller may disconnect them)."""
        self._unsettled_ms = None
        return [address_of(author) for author in self.journal.settle()]

    def handle_timer(self, now_ms: int) -> None:
        """Run periodic work: anti-entropy rounds, pull timeouts, settling,
        deferred batches whose time has come."""
        delay = self.config.settle_delay_ms
        since = self._unsettled_ms
        if since is not None and delay is not None and now_ms >= since + delay:
            self.settle()
        for author in sorted(self._pulls):
            if self._pulls[author].deadline_ms <= now_ms:
                del self._pulls[author]
                self.counters["pull_timeout"] += 1
        for rec in self.deferrals.due(now_ms):
            if rec.raws is None:
                continue  # a marker: anti-entropy pulls the batch from now on
            try:
                self._ingest("", rec.author, rec.raws, rec.sig, 0, now_ms, attested=False)
            except RemoteProtocolError as exc:  # e.g. its author is no longer trusted
                self.counters[exc.code] += 1
        self._append_deferred(now_ms)
        if self._unwitnessed:
            self._witness(now_ms)
        if now_ms >= self._next_sync_ms:
            self._next_sync_ms = now_ms + self._jitter(self.config.sync_interval_ms)
            if self._peers:
                self.sync_with(self.rng.choice(self._peers))

    def sync_with(self, peer: str) -> None:
        """Start an anti-entropy round with ``peer`` now."""
        self.send(peer, encode_frame(FrameType.HAVE, self._vv_for(peer), True))

    def _vv_for(self, peer: str) -> dict[bytes, int]:
        """Our version vector as ``peer`` may see it."""
        vv = self.journal.version_vector()
        shares = self.shares
        return vv if shares is None else {a: s for a, s in vv.items() if shares(peer, a)}

    # -- push --------------------------------------------------------------------

    def _push(self, author: bytes, raws: list[bytes], sig: bytes, exclude: str | None) -> None:
        if not self.config.push:
            return
        peers = [p for p in self._peers if p != exclude and self._shared(p, author)]
        if not peers:
            return
        if len(self._peers) < self.config.push_all_below:
            targets, hops = peers, 0
        else:
            k = min(self.config.push_fanout, len(peers))
            targets, hops = self.rng.sample(peers, k), self.config.forward_hops
        frame = encode_frame(FrameType.EVENTS, author, raws, sig, hops)
        for p in targets:
            self.send(p, frame)

    def _forward(self, peer: str, author: bytes, raws: list[bytes], sig: bytes, hops: int) -> None:
        if hops <= 0 or not self.config.push:
            return
        peers = [p for p in self._peers if p != peer and self._shared(p, author)]
        if not peers:
            return
        k = min(self.config.push_fanout, len(peers))
        frame = encode_frame(FrameType.EVENTS, author, raws, sig, hops - 1)
        for p in self.rng.sample(peers, k):
            self.send(p, frame)

    # -- handlers ----------------------------------------------------------------

    def _on_events(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 4:
            raise DecodeError("EVENTS takes 4 fields")
        author, raws, sig, hops = fields
        if type(hops) is not int or not 0 <= hops <= 64:
            raise DecodeError("EVENTS hops must be a small int")
        attested = (
            hops == 0 and self.config.defer_direct_verify and self._peer_keys.get(peer) == author
        )
        self._ingest(peer, author, raws, sig, hops, now_ms, attested=attested)

    def _ingest(
        self,
        peer: str,
        author: bytes,
        raws: list[bytes],
        sig: bytes,
        hops: int,
        now_ms: int,
        *,
        attested: bool,
    ) -> None:
        """One batch through the journal's gate, from ``peer`` ("" for a
        deferred batch whose time has come)."""
        try:
            events = self.journal.ingest(
                author, raws, sig, attested=attested, horizon=horizon(now_ms)
            )
        except ReplayError:
            self.counters["duplicate"] += 1
            return
        except (ForkError, BrokenChain):
            if author != self.identity.public or not self._signed_by_us(raws, sig):
                raise
            self.feed_gate.conflict(peer, self._first_difference(raws))  # we signed two
            return
        except GapError:
            self.counters["gap"] += 1
            if peer:  # else anti-entropy fetches what a released batch lacks
                last = decode_event(raws[-1])
                want = (author, self.journal.head(author).seq + 1, last.seq)
                self._request(peer, [want], now_ms)
            return
        except ClockAhead as exc:
            self.counters[exc.code] += 1
            pull = self._pulls.get(author)
            overshot = None
            if pull is not None and pull.peer == peer:
                del self._pulls[author]  # answered; what it sent waits here
                if pull.upto < exc.seq:  # we asked for less: it holds no shorter chunk
                    overshot = peer
            start = self.journal.head(author).seq + 1
            self.deferrals.hold(author, exc, start, raws, sig, now_ms, pulled_from=overshot)
            return
        self.counters["events_in"] += len(events)
        if attested and self._unsettled_ms is None:
            self._unsettled_ms = now_ms
        self.clock.observe(self.journal.top_hlc, now_ms)
        if author == self.identity.public:
            self._recovered(events, now_ms)
        pull = self._pulls.get(author)
        if peer and (pull is None or pull.peer != peer):
            self._pushed_ms[author] = now_ms
        if pull is not None:
            if self.journal.head(author).seq >= pull.upto:
                del self._pulls[author]
            elif pull.peer == peer:
                pull.deadline_ms = now_ms + self.config.want_timeout_ms
        self._emit(events)
        self._forward(peer, author, raws, sig, hops)
        if self._unwitnessed:
            self._witness(now_ms)

    def _on_have(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 2 or type(fields[0]) is not dict or type(fields[1]) is not bool:
            raise DecodeError("HAVE takes {author: seq}, reply")
        vv, reply = fields
        wants: list[tuple[bytes, int, int]] = []
        pushed_after = now_ms - self.config.push_grace_ms
        me = self.identity.public
        for author, seq in vv.items():
            if type(author) is not bytes or len(author) != 32 or type(seq) is not int:
                raise DecodeError("HAVE entries are 32-byte author -> int")
        pull_own = self.feed_gate.report(peer, vv.get(me, 0))
        backlog = self._backlog_ms is not None and self._backlog_ms > pushed_after
        for author, seq in vv.items():
            ours = self.journal.head(author).seq
            if author == me and not pull_own:
                continue
            if seq > ours:
                if backlog:
                    self.counters["pull_skipped_log_backlog"] += 1
                    continue
                if self._pushed_ms.get(author, pushed_after) > pushed_after:
                    self.counters["pull_skipped_pushing"] += 1
                    continue
                wants.append((author, ours + 1, seq))
        wants.sort()
        self._request(peer, wants, now_ms)
        if reply and any(self._shared(peer, a) for a, _s, _e in self.journal.missing_for(vv)):
            self.send(peer, encode_frame(FrameType.HAVE, self._vv_for(peer), False))

    def _request(self, peer: str, wants: list[tuple[bytes, int, int]], now_ms: int) -> None:
        trusted = self.journal.trusted
        asks = []
        for author, start, end in wants:
            if trusted is not None and not trusted(author):
                continue
            cap = self.deferrals.cap(author, peer)
            if cap is not None:  # only what lies before a deferred batch
                end = min(end, cap)
                if end < start:
                    self.counters["pull_deferred"] += 1
                    continue
            pull = self._pulls.get(author)
            if pull is not None and pull.deadline_ms > now_ms and pull.upto >= end:
                continue
            end = min(end, start + self.config.max_want_events - 1)
            self._pulls[author] = _Pull(peer, end, now_ms + self.config.want_timeout_ms)
            asks.append([author, start, end])
        if asks:
            self.send(peer, encode_frame(FrameType.WANT, asks))

    def _on_want(self, peer: str, fields: list[Any], now_ms: int) -> None:
        if len(fields) != 1 or type(fields[0]) is not list:
            raise DecodeError("WANT takes [[author, start, end], ...]")
        for item in fields[0]:
            if (
                type(item) is not list
                or len(item) != 3
                or type(item[0]) is not bytes
                or type(item[1]) is not int
                or type(item[2]) is not int
                or item[1] < 1
            ):
                raise DecodeError("WANT range must be [author, start>=1, end]")
            author, start, end = item
            if not self._shared(peer, author):
                self.counters["want_not_shared"] += 1
                continue
            end = min(end, start + self.config.max_want_events - 1)
            if author == self.identity.public:  # nothing of ours above the mark leaves
                end = min(end, self.feed_gate.sending(end))
            while start <= end:
                chunk = self.journal.read_chunk(author, start, end)
                if chunk is None:
                    break
                raws, sig = chunk
                self.send(peer, encode_frame(FrameType.EVENTS, author, raws, sig, 0))
                start += len(raws)
                self.counters["events_served"] += len(raws)

    # -- our own feed ----------------------------------------------------------------

    def _recovered(self, events: list[Event], now_ms: int) -> None:
        """Own events pulled back from a peer are stored: continue from them."""
        self.writer.reset(self.journal.head(self.identity.public))
        self.clock.last = max(self.clock.last, events[-1].hlc)
        self.counters["own_events_recovered"] += len(events)
        writable = self.feed_gate.recovered(events)
        with contextlib.suppress(StoreError):  # else the next group commit stores them
            self.journal.store.sync()
        if writable:
            self._append_deferred(now_ms)

    def _signed_by_us(self, raws: list[bytes], sig: bytes) -> bool:
        last = decode_event(raws[-1])
        me = self.identity.public
        return last.author == me and verify(me, sig, head_message(me, last.seq, last.id))

    def _first_difference(self, raws: list[bytes]) -> int:
        """The first seq at which a batch of our own feed differs from ours."""
        me = self.identity.public
        first = decode_event(raws[0]).seq
        held = self.journal.head(me).seq
        ours = self.journal.store.read_range(me, first, min(held, first + len(raws) - 1))
        for i, raw in enumerate(ours):
            if raw != raws[i]:
                return first + i
        return first + len(ours)

    # -- helpers -------------------------------------------------------------------

    def _shared(self, peer: str, author: bytes) -> bool:
        return self.shares is None or self.shares(peer, author)

    def _emit(self, events: list[Event]) -> None:
        self._events.extend(events)
        overflow = len(self._events) - self.config.max_pending_events
        if overflow > 0:
            for _ in range(overflow):
                self._events.popleft()
            self.counters["events_undelivered"] += overflow

    def _jitter(self, interval_ms: int) -> int:
        return interval_ms // 2 + self.rng.randrange(interval_ms)
