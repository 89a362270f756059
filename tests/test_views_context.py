"""Context view: convergence under any delivery, author binding, garbage."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hivemesh.core.event import Event
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.views.base import View
from hivemesh.core.views.context import (
    KIND_UPDATE,
    MAX_UPDATE_BYTES,
    ContextView,
    peer_id_of,
)
from hivemesh.errors import ContextBroken, ContextCatchingUp, InvalidArgument, InvalidEncoding

SEEDS = [bytes([i]) * 32 for i in range(1, 5)]


class Journal:
    """What the journal guarantees a view: each event once, per-author seq order.

    Deliveries may be duplicated and out of order; out-of-order events wait
    until the gap is filled, duplicates are dropped.
    """

    def __init__(self, view: Any) -> None:
        self.view = view
        self.head: dict[bytes, int] = {}
        self.held: dict[tuple[bytes, int], Event] = {}

    def deliver(self, ev: Event) -> None:
        if ev.seq <= self.head.get(ev.author, 0):
            return
        self.held[(ev.author, ev.seq)] = ev
        nxt = self.head.get(ev.author, 0) + 1
        while (ev.author, nxt) in self.held:
            self.view.apply(self.held.pop((ev.author, nxt)))
            self.head[ev.author] = nxt
            nxt += 1


class Author:
    def __init__(self, seed: bytes) -> None:
        self.id = Identity.from_seed(seed)
        self.feed = FeedWriter(self.id, Head(), HLC())
        self.view = ContextView(self.id.public)
        self.journal = Journal(self.view)
        self.events: list[Event] = []
        self.now = 1_000

    def flush(self) -> None:
        while (u := self.view.pending_update()) is not None:
            self.now += 1
            ev = self.feed.append(u[0], u[1], self.now)
            self.events.append(ev)
            self.journal.deliver(ev)


def do_op(author: Author, op: tuple[Any, ...]) -> None:
    ctx = author.view.context(op[1])
    kind = op[0]
    if kind == "set":
        ctx[op[2]] = op[3]
    elif kind == "del":
        if op[2] in ctx:
            del ctx[op[2]]
    elif kind == "append":
        ctx.list("chat").append(op[3])
    elif kind == "add":
        ctx.counter("n").add(op[3])
    elif kind == "text":
        t = ctx.text("notes")
        t.insert(min(op[3], len(t)), op[2])


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=3),
)
ctx_names = st.sampled_from(["default", "task-1"])
keys = st.sampled_from(["a", "b", "c"])
ops = st.one_of(
    st.tuples(st.just("set"), ctx_names, keys, values),
    st.tuples(st.just("del"), ctx_names, keys),
    st.tuples(st.just("append"), ctx_names, st.none(), values),
    st.tuples(st.just("add"), ctx_names, st.none(), st.integers(-5, 5)),
    st.tuples(st.just("text"), ctx_names, st.text(min_size=1, max_size=4), st.integers(0, 9)),
)
# A step: author i does some ops then exports, or author i syncs from author j.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 3), st.lists(ops, min_size=1, max_size=3)),
        st.tuples(st.just("sync"), st.integers(0, 3), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=12,
)


def run_script(n_authors: int, script: list[Any]) -> list[Author]:
    authors = [Author(SEEDS[i]) for i in range(n_authors)]
    for step in script:
        if step[0] == "write":
            a = authors[step[1] % n_authors]
            for op in step[2]:
                do_op(a, op)
            a.flush()
        else:
            a, b = authors[step[1] % n_authors], authors[step[2] % n_authors]
            for ev in b.events:
                a.journal.deliver(ev)
    return authors


def delivery(rng: random.Random, events: list[Event]) -> list[Event]:
    """A shuffled delivery with duplicates (the journal sorts it out)."""
    out = events + rng.sample(events, k=len(events) // 2)
    rng.shuffle(out)
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 4), script=steps, seed=st.integers(0, 2**32))
def test_any_delivery_order_gives_identical_view(n: int, script: list[Any], seed: int) -> None:
    authors = run_script(n, script)
    everything = [ev for a in authors for ev in a.events]
    rng = random.Random(seed)

    reference = ContextView()
    for a in authors:  # author by author, in seq order
        for ev in a.events:
            reference.apply(ev)
    assert not reference.rejected

    # Replica 1: one shuffled, duplicated delivery.
    r1 = Journal(ContextView())
    for ev in delivery(rng, everything):
        r1.deliver(ev)
    # Replica 2: a split -- a random part first, digest taken, the rest later.
    r2 = Journal(ContextView())
    cut = rng.randint(0, len(everything))
    for ev in delivery(rng, everything[:cut]):
        r2.deliver(ev)
    r2.view.digest()
    r2.view.snapshot()
    for ev in delivery(rng, everything):
        r2.deliver(ev)

    assert r1.view.snapshot() == reference.snapshot()
    assert r1.view.digest() == reference.digest()
    assert r2.view.digest() == reference.digest()
    assert not r1.view.rejected and not r2.view.rejected
    # Writers that then see everything agree too (their own events were idempotent).
    for a in authors:
        for ev in everything:
            a.journal.deliver(ev)
        assert a.view.digest() == reference.digest()
        assert not a.view.rejected


def test_view_protocol() -> None:
    assert isinstance(ContextView(), View)
    assert ContextView.kinds == frozenset({KIND_UPDATE})


def test_typed_api_roundtrip() -> None:
    a = Author(SEEDS[0])
    ctx = a.view.context()
    ctx["k"] = {"x": [1, 2.5, None, True, b"\x00", "s"]}
    assert ctx["k"] == {"x": [1, 2.5, None, True, b"\x00", "s"]}
    assert ctx.get("missing", 7) == 7
    assert "k" in ctx and "missing" not in ctx
    del ctx["k"]
    with pytest.raises(KeyError):
        ctx["k"]
    with pytest.raises(KeyError):
        del ctx["k"]
    chat = ctx.list("chat")
    chat.append("hello")
    chat.insert(0, "first")
    assert chat.to_list() == ["first", "hello"] and len(chat) == 2 and chat[1] == "hello"
    chat.delete(0)
    ctx.counter("n").add(2)
    ctx.counter("n").add(-5)
    assert ctx.counter("n").value == -3
    t = ctx.text("notes")
    t.append("helo")
    t.insert(3, "l")
    assert str(t) == "hello"
    ctx["x"] = 1
    assert ctx.to_dict() == {"x": 1}
    assert ctx.keys() == ["x"]
    a.flush()
    replica = ContextView()
    for ev in a.events:
        replica.apply(ev)
    r = replica.context()
    assert r.to_dict() == {"x": 1} and r.list("chat").to_list() == ["hello"]
    assert r.counter("n").value == -3 and str(r.text("notes")) == "hello"
    assert replica.digest() == a.view.digest()


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), 2**63, -(2**63) - 1, {1: 2}, object(), (1, 2), {"a": {1}}],
)
def test_local_writes_reject_non_json_values(value: Any) -> None:
    ctx = Author(SEEDS[0]).view.context()
    with pytest.raises(InvalidArgument):
        ctx["k"] = value
    with pytest.raises(InvalidArgument):
        ctx.list("l").append(value)


def test_text_that_is_not_unicode_is_refused_before_the_doc_changes() -> None:
    """A lone surrogate (what a bad argv or a careless caller produces) in a
    key, a value, a nested key, a list item, text or a set element is a typed
    error at the write, and the doc and the next export are untouched."""
    a = Author(SEEDS[0])
    ctx = a.view.context()
    ctx["ok"] = 1
    a.flush()
    bad = "x\udcff"
    writes = [
        lambda: ctx.__setitem__(bad, 1),
        lambda: ctx.__setitem__("k", bad),
        lambda: ctx.__setitem__("k", {"nested": [bad]}),
        lambda: ctx.__setitem__("k", {bad: 1}),
        lambda: ctx.list("l").append(bad),
        lambda: ctx.text("t").append(bad),
        lambda: ctx.gset("g").add(bad),
        lambda: ctx.orset("o").add(bad),
        lambda: ctx.__delitem__(bad),
    ]
    for write in writes:
        with pytest.raises(InvalidEncoding):
            write()
    ctx["after"] = 2  # the view still writes and exports
    a.flush()
    assert ctx.to_dict() == {"after": 2, "ok": 1}


def test_read_only_view_and_bad_names() -> None:
    view = ContextView()
    with pytest.raises(InvalidArgument):
        view.context()["k"] = 1
    assert view.pending_update() is None
    with pytest.raises(InvalidArgument):
        view.context("Bad Name")
    with pytest.raises(InvalidArgument):
        Author(SEEDS[0]).view.context().list("")


def test_oversize_value_refused_and_big_exports_split() -> None:
    a = Author(SEEDS[0])
    ctx = a.view.context()
    with pytest.raises(InvalidArgument):
        ctx["big"] = b"x" * (70 * 1024)
    for i in range(8):  # 8 x 60 KiB of incompressible-ish data: must split
        ctx[f"k{i}"] = random.Random(i).randbytes(60 * 1024)
    a.flush()
    assert len(a.events) >= 2
    assert all(len(ev.body["u"]) <= MAX_UPDATE_BYTES for ev in a.events)
    replica = ContextView()
    for ev in a.events:
        replica.apply(ev)
    assert not replica.rejected
    assert replica.digest() == a.view.digest()


def test_lww_tie_break_is_lamport_then_author() -> None:
    a, b = Author(SEEDS[0]), Author(SEEDS[1])
    hi, lo = (a, b) if a.id.public > b.id.public else (b, a)
    assert peer_id_of(hi.id.public) > peer_id_of(lo.id.public)
    # Concurrent writes (neither saw the other): the larger author key wins.
    lo.view.context()["k"] = "lo"
    hi.view.context()["k"] = "hi"
    lo.flush()
    hi.flush()
    for x, y in ((lo, hi), (hi, lo)):
        for ev in y.events:
            x.journal.deliver(ev)
    assert lo.view.context()["k"] == hi.view.context()["k"] == "hi"
    # A write that has seen the current value wins, whatever the key.
    lo.view.context()["k"] = "lo-again"
    lo.flush()
    for ev in lo.events:
        hi.journal.deliver(ev)
    assert hi.view.context()["k"] == "lo-again"


def test_foreign_operations_are_rejected() -> None:
    a, b = Author(SEEDS[0]), Author(SEEDS[1])
    a.view.context()["owner"] = "a"
    a.flush()
    (ev_a,) = a.events
    replica = ContextView()
    before = replica.digest()
    # b re-publishes a's update in its own feed.
    forged = b.feed.append(KIND_UPDATE, ev_a.body, 5_000)
    replica.apply(forged)
    assert replica.rejected == {"foreign_ops": 1}
    assert replica.digest() == before and replica.applied == 0
    # b merges a's ops with its own and exports everything it has.
    b.journal.deliver(ev_a)
    b.view.context()["owner"] = "b"
    b.view.pending_update()
    from loro import ExportMode, VersionVector

    doc = b.view._docs["default"]
    mixed = doc.export(ExportMode.Updates(from_=VersionVector()))
    replica.apply(b.feed.append(KIND_UPDATE, {"c": "default", "u": mixed}, 6_000))
    assert replica.rejected == {"foreign_ops": 2}
    assert replica.digest() == before
    # a's genuine event is still accepted afterwards.
    replica.apply(ev_a)
    assert replica.context()["owner"] == "a"


def test_replayed_or_skipped_ops_are_rejected() -> None:
    a = Author(SEEDS[0])
    for i in range(3):
        a.view.context()[f"k{i}"] = i
        a.flush()
    e1, e2, e3 = a.events
    replica = ContextView()
    replica.apply(e1)
    replica.apply(e3)  # skips e2's operations
    assert replica.rejected == {"ops_out_of_order": 1}
    replica.apply(e2)
    # The same operations again in a later event of the same author.
    again = a.feed.append(KIND_UPDATE, e2.body, 9_000)
    before = replica.digest()
    replica.apply(again)
    assert replica.rejected == {"ops_out_of_order": 2}
    assert replica.digest() == before
    assert replica.context().to_dict() == {"k0": 0, "k1": 1}


def test_rehydrated_writer_continues_its_counters() -> None:
    a = Author(SEEDS[0])
    a.view.context()["x"] = 1
    a.view.context().list("chat").append("m1")
    a.flush()
    # Restart: a fresh view with the same author replays the feed.
    fresh = ContextView(a.id.public)
    for ev in a.events:
        fresh.apply(ev)
    assert fresh.pending_update() is None
    fresh.context().list("chat").append("m2")
    kind, body = fresh.pending_update() or ("", {})
    ev = a.feed.append(kind, body, 9_999)
    replica = ContextView()
    for e in [*a.events, ev]:
        replica.apply(e)
    assert not replica.rejected
    assert replica.context().list("chat").to_list() == ["m1", "m2"]


garbage = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(),
        st.text(max_size=8),
        st.binary(max_size=40),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["c", "u", "x"]), inner, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(body=garbage, name=st.sampled_from(["default", "Bad", "", "x" * 80]))
def test_garbage_bodies_never_crash(body: Any, name: str) -> None:
    a = Author(SEEDS[0])
    view = ContextView()
    for b in (body, {"c": name, "u": body}, {"c": "default", "u": body}):
        ev = a.feed.append(KIND_UPDATE, b, 1_000)
        before = view.digest()
        view.apply(ev)
        assert view.digest() == before
    assert sum(view.rejected.values()) == 3


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_corrupted_updates_never_crash(data: st.DataObject) -> None:
    a = Author(SEEDS[0])
    ctx = a.view.context()
    ctx["k"] = "v"
    ctx.list("chat").append(1)
    kind, body = a.view.pending_update() or ("", {})
    blob = bytearray(body["u"])
    how = data.draw(st.sampled_from(["flip", "truncate", "extend"]))
    if how == "flip":
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        del blob[data.draw(st.integers(0, len(blob) - 1)) :]
    else:
        blob += data.draw(st.binary(min_size=1, max_size=16))
    view = ContextView()
    ev = a.feed.append(kind, {"c": "default", "u": bytes(blob)}, 1_000)
    view.apply(ev)  # must not raise
    assert view.applied + sum(view.rejected.values()) == 1
    if view.rejected:
        assert view.snapshot() == {}
    else:  # only changes loro does not read (unused checksum bytes) get through
        assert view.snapshot() == a.view.snapshot()


def test_update_waits_for_its_dependencies() -> None:
    a, b = Author(SEEDS[0]), Author(SEEDS[1])
    a.view.context()["k"] = "from a"
    a.flush()
    b.journal.deliver(a.events[0])
    b.view.context()["k"] = "b saw a"  # causally after a's write
    b.flush()
    replica = ContextView()
    replica.apply(b.events[0])  # arrives first: held by loro, not visible
    assert not replica.rejected and replica.snapshot() == {}
    replica.apply(a.events[0])
    assert replica.context()["k"] == "b saw a"
    assert replica.digest() == b.view.digest()


def test_remote_import_between_local_write_and_export() -> None:
    a, b = Author(SEEDS[0]), Author(SEEDS[1])
    b.view.context()["from-b"] = 1
    b.flush()
    a.view.context()["from-a"] = 2  # not yet exported
    a.journal.deliver(b.events[0])
    a.flush()
    assert len(a.events) == 1
    replica = ContextView()
    for ev in (a.events[0], b.events[0]):
        replica.apply(ev)
    assert not replica.rejected
    assert replica.context().to_dict() == {"from-a": 2, "from-b": 1}


def test_other_container_types_converge() -> None:
    a = Author(SEEDS[0])
    doc = a.view._docs.setdefault("default", a.view._doc("default"))
    doc.get_movable_list("m").push(1)
    doc.get_map("extra").insert("x", 1)
    a.flush()
    replica = ContextView()
    replica.apply(a.events[0])
    assert not replica.rejected
    snap = replica.snapshot()["default"]
    assert snap["other"] == {"m:MovableList": [1], "extra:Map": {"x": 1}}
    assert replica.digest() == a.view.digest()


WRITES: list[Any] = [
    lambda c: c.__setitem__("k", 2),
    lambda c: c.__delitem__("k"),
    lambda c: c.list("chat").append("m"),
    lambda c: c.list("chat").insert(0, "m"),
    lambda c: c.counter("n").add(1),
    lambda c: c.text("t").append("x"),
    lambda c: c.gset("g").add("x"),
    lambda c: c.orset("o").add("x"),
    lambda c: c.orset("o").discard("x"),
]


def _restored_with_own_ops_pending() -> tuple[Author, Author, ContextView]:
    """``a`` wrote after seeing ``b``; a's restored view gets a's own update
    back before b's: loro holds a's operations pending."""
    a, b = Author(SEEDS[0]), Author(SEEDS[1])
    b.view.context()["from-b"] = 1
    b.view.context().orset("o").add("x")
    b.flush()
    a.journal.deliver(b.events[0])
    a.view.context()["k"] = 1
    a.flush()
    restored = ContextView(a.id.public)
    restored.apply(a.events[0])  # own update first: waits for b's
    return a, b, restored


@pytest.mark.parametrize("write", WRITES)
def test_no_local_write_while_own_earlier_ops_wait_for_dependencies(write: Any) -> None:
    """Every kind of write is refused while the author's own operations are
    held pending (it would reuse their ids); nothing changes; once the
    dependencies arrive the write goes through and every replica agrees."""
    a, b, restored = _restored_with_own_ops_pending()
    ctx = restored.context()
    with pytest.raises(ContextCatchingUp):
        write(ctx)
    assert restored.pending_update() is None
    restored.apply(b.events[0])
    write(ctx)
    kind, body = restored.pending_update() or ("", {})
    ev = a.feed.append(kind, body, 9_999)
    restored.apply(ev)
    replica = ContextView()
    journal = Journal(replica)
    for e in [ev, *a.events, *b.events]:  # the journal puts each feed in order
        journal.deliver(e)
    assert not replica.rejected and not restored.rejected
    assert replica.digest() == restored.digest()


def test_a_loro_panic_breaks_one_context_with_a_typed_error() -> None:
    """If loro panics on a doc (here: forced by a write that reuses pending
    operation ids behind the view's back, which the view itself refuses),
    that context raises ContextBroken from then on and is counted; nothing
    escapes as a BaseException, and other contexts keep working."""
    a, b = Author(SEEDS[0]), Author(SEEDS[1])
    a.view.context()["k0"] = 0
    a.flush()
    for i in range(3):  # b's operations lift the Lamport clock of a's next ones
        b.view.context()[f"from-b{i}"] = i
    b.flush()
    a.journal.deliver(b.events[0])
    a.view.context()["k1"] = 1  # two operations in one change, after b's
    a.view.context()["k2"] = 2
    a.flush()
    restored = ContextView(a.id.public)
    for ev in a.events:  # the second waits for b's update
        restored.apply(ev)
    restored.context("other")["fine"] = 1
    doc = restored._docs["default"]
    ContextView._attach(doc)
    doc.get_map("kv").insert("reused-id", 1)  # takes the id of a pending op
    doc.commit()
    restored.apply(b.events[0])  # the pending ops apply: loro panics
    assert restored.rejected[ContextBroken.code] == 1
    with pytest.raises(ContextBroken):
        restored.context()["k1"]
    with pytest.raises(ContextBroken):
        restored.context()["k1"] = 3
    restored.apply(b.events[0])  # later imports into it are counted, not attempted
    assert restored.rejected[ContextBroken.code] == 2
    assert restored.context("other")["fine"] == 1
    assert restored.pending_update() is not None  # "other" still exports
    assert "default" not in restored.snapshot()
