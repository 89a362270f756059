"""The simulator driving the daemon's sans-IO Peer (``hivemesh sim --workload peer``).

Theory of operation
-------------------
:class:`PeerAdapter` is :class:`~hivemesh.sim.adapter.NodeAdapter`'s
interface over a :class:`~hivemesh.core.peer.Peer`, the machine the daemon
drives: the Peer's own SWIM finds crashes (no fixed-delay ``member.down``),
its new life releases a restarted node's claims, its settlement and trust
decide, and only its ``Send`` effects reach the network (``Fsync`` syncs the
simulated disk). :class:`PeerCluster` is the journal workload on it.

**Links.** The simulated network has no connections: at boot a node reports
a link up to every configured peer, and every live node reports a link up
from it (the restarted node dials them all, with a new boot id); a crash or
a partition cuts no link (frames are just lost, as on a half-open one).

**Trust: one swarm, founded by invites.** The Peers run in ``invite`` mode:
each trusts the other members directly (their ``trust.json``) and belongs to
one swarm. A Peer shares a third party's feed only with members of a swarm
both are in, which it learns from ``trust.add`` vouches in the journal, so the
run starts with the vouches an invite flow writes: the founder (node 0) brings
every other node into the swarm, and each brings in the founder. An outsider
(the forging adversary's spam author) is refused as before.

What still goes around the Peer: the workload's appends are written on
``peer.node`` and collected by :meth:`~hivemesh.core.peer.Peer.effects` (the
escape hatch the daemon's leases and messaging use), and a batch of context
updates is one append, as in the journal workload.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from hivemesh.commands.node import FeedAcceptLoss
from hivemesh.core.effects import Fsync, Send
from hivemesh.core.event import Event
from hivemesh.core.identity import Identity
from hivemesh.core.membership import MembershipConfig
from hivemesh.core.node import NodeConfig
from hivemesh.core.ownfeed import MarkStore
from hivemesh.core.peer import Peer, PeerConfig, TrustFile
from hivemesh.core.views import View
from hivemesh.core.views.trust import KIND_TRUST_ADD
from hivemesh.sim.cluster import Cluster, SimNode
from hivemesh.sim.disk import DiskStore
from hivemesh.sim.options import SimOptions
from hivemesh.sim.views import EventSetDigest

__all__ = ["SWARM", "PeerAdapter", "PeerCluster"]

#: The simulated swarm's id.
SWARM = "5" * 32


class PeerAdapter:
    """One life of one simulated node, as a Peer (module docs)."""

    def __init__(
        self,
        identity: Identity,
        store: DiskStore,
        rng: random.Random,
        now_ms: int,
        *,
        config: NodeConfig,
        members: frozenset[str],
        marks: MarkStore,
        claim_settle_ms: int,
        swim: MembershipConfig,
    ) -> None:
        self.identity = identity
        self.store = store
        self.peer = Peer(
            identity,
            store,
            rng,
            now_ms=now_ms,
            config=PeerConfig(
                node=config,
                membership=swim,
                trust_mode="invite",
                claim_settle_ms=claim_settle_ms,
            ),
            trust=TrustFile(trusted=members - {identity.address}, swarms=(SWARM,)),
            marks=marks,
        )
        #: The core node, for inspection (driven through the Peer).
        self.node = self.peer.node
        self.digest = EventSetDigest()
        self.node.add_view(self.digest)
        self.claims = self.peer.claims
        self.views: list[View] = [self.peer.context, self.peer.registers, self.peer.names]

    def start(self, stored: Iterable[Event], peers: Iterable[str], now_ms: int) -> None:
        """Boot: replay, listen, and a link up to every configured peer."""
        self.peer.rehydrate(stored, now_ms)
        self.peer.start([], now_ms)
        for peer in peers:
            if peer != self.identity.address:
                self.link_up(peer, now_ms)

    def link_up(self, peer: str, now_ms: int) -> None:
        """A link to ``peer`` came up (it, or we, restarted and dialled)."""
        self.peer.link_up(peer, b"sim", now_ms)

    def receive(self, peer: str, frame: bytes, now_ms: int) -> None:
        """A frame from ``peer``."""
        self.peer.receive(peer, frame, now_ms)

    def handle_timer(self, now_ms: int) -> None:
        """Time passed."""
        self.peer.handle_timer(now_ms)

    def append(self, items: list[tuple[str, Any]], now_ms: int) -> list[Event]:
        """The application appends ``items`` (one batch)."""
        return self.node.append_many(items, now_ms)

    def observe_down(self, victim: bytes, now_ms: int) -> list[Event]:
        """Never asked: the Peer's SWIM finds crashes itself."""
        raise AssertionError("a Peer detects failures with its own SWIM")

    def accept_feed_loss(self, now_ms: int) -> None:
        """The operator's ``hivemesh feed accept-loss``."""
        self.peer.command(FeedAcceptLoss(confirm=True), now_ms)

    def sends(self, now_ms: int) -> list[tuple[str, bytes]]:
        """The Peer's effects: frames to send; an fsync syncs the disk."""
        out: list[tuple[str, bytes]] = []
        for fx in self.peer.effects():
            if isinstance(fx, Send):
                out.append((fx.peer, fx.frame))
            elif isinstance(fx, Fsync):
                self.store.sync()
        return out

    def next_deadline(self) -> int:
        """When :meth:`handle_timer` is due."""
        return self.peer.next_deadline()

    @property
    def writable(self) -> bool:
        """The own feed takes writes."""
        return self.node.feed_gate.writable


class PeerCluster(Cluster):
    """The journal workload with every node a Peer (module docs)."""

    detects_failures = True

    def __init__(self, seed: str, opts: SimOptions) -> None:
        if opts.swim is None:
            opts = replace(opts, swim=MembershipConfig.lan())
        super().__init__(seed, opts)
        # the invite flow's vouches: the founder brings everyone in, each the founder
        founder = self.nodes[0].identity.address
        vouches = [
            (KIND_TRUST_ADD, {"address": n.identity.address, "swarm": SWARM})
            for n in self.nodes[1:]
        ]
        self.append(0, vouches)
        for sn in self.nodes[1:]:
            self.append(sn.index, [(KIND_TRUST_ADD, {"address": founder, "swarm": SWARM})])

    def _new_adapter(self, sn: SimNode) -> PeerAdapter:
        assert self.opts.swim is not None
        return PeerAdapter(
            sn.identity,
            sn.store,
            random.Random(f"{self.seed}/node/{sn.index}/{sn.incarnation}"),
            self.now + sn.skew_ms,
            config=self._config(),
            members=frozenset(n.identity.address for n in self.nodes),
            marks=sn.marks,
            claim_settle_ms=self.opts.claim_settle_ms,
            swim=self.opts.swim,
        )
