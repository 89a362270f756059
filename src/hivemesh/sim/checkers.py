"""Invariants checked after every simulated run.

* **convergence** -- after the heal phase every replica holds the same feeds
  (equal version vectors) and the same views (equal digests);
* **durability** -- every event acknowledged to the workload as appended is
  held, with the same id, by every replica (except those an operator gave
  up, on the record, when no replica held them);
* **integrity** -- no forged event is held anywhere, and every stored feed
  re-verifies (hash chain contiguous, last event covered by a valid head
  signature);
* **honesty** -- no fork was ever reported, in any life of any node (all
  authors are honest here, so a fork can only be a node forking its own
  feed: after a restore or a damaged log it must recover first);
* **own feeds** -- after the heal every node writes its own feed again.

All of them are checked over :attr:`Cluster.honest` (every node, unless an
adversarial workload such as :mod:`hivemesh.sim.adversary` says otherwise).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from hivemesh.core.event import GENESIS, decode_event
from hivemesh.core.feed import head_message
from hivemesh.core.identity import verify
from hivemesh.core.store import MemoryStore

if TYPE_CHECKING:
    from hivemesh.sim.cluster import Cluster

__all__ = ["check_cluster", "verify_store"]


def verify_store(store: MemoryStore) -> list[str]:
    """Re-verify every feed in ``store``; return problems found."""
    return _verify_feeds(store)[0]


def _verify_feeds(store: MemoryStore) -> tuple[list[str], set[bytes]]:
    """Problems found in ``store``'s feeds, and the ids of every stored event
    (one decode per event serves both the chain check and the forgery check)."""
    problems = []
    held: set[bytes] = set()
    for author, raws, sigs in store.scan():
        prev = GENESIS
        ids = []
        for i, raw in enumerate(raws, start=1):
            ev = decode_event(raw)
            held.add(ev.id)
            if ev.seq != i or ev.prev != prev or ev.author != author:
                problems.append(f"feed {author.hex()[:8]} broken at #{i}")
                break
            prev = ev.id
            ids.append(ev.id)
        signed = dict(sigs)
        if raws and len(raws) not in signed:
            problems.append(f"feed {author.hex()[:8]} head #{len(raws)} unsigned")
        for seq, sig in sigs:
            if seq > len(ids) or not verify(author, sig, head_message(author, seq, ids[seq - 1])):
                problems.append(f"feed {author.hex()[:8]} bad signature at #{seq}")
    return problems, held


def check_cluster(c: Cluster) -> list[str]:
    """All violations of the invariants above for the finished run ``c``."""
    out: list[str] = []
    if any(n.node is None for n in c.nodes):
        out.append("a node is still down after the heal phase")
    live = [n for n in c.honest if n.node is not None]
    vvs = {n.index: n.node.journal.version_vector() for n in live if n.node}
    first = next(iter(vvs.values()), {})
    for i, vv in vvs.items():
        if vv != first:
            out.append(f"node {i} did not converge: {sum(vv.values())} vs {sum(first.values())}")
    digests = {n.digest.digest() for n in live}
    if len(digests) > 1:
        out.append("journals differ between replicas")
    for k in range(len(live[0].views) if live else 0):
        view_digests = {n.views[k].digest() for n in live}
        if len(view_digests) > 1:
            out.append(f"view {type(live[0].views[k]).__name__} differs between replicas")
        rejected = sum(sum(n.views[k].rejected.values()) for n in live)
        if rejected:
            out.append(f"view {type(live[0].views[k]).__name__} rejected {rejected} honest events")
    for n in c.honest:
        problems, stored = _verify_feeds(n.store)
        for ev in c.acknowledged:  # an event id names its author, seq and content
            if ev.id not in stored and ev.id not in c.given_up:
                out.append(f"node {n.index} lost acknowledged event #{ev.seq}")
                break
        if stored.intersection(c.forged):
            out.append(f"node {n.index} stored a forged event")
        out.extend(f"node {n.index}: {p}" for p in problems)
        counters = n.past_counters + (n.node.counters if n.node is not None else Counter())
        if counters["fork"]:
            out.append(f"node {n.index} reported a fork from an honest author")
        if counters["own_feed_conflict"]:
            out.append(f"node {n.index} found its own feed forked")
        if n.node is not None and not n.node.feed_gate.writable:
            out.append(f"node {n.index} still refuses writes: {n.node.feed_gate.reason()}")
    if c.opts.claim_tasks:
        done = {t for t, _ in c.executions}
        if len(done) != c.opts.claim_tasks:
            out.append(f"claims: only {len(done)} of {c.opts.claim_tasks} tasks were executed")
    return out
