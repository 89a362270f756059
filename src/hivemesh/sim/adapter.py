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
  for a member the failure detector gave up on, or keeps it until the feed
  takes writes.

When the sans-IO ``Peer`` (``hivemesh.core.peer``) lands, it owns those
rules, and this class becomes a thin translation of its inputs and effects
(``receive``, ``handle_timer``, ``command``; ``Send``); the rest of the
simulator is unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

from hivemesh.core.claims import ClaimsView
from hivemesh.core.event import Event
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.ownfeed import MarkStore
from hivemesh.core.store import FeedStore
from hivemesh.core.views import ContextView, View, standard_views
from hivemesh.sim.views import EventSetDigest

__all__ = ["NodeAdapter"]


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

    def start(self, stored: Iterable[Event], peers: Iterable[str]) -> None:
        """Boot: replay the store, then replicate with ``peers``."""
        self.node.rehydrate(stored)
        for peer in peers:
            self.node.add_peer(peer)

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
