"""The one place where the simulator wires a node: :class:`PeerAdapter`.

Theory of operation
-------------------
Every simulated node is the daemon's sans-IO :class:`~hivemesh.core.peer.Peer`,
and the simulator reaches it only through a :class:`PeerAdapter`: its own
SWIM finds crashes (no fixed-delay ``member.down``), its new life releases a
restarted node's claims, its settlement and trust decide, and its effects
are carried out by the simulated cluster (:mod:`hivemesh.sim.cluster`):
``Send`` over the simulated network, ``Dial`` and ``Close`` as link up and
link down inputs on both sides after the network's latency, ``Fsync`` on
the simulated disk, the lease voter's ``LeaseLog``/``LeaseSync`` on its
simulated log (:mod:`hivemesh.sim.leases`).

**One wiring, checked against the daemon's.** Every call the simulator makes
on the Peer goes through one method of the adapter named as the Peer's input
and taking its arguments (``rehydrate``, ``start``, ``link_up``,
``link_down``, ``receive``, ``handle_timer``, ``settle``, ``command``,
``lease_synced``, ...), and every drain through :meth:`PeerAdapter.effects`.
The cluster's own verbs are made of those: :meth:`~PeerAdapter.boot` is
``rehydrate`` and ``start``; an application's append is the daemon's
``command(AppendMany)``; the group commit is ``settle``. So
:func:`hivemesh.core.trace.feed` can drive the adapter with a trace a real
daemon recorded, and its effects must equal the daemon's at every drain
(``tests/test_sim_trace_equivalence.py``); inputs the simulated network never
produces (the invite flow's, the inbox's) pass through unchanged.

**Trust: one swarm, founded by invites.** The Peers run in ``invite`` mode
(:data:`SWARM`; the cluster writes the vouches an invite flow writes).

What still goes around the Peer: the workload's context writes edit
``peer.context`` (as the daemon's ``hivemesh.Node`` does) before their
updates are appended; a batch of them is one append.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from hivemesh.commands.node import FeedAcceptLoss
from hivemesh.commands.peer import AppendMany
from hivemesh.core.effects import Effect, Reply
from hivemesh.core.event import Event
from hivemesh.core.identity import Identity
from hivemesh.core.lease_swarm import LeaseSetup
from hivemesh.core.ownfeed import MarkStore, MemoryMarkStore
from hivemesh.core.peer import Peer, PeerConfig, TrustFile
from hivemesh.core.store import FeedStore
from hivemesh.core.trace import Trace
from hivemesh.core.views import View
from hivemesh.errors import HivemeshError
from hivemesh.sim.views import EventSetDigest

__all__ = ["SWARM", "PeerAdapter"]

#: The simulated swarm's id.
SWARM = "5" * 32


class PeerAdapter:
    """One life of one simulated node, as a Peer (module docs)."""

    def __init__(
        self,
        identity: Identity,
        store: FeedStore,
        rng: random.Random,
        now_ms: int,
        *,
        config: PeerConfig,
        trust: TrustFile,
        marks: MarkStore | None,
        leases: LeaseSetup | None = None,
        trace: Trace | None = None,
    ) -> None:
        self.identity = identity
        self.store = store
        self.peer = Peer(
            identity,
            store,
            rng,
            now_ms=now_ms,
            config=config,
            trust=trust,
            marks=marks,
            leases=leases,
            trace=trace,
        )
        #: The core node, for inspection (driven through the Peer).
        self.node = self.peer.node
        self.digest = EventSetDigest()
        self.node.add_view(self.digest)
        self.claims = self.peer.claims
        self.views: list[View] = [self.peer.context, self.peer.registers, self.peer.names]
        self._held: list[Effect] = []  # drained while waiting for a Reply

    @classmethod
    def from_trace(cls, trace: Trace, identity: Identity, store: FeedStore) -> PeerAdapter:
        """The adapter over a Peer built as ``trace``'s was (as
        :func:`hivemesh.core.trace.replay` builds it, ``store`` holding what
        the traced one's did), recording nothing."""
        now_ms, config, trust, marks, leases = trace.setup
        return cls(
            identity,
            store,
            random.Random(trace.seed),
            now_ms,
            config=config,
            trust=trust,
            marks=None if marks is None else MemoryMarkStore(marks[0]),
            leases=leases,
        )

    # -- the Peer's inputs (its names and arguments: core.trace.feed calls them) ------

    def rehydrate(self, events: Iterable[Event], now_ms: int) -> int:
        """Stored events replayed into the views."""
        return self.peer.rehydrate(events, now_ms)

    def start(self, endpoints: Iterable[str], now_ms: int) -> None:
        """The node listens (the simulated network has no endpoints)."""
        self.peer.start(endpoints, now_ms)

    def link_up(self, peer: str, boot_id: bytes, now_ms: int, endpoint: str | None = None) -> None:
        """A link to ``peer`` (of life ``boot_id``) came up."""
        self.peer.link_up(peer, boot_id, now_ms, endpoint)

    def link_down(self, peer: str, boot_id: bytes, now_ms: int) -> None:
        """The link to ``peer`` went."""
        self.peer.link_down(peer, boot_id, now_ms)

    def receive(self, peer: str, frame: bytes, now_ms: int) -> None:
        """A frame from ``peer``."""
        self.peer.receive(peer, frame, now_ms)

    def receive_many(self, peer: str, frames: Iterable[bytes], now_ms: int) -> None:
        """Frames read from ``peer`` at once."""
        self.peer.receive_many(peer, frames, now_ms)

    def handle_timer(self, now_ms: int) -> None:
        """Time passed."""
        self.peer.handle_timer(now_ms)

    def settle(self, now_ms: int) -> None:
        """The group commit (its ``Fsync`` syncs the disk: :meth:`sends`)."""
        self.peer.settle(now_ms)

    def command(self, cmd: Any, now_ms: int) -> int:
        """A typed command; the id its ``Reply`` carries."""
        return self.peer.command(cmd, now_ms)

    def admit_channel(self, address: str, invites_open: bool, now_ms: int) -> bool:
        """A handshake (passed through: the simulated network has none)."""
        return self.peer.admit_channel(address, invites_open, now_ms)

    def redeemed(
        self, peer: str, swarm: str | None, new: bool, error: HivemeshError | None, now_ms: int
    ) -> None:
        """An invite redeemed (passed through)."""
        self.peer.redeemed(peer, swarm, new, error, now_ms)

    def join_refused(self, peer: str, error: HivemeshError, exhausted: bool, now_ms: int) -> None:
        """A join refused (passed through)."""
        self.peer.join_refused(peer, error, exhausted, now_ms)

    def trust_changed(self, trust: TrustFile, now_ms: int) -> None:
        """``trust.json`` changed (passed through)."""
        self.peer.trust_changed(trust, now_ms)

    def inbox_room(self, n: int, now_ms: int) -> None:
        """The durable inbox's room (passed through)."""
        self.peer.inbox_room(n, now_ms)

    def persisted(self, batch: int, ok: bool, now_ms: int) -> None:
        """A direct message batch stored (passed through)."""
        self.peer.persisted(batch, ok, now_ms)

    def handled(self, key: int, reply: Any, error: str | None, now_ms: int) -> None:
        """A request handler returned (passed through)."""
        self.peer.handled(key, reply, error, now_ms)

    def lease_synced(self, upto: int, error: str | None, now_ms: int) -> None:
        """The lease voter's log synced (passed through)."""
        self.peer.lease_synced(upto, error, now_ms)

    def effects(self) -> list[Effect]:
        """The Peer's effects, in order (drains; what :meth:`append` drained
        while waiting for its reply comes first)."""
        out, self._held = self._held, []
        out += self.peer.effects()
        return out

    # -- the cluster's verbs, made of those --------------------------------------

    def boot(self, stored: Iterable[Event], endpoints: Iterable[str], now_ms: int) -> None:
        """Boot: replay the store, then listen at ``endpoints`` (links come
        up as the simulated network connects them)."""
        self.rehydrate(stored, now_ms)
        self.start(endpoints, now_ms)

    def append(self, items: list[tuple[str, Any]], now_ms: int) -> list[Event]:
        """The application appends ``items`` (one batch): the daemon's
        ``command(AppendMany)``; its reply's events (or its error raised)."""
        rid = self.command(AppendMany(tuple(items)), now_ms)
        fx = self.peer.effects()
        reply = next(e for e in fx if isinstance(e, Reply) and e.rid == rid)
        self._held += [e for e in fx if e is not reply]
        if reply.error is not None:
            raise reply.error
        events: list[Event] = reply.value
        return events

    def accept_feed_loss(self, now_ms: int) -> None:
        """The operator's ``hivemesh feed accept-loss``."""
        self.command(FeedAcceptLoss(confirm=True), now_ms)

    def next_deadline(self) -> int:
        """When :meth:`handle_timer` is due."""
        return self.peer.next_deadline()

    @property
    def writable(self) -> bool:
        """The own feed takes writes."""
        return self.node.feed_gate.writable
