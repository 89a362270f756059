"""A simulated disk under a node's store: a write cache that a crash can lose.

The store contract (:mod:`hivemesh.core.store`) lets a store hold a batch
appended with ``durable=False`` (one replicated from a peer, which other
replicas still hold) in a group commit until :meth:`~hivemesh.core.store.FeedStore.sync`
or the next durable append. :class:`DiskStore` keeps those batches in a write
cache, as a real disk does until the fsync, and the simulator's driver calls
:meth:`DiskStore.sync` one group-commit delay after they arrive, as the
daemon does. A crash may then hit before the sync (:meth:`DiskStore.power_loss`):

* **lost fsync** -- every cached batch is gone: the store ends where the last
  sync left it;
* **torn write** -- the batch being written when the power went is cut part
  way; the store's recovery keeps its feed up to the last signed event at or
  before the cut (the contract: a stored head is always signed).

The node must fetch what it lost again by anti-entropy. A durable append (a
node's own batch, acknowledged to its application) is never in the cache,
and neither is anything before it: losing it is the *damaged log* scenario
of :mod:`hivemesh.sim.cluster`, which the own-feed mark must catch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from hivemesh.core.event import Event
from hivemesh.core.store import MemoryStore

__all__ = ["DiskStore"]


class DiskStore(MemoryStore):
    """A :class:`~hivemesh.core.store.MemoryStore` with a write cache (module docs)."""

    def __init__(self) -> None:
        super().__init__()
        #: Cached (not yet synced) batches, oldest first: (author, first seq, last seq).
        self.cached: list[tuple[bytes, int, int]] = []

    def append(
        self, author: bytes, events: Sequence[Event], sig: bytes, *, durable: bool = True
    ) -> None:
        """Store a batch; a durable one syncs the cache first (the contract)."""
        super().append(author, events, sig, durable=durable)
        if durable:
            self.cached.clear()
        elif events:
            self.cached.append((author, events[0].seq, events[-1].seq))

    def sync(self) -> None:
        """The group commit's fsync: the cache is on disk."""
        self.cached.clear()

    def power_loss(self, rng: random.Random, *, torn: bool) -> int:
        """Lose the cache (module docs); with ``torn`` the newest cached batch
        is only cut part way. Returns how many cached batches were hit."""
        hit = len(self.cached)
        if torn and self.cached:
            author, first, last = self.cached.pop()
            self.truncate(author, rng.randrange(first - 1, last))
        for author, first, _last in reversed(self.cached):
            self.truncate(author, first - 1)
        self.cached.clear()
        return hit

    def copy(self) -> DiskStore:
        """A backup of what is on disk (the cache is not)."""
        other = DiskStore()
        vars(other).update(vars(super().copy()))  # the disk's contents, independent
        other.cached = []
        for author, first, _last in reversed(self.cached):
            other.truncate(author, first - 1)
        return other
