"""Content validation at ingest, and trusted replay of what was stored."""

from __future__ import annotations

import random

import pytest

from hivemesh import errors
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.journal import Journal
from hivemesh.core.node import Node
from hivemesh.core.store import MemoryStore
from hivemesh.core.views import ContextView, standard_views

A = Identity.from_seed(b"A" * 32)
B = Identity.from_seed(b"B" * 32)
C = Identity.from_seed(b"C" * 32)


def _writes(who: Identity, n: int, seed: int) -> list[tuple[str, object]]:
    rng = random.Random(seed)
    view = ContextView(who.public)
    ctx = view.context("shared")
    out: list[tuple[str, object]] = []
    for i in range(n):
        if rng.random() < 0.6:
            ctx[f"k{rng.randrange(5)}"] = f"{who.address[:6]}-{i}"
        else:
            ctx.list("chat").append(i)
        upd = view.pending_update()
        assert upd is not None
        out.append(upd)
    return out


def _sealed(who: Identity, items: list[tuple[str, object]], head: Head | None = None):  # type: ignore[no-untyped-def]
    w = FeedWriter(who, head or Head(), HLC())
    for kind, body in items:
        w.append(kind, body, 1_000)
    sealed = w.seal()
    assert sealed is not None
    return [e.raw for e in sealed[0]], sealed[1], w.head


def _journal() -> tuple[Journal, ContextView]:
    j = Journal(MemoryStore())
    view = ContextView(None)
    j.add_view(view)
    return j, view


def test_foreign_operations_are_refused_before_storage() -> None:
    j, view = _journal()
    a_updates = _writes(A, 3, 1)
    raws, sig, _ = _sealed(B, [a_updates[0]])  # B relays A's operations as its own
    with pytest.raises(errors.ForeignOperations):
        j.ingest(B.public, raws, sig)
    assert j.total_events == 0 and B.public not in j.heads
    assert view.rejected["foreign_ops"] == 1


def test_out_of_order_ops_inside_one_batch_are_refused() -> None:
    j, _ = _journal()
    ups = _writes(A, 3, 2)
    raws, sig, _ = _sealed(A, [ups[0], ups[2]])  # skips the middle update
    with pytest.raises(errors.OpsOutOfOrder):
        j.ingest(A.public, raws, sig)
    assert j.total_events == 0


def test_replay_gives_the_same_views_as_live_ingest() -> None:
    store = MemoryStore()
    live = Node(C, store, random.Random(1), now_ms=0)
    live_views = standard_views(C.public)
    for v in live_views:
        live.add_view(v)
    a_updates = _writes(A, 25, 3)
    raws, sig, a_head = _sealed(A, a_updates[:20])
    live.journal.ingest(A.public, raws, sig)
    raws, sig, _ = _sealed(B, _writes(B, 20, 4))
    live.journal.ingest(B.public, raws, sig)
    ctx = next(v for v in live_views if isinstance(v, ContextView))
    ctx.context("mine")["x"] = 1
    while (upd := ctx.pending_update()) is not None:
        live.append(*upd, 2_000)
    # Restart: a fresh node over the same store rebuilds its views by trusted replay.
    again = Node(C, store, random.Random(2), now_ms=3_000)
    again_views = standard_views(C.public)
    for v in again_views:
        again.add_view(v)
    from hivemesh.sim.cluster import replay_store

    again.rehydrate(replay_store(store))
    assert [v.digest() for v in again_views] == [v.digest() for v in live_views]
    # ...and keeps validating new remote updates from where the feeds stopped.
    raws, sig, _ = _sealed(A, a_updates[20:], a_head)
    again.journal.ingest(A.public, raws, sig)
    assert sum(v.rejected.total() for v in again_views) == 0
    assert again.journal.head(A.public).seq == 25
