"""The one place where the simulator wires a node.

Theory of operation
-------------------
The simulated cluster (:mod:`hivemesh.sim.cluster`) drives every node only
through a :class:`NodeAdapter`: the inputs a daemon's driver gives a node (a
frame from a peer, a timer, an application's append, a failure observation,
an operator's decision) and the outputs it carries out (frames to send, the
next deadline). Nothing else in the simulator decides for a node.

Today the adapter holds the core :class:`~hivemesh.core.node.Node` plus the
rules the daemon's runtime adds around it and the simulator must therefore
supply itself:

* the views a daemon registers (the standard views, claims, and the
  simulator's order-independent digest of the applied events);
* **a new life** -- once its own feed takes writes, a restarted node
  releases the live claims of its previous life (they are all in its feed
  then);
* **failure observations** -- :meth:`observe_down` appends ``member.down``
  for a member the simulator reports down a fixed delay after its crash (the
  Peer runs real SWIM instead).

The sans-IO :class:`~hivemesh.core.peer.Peer` now owns those rules in the
daemon, and :class:`hivemesh.sim.peer_adapter.PeerAdapter` drives it behind
the same :class:`Adapter` interface (``hivemesh sim --workload peer``); the
other workloads still run this class, until they move too. The mapping:

==========================  ==============================================
adapter                     Peer
==========================  ==============================================
``__init__`` + ``boot``     ``Peer(...)``, ``rehydrate``, ``start``, then
                            ``link_up`` for every peer (every link is up
                            in the simulated network; a partition only
                            drops frames, as a real one does)
``link_up``                 ``link_up`` (the boot id of the life it reaches)
``receive``                 ``receive``
``handle_timer``            ``handle_timer``
``settle``                  ``settle`` at the group commit the simulator
                            schedules (its ``Fsync`` syncs the disk)
``append``                  ``command(AppendMany)``, its ``Reply``
``observe_down``            gone: the Peer's own SWIM (as ``swim`` here)
``accept_feed_loss``        ``command(AcceptFeedLoss)``
``sends``                   the ``Send`` effects of ``effects()``
``next_deadline``           ``next_deadline``
==========================  ==============================================
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from hivemesh.core.claims import ClaimsView
from hivemesh.core.event import Event
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.ownfeed import MarkStore
from hivemesh.core.store import FeedStore
from hivemesh.core.views import ContextView, View, standard_views
from hivemesh.sim.views import EventSetDigest

__all__ = ["Adapter", "NodeAdapter"]


class Adapter(Protocol):
    """What the simulated cluster needs of a node's wiring (this module's
    :class:`NodeAdapter`, or :class:`hivemesh.sim.peer_adapter.PeerAdapter`)."""

    node: Node
    digest: EventSetDigest
    claims: ClaimsView
    views: list[View]

    def boot(self, stored: Iterable[Event], peers: dict[str, bytes], now_ms: int) -> None:
        """Boot: replay the store, then replicate with ``peers`` (address ->
        the boot id of its life)."""

    def link_up(self, peer: str, boot_id: bytes, now_ms: int, endpoint: str | None = None) -> None:
        """A link to ``peer`` (of life ``boot_id``) came up (it restarted
        and dialled us)."""

    def settle(self, now_ms: int) -> None:
        """The group commit is due (the store syncs)."""

    def receive(self, peer: str, frame: bytes, now_ms: int) -> None:
        """A frame from ``peer``."""

    def handle_timer(self, now_ms: int) -> None:
        """Time passed."""

    def append(self, items: list[tuple[str, Any]], now_ms: int) -> list[Event]:
        """The application appends ``items``; the events, acknowledged."""
        ...

    def observe_down(self, victim: bytes, now_ms: int) -> list[Event]:
        """A fixed-delay failure observation (without SWIM)."""
        ...

    def accept_feed_loss(self, now_ms: int) -> None:
        """The operator accepts the own feed's lost tail."""

    def sends(self, now_ms: int) -> list[tuple[str, bytes]]:
        """After an input: frames to send."""
        ...

    def next_deadline(self) -> int:
        """When :meth:`handle_timer` is due."""
        ...

    @property
    def writable(self) -> bool:
        """The own feed takes writes."""
        ...


class NodeAdapter:
    """One life of one simulated node (module docs)."""

    def __init__(
        self,
        identity: Identity,
        store: FeedStore,
        rng: random.Random,
        now_ms: int,
        *,
        config: NodeConfig,
        trusted: Callable[[bytes], bool],
        marks: MarkStore,
        claim_settle_ms: int,
    ) -> None:
        self.identity = identity
        self.store = store
        #: The core node (read by checkers and workloads; driven only here).
        self.node = Node(
            identity, store, rng, now_ms=now_ms, config=config, trusted=trusted, marks=marks
        )
        #: The views of this life.
        self.digest = EventSetDigest()
        self.claims = ClaimsView(claim_settle_ms)
        self.node.add_view(self.digest)
        self.node.add_view(self.claims)
        self.views: list[View] = standard_views(identity.public)
        for view in self.views:
            self.node.add_view(view)
            if isinstance(view, ContextView):
                view.before_write = self.node.feed_gate.check
        self._previous_life = True

    # -- inputs -------------------------------------------------------------------

    def boot(self, stored: Iterable[Event], peers: dict[str, bytes], now_ms: int) -> None:
        """Boot: replay the store, then replicate with ``peers``."""
        self.node.rehydrate(stored)
        for peer in peers:
            self.node.add_peer(peer)

    def link_up(self, peer: str, boot_id: bytes, now_ms: int, endpoint: str | None = None) -> None:
        """A link to ``peer`` came up: nothing to do (the core node replicates
        with every configured peer)."""

    def settle(self, now_ms: int) -> None:
        """The group commit: sync the store (the core node settles attested
        runs on its own delay)."""
        self.store.sync()

    def receive(self, peer: str, frame: bytes, now_ms: int) -> None:
        """A frame from ``peer``."""
        self.node.receive(peer, frame, now_ms)

    def handle_timer(self, now_ms: int) -> None:
        """Time passed (called at :meth:`next_deadline`)."""
        self.node.handle_timer(now_ms)

    def append(self, items: list[tuple[str, Any]], now_ms: int) -> list[Event]:
        """The application appends ``items`` (raises FeedNotWritable while
        the own feed recovers); the events, acknowledged."""
        return self.node.append_many(items, now_ms)

    def observe_down(self, victim: bytes, now_ms: int) -> list[Event]:
        """The failure detector gave up on ``victim``: append ``member.down``
        with the last seq of its feed we hold (claims release exactly what
        this observation is causally after). Returns the events if written
        now; while the feed recovers, the observation waits for it."""
        upto = self.node.journal.head(victim).seq
        down = [("member.down", {"a": victim, "upto": upto})]
        if self.node.feed_gate.writable:
            return self.node.append_many(down, now_ms)
        self.node.append_later(down, now_ms)
        return []

    def accept_feed_loss(self, now_ms: int) -> None:
        """The operator accepts that the own feed's lost tail is gone."""
        self.node.accept_feed_loss(now_ms)

    # -- outputs ------------------------------------------------------------------

    def sends(self, now_ms: int) -> list[tuple[str, bytes]]:
        """After an input: run the rules it made due, then the frames to send."""
        node = self.node
        if self._previous_life and node.feed_gate.writable:
            self._previous_life = False
            stale = self.claims.own_live(self.identity.public)
            if stale:
                node.append_many(
                    [("claim.release", {"r": r, "seq": seq}) for r, seq in stale], now_ms
                )
        node.events()
        return node.outbox()

    def next_deadline(self) -> int:
        """When :meth:`handle_timer` is due (on the node's clock)."""
        return self.node.next_deadline()

    @property
    def writable(self) -> bool:
        """The own feed takes writes."""
        return self.node.feed_gate.writable
