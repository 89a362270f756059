"""Rehydration in causal order: the same views as feed by feed, without
loro's pending queue (issue 12, item 7)."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hivemesh.bench._shared_history import shared_history
from hivemesh.core.causal import causal_merge
from hivemesh.core.event import Event, encode_event
from hivemesh.core.journal import Journal
from hivemesh.core.store import FeedStore, MemoryStore
from hivemesh.core.views import ContextView, View, standard_views
from hivemesh.errors import StoreCorrupt
from hivemesh.sim.cluster import Cluster, replay_store
from hivemesh.sim.options import FaultOptions, SimOptions
from hivemesh.stores.replay import verify_batches, verify_causal
from hivemesh.stores.sqlite import SQLiteStore
from store_rows import event_raw, set_event_raw

Replay = Callable[[FeedStore], Iterator[list[Event]]]


def _fill(store: FeedStore, updates: int, authors: int, seed: int, others: float = 0.0) -> int:
    n = 0
    for author, events, sig in shared_history(updates, authors, seed, others=others):
        store.append(author, events, sig)
        n += len(events)
    return n


def _views(store: FeedStore, replay: Replay) -> tuple[list[View], int]:
    journal = Journal(store)
    views = standard_views(None)
    for view in views:
        journal.add_view(view)
    n = 0
    for run in replay(store):
        journal.apply_to_views(run, replay=True)
        n += len(run)
    return views, n


def _ctx(views: list[View]) -> ContextView:
    return next(v for v in views if isinstance(v, ContextView))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    updates=st.integers(1, 160),
    authors=st.integers(1, 5),
    seed=st.integers(0, 10_000),
    others=st.sampled_from([0.0, 0.2, 0.5]),
    sqlite=st.booleans(),
)
def test_causal_replay_equals_feed_by_feed(
    updates: int, authors: int, seed: int, others: float, sqlite: bool
) -> None:
    """Every view's digest and rejections are those of a feed-by-feed replay."""
    with tempfile.TemporaryDirectory() as tmp:
        store: FeedStore = SQLiteStore(Path(tmp) / "s.db") if sqlite else MemoryStore()
        n = _fill(store, updates, authors, seed, others)
        feed, n1 = _views(store, verify_batches)
        causal, n2 = _views(store, verify_causal)
        assert n1 == n2 == n
        for a, b in zip(feed, causal, strict=True):
            assert a.digest() == b.digest(), type(a).__name__
            assert a.rejected == b.rejected
        assert _ctx(causal).imports_pending == 0
        store.close()


def test_causal_replay_leaves_no_import_pending(tmp_path: Path) -> None:
    """The cost of feed-by-feed replay, counted: with 5 authors interleaving
    on one context, most imports wait in loro's pending queue; in causal
    order none does."""
    with SQLiteStore(tmp_path / "s.db") as store:
        _fill(store, 3000, 5, 7)
        feed, _ = _views(store, verify_batches)
        causal, _ = _views(store, verify_causal)
    assert _ctx(feed).imports == _ctx(causal).imports == 3000
    assert _ctx(feed).imports_pending > 1500
    assert _ctx(causal).imports_pending == 0
    assert _ctx(feed).digest() == _ctx(causal).digest()


def _ev(author: bytes, seq: int, hlc: int) -> Event:
    return encode_event(author, seq, b"\0" * 32, hlc, "k", None)


def test_causal_merge_orders_by_hlc_then_author_keeping_each_feed() -> None:
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    fa = [[_ev(a, 1, 5), _ev(a, 2, 9)], [_ev(a, 3, 3), _ev(a, 4, 20)]]  # a's clock went back
    fb = [[_ev(b, 1, 5), _ev(b, 2, 6)], [], [_ev(b, 3, 30)]]
    fc: list[list[Event]] = [[]]
    out = [
        (e.author[:1], e.seq) for run in causal_merge([iter(fa), iter(fb), iter(fc)]) for e in run
    ]
    assert out == [
        (b"a", 1),  # hlc 5, the smaller author first
        (b"b", 1),
        (b"b", 2),
        (b"a", 2),
        (b"a", 3),  # after a#2 although its hlc is smaller: a feed's order is kept
        (b"a", 4),
        (b"b", 3),
    ]
    assert a < b < c


def test_causal_replay_detects_tampering(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        _fill(store, 200, 3, 3)
    db = sqlite3.connect(path, isolation_level=None)
    (author,) = db.execute("SELECT author FROM feeds WHERE last_seq >= 17 LIMIT 1").fetchone()
    raw = event_raw(db, author, 17)
    set_event_raw(db, author, 17, raw[:-1] + bytes([raw[-1] ^ 1]))
    db.close()
    with SQLiteStore(path) as store, pytest.raises(StoreCorrupt, match=r"#1[78]: "):
        for _ in verify_causal(store):
            pass


def test_sim_restarts_replay_in_causal_order() -> None:
    """Simulator scenario: nodes crash and restart while five write to one
    shared context; every restart's replay (the sim's, as the daemon's, in
    causal order) leaves no loro import pending. Feed by feed it left most
    of them pending."""
    opts = SimOptions(
        nodes=5,
        appends=600,
        faults=FaultOptions(crash_probability=1.0, partition_probability=0.0, forgeries=0),
    )
    result = Cluster("replay-order", opts).run()
    assert not result.violations
    assert result.stats["replay_imports"] > 200
    assert result.stats["replay_imports_pending"] == 0


def test_sim_replay_store_is_causal() -> None:
    """The simulator's replay of a store from the shared history."""
    store = MemoryStore()
    _fill(store, 800, 5, 11)
    view = ContextView(None)
    for ev in replay_store(store):
        view.replay(ev)
    assert view.imports == 800 and view.imports_pending == 0


def _bad(author: bytes, seq: int, body: object) -> Event:
    return encode_event(author, seq, b"\x00" * 32, seq, "ctx.update", body)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    updates=st.integers(1, 120),
    authors=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    causal=st.booleans(),
    own=st.booleans(),
    size=st.sampled_from([1, 7, 64, 512]),
)
def test_replay_many_equals_replay_one_by_one(
    updates: int, authors: int, seed: int, causal: bool, own: bool, size: int
) -> None:
    """ContextView.replay_many (the rehydration path) leaves the view exactly
    as replay() event by event does: state, imports, imports left pending,
    rejections and where each author's next operation must start; in causal
    order and feed by feed (imports left pending), as the node itself or
    not, whatever the slice size, with malformed bodies mixed in."""
    store = MemoryStore()
    _fill(store, updates, authors, seed, others=0.2)
    events = [ev for run in (verify_causal if causal else verify_batches)(store) for ev in run]
    me = events[0].author if own else None
    junk = [_bad(events[0].author, 10**6, b) for b in ({"c": 1, "u": b""}, {"c": "x"}, [1])]
    events[1:1] = junk
    one, many = ContextView(me), ContextView(me)
    for ev in events:
        if ev.kind == "ctx.update":
            one.replay(ev)
    for i in range(0, len(events), size):
        many.replay_many(events[i : i + size])
    assert many.digest() == one.digest()
    assert (many.imports, many.imports_pending, many.applied) == (
        one.imports,
        one.imports_pending,
        one.applied,
    )
    assert many.rejected == one.rejected and sum(one.rejected.values()) == 3
    assert many._next == one._next and many._exported == one._exported
    assert (many.checkpoint() is None) == (one.checkpoint() is None)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    updates=st.integers(8, 120),
    authors=st.integers(1, 4),
    seed=st.integers(0, 10_000),
    at=st.floats(0.1, 0.9),
    own=st.booleans(),
    size=st.sampled_from([7, 64, 512]),
)
def test_replay_many_malformed_update_inside_a_run(
    updates: int, authors: int, seed: int, at: float, own: bool, size: int
) -> None:
    """A malformed update in the middle of an author's run (corrupted loro
    bytes, a foreign context name, a body of the wrong shape, a repeated
    update) leaves replay_many exactly where replay() event by event does:
    the same events rejected with the same codes, the same state, version
    vectors, next-op table and checkpoint; the run's later updates still
    import."""
    store = MemoryStore()
    _fill(store, updates, authors, seed)
    events = [ev for run in verify_causal(store) for ev in run]
    k = int(len(events) * at)
    ev = events[k]
    blob = ev.body["u"]
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x55
    name = ev.body["c"]

    def like(body: object) -> Event:  # ``ev`` with another body
        return Event(ev.author, ev.seq, ev.prev, ev.hlc, ev.kind, body, ev.raw, ev.id)

    junk = [
        like({"c": name, "u": bytes(flipped)}),
        like({"c": "elsewhere", "u": blob}),
        like({"c": name, "u": blob, "x": 1}),
        ev,  # the same update again
    ]
    events[k + 1 : k + 1] = junk
    me = ev.author if own else None
    one, many = ContextView(me), ContextView(me)
    for e in events:
        one.replay(e)
    for i in range(0, len(events), size):
        many.replay_many(events[i : i + size])
    assert sum(one.rejected.values()) >= 2  # the shape and the corrupted bytes at least
    assert many.rejected == one.rejected
    assert (many.imports, many.imports_pending, many.applied) == (
        one.imports,
        one.imports_pending,
        one.applied,
    )
    assert many._next == one._next and many._exported == one._exported
    assert many.names() == one.names()
    for name in one.names():
        assert many._docs[name].oplog_vv == one._docs[name].oplog_vv
    assert many.digest() == one.digest()
    assert many.checkpoint() == one.checkpoint()
