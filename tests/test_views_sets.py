"""Context set types: a grow-only set and an add-wins observed-remove set.

The property tests compare every replica, at every step, with an abstract
model of each set written from its definition (an OR-set with tombstones:
an add creates a unique id, a remove tombstones the ids it observed, merge is
union), and check the CRDT laws on the real journal events: any permutation
and duplication of the same updates gives the same value, and merging
replicas is commutative, associative and idempotent.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loro import ExportMode, VersionVector

from hivemesh.core.event import Event
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.views.context import KIND_UPDATE, ContextView
from hivemesh.errors import InvalidArgument

SEEDS = [bytes([i]) * 32 for i in range(1, 5)]


@dataclass
class Model:
    """The sets from their definitions (state-based, merge = union)."""

    adds: set[tuple[str, str]] = field(default_factory=set)  # (unique id, element)
    gone: set[str] = field(default_factory=set)  # ids observed by a remove or a re-add
    grow: set[str] = field(default_factory=set)

    def observed(self, element: str) -> set[str]:
        return {i for i, e in self.adds if e == element and i not in self.gone}

    def add(self, uid: str, element: str) -> None:
        self.gone |= self.observed(element)
        self.adds.add((uid, element))

    def remove(self, element: str) -> None:
        self.gone |= self.observed(element)

    def merge(self, other: Model) -> None:
        self.adds |= other.adds
        self.gone |= other.gone
        self.grow |= other.grow

    def members(self) -> list[str]:
        return sorted({e for i, e in self.adds if i not in self.gone})


class Replica:
    """One author: its context view, its feed, and everything it has seen."""

    def __init__(self, seed: bytes) -> None:
        self.id = Identity.from_seed(seed)
        self.feed = FeedWriter(self.id, Head(), HLC())
        self.view = ContextView(self.id.public)
        self.head: dict[bytes, int] = {}
        self.seen: list[Event] = []  # every event applied here, own and received
        self.own: list[Event] = []
        self.model = Model()
        self.now = 1_000

    def ctx(self) -> Any:
        return self.view.context("room")

    def flush(self) -> None:
        while (u := self.view.pending_update()) is not None:
            self.now += 1
            ev = self.feed.append(u[0], u[1], self.now)
            self.own.append(ev)
            self.receive(ev)

    def receive(self, ev: Event) -> None:
        """Apply ``ev`` once, in per-author order (what the journal guarantees)."""
        if ev.seq != self.head.get(ev.author, 0) + 1:
            return
        self.head[ev.author] = ev.seq
        self.view.apply(ev)
        self.seen.append(ev)


def sync(dst: Replica, src: Replica) -> None:
    """``dst`` learns everything ``src`` has seen (a full state merge)."""
    for ev in src.seen:
        dst.receive(ev)
    dst.model.merge(src.model)


elements = st.sampled_from(["ann", "bob", "cy"])
steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 3), elements),
        st.tuples(st.just("remove"), st.integers(0, 3), elements),
        st.tuples(st.just("grow"), st.integers(0, 3), elements),
        st.tuples(st.just("sync"), st.integers(0, 3), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=25,
)


def run(n: int, script: list[tuple[str, int, Any]]) -> list[Replica]:
    reps = [Replica(SEEDS[i]) for i in range(n)]
    uid = itertools.count()
    for op, i, arg in script:
        r = reps[i % n]
        if op == "sync":
            sync(r, reps[arg % n])
        elif op == "add":
            r.ctx().orset("who").add(arg)
            r.model.add(f"u{next(uid)}", arg)
        elif op == "remove":
            r.ctx().orset("who").discard(arg)
            r.model.remove(arg)
        else:
            r.ctx().gset("done").add(arg)
            r.model.grow.add(arg)
        r.flush()
        # Every replica agrees with the model at every step.
        for x in reps:
            assert x.ctx().orset("who").members() == x.model.members()
            assert x.ctx().gset("done").members() == sorted(x.model.grow)
    return reps


def fresh(events: list[Event]) -> ContextView:
    """A read-only replica fed ``events`` in the given order (duplicates and
    out-of-order events are held back or dropped, as the journal would)."""
    view = ContextView()
    head: dict[bytes, int] = {}
    held = {(ev.author, ev.seq): ev for ev in events}
    progress = True
    while progress:
        progress = False
        for (author, seq), ev in sorted(held.items()):
            if seq == head.get(author, 0) + 1:
                view.apply(ev)
                head[author] = seq
                del held[(author, seq)]
                progress = True
    return view


def members(view: ContextView) -> tuple[list[str], list[str]]:
    ctx = view.context("room")
    return ctx.orset("who").members(), ctx.gset("done").members()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 4), script=steps, seed=st.integers(0, 2**32))
def test_sets_match_their_definition_under_any_delivery(
    n: int, script: list[Any], seed: int
) -> None:
    reps = run(n, script)
    everything = [ev for r in reps for ev in r.own]
    rng = random.Random(seed)
    final = Model()
    for r in reps:
        final.merge(r.model)
    expected = (final.members(), sorted(final.grow))

    # Any permutation, with duplicates, gives the model's value.
    shuffled = everything + rng.sample(everything, k=len(everything) // 2)
    rng.shuffle(shuffled)
    view = fresh(shuffled)
    assert members(view) == expected and not view.rejected
    # Every writer that then sees everything agrees too.
    for r in reps:
        for other in reps:
            sync(r, other)
        assert members(r.view) == expected
        assert r.view.digest() == view.digest()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps, seed=st.integers(0, 2**32))
def test_merge_is_commutative_associative_idempotent(script: list[Any], seed: int) -> None:
    reps = run(3, script)
    a, b, c = (r.seen for r in reps)  # three replica states (the events each has seen)

    def merge(*states: list[Event]) -> bytes:
        return fresh([ev for s in states for ev in s]).digest()

    assert merge(a, b) == merge(b, a)
    assert merge(a, merge_events(b, c)) == merge(merge_events(a, b), c)
    assert merge(a, a) == merge(a)
    rng = random.Random(seed)
    perm = a + b + c
    rng.shuffle(perm)
    assert merge(perm) == merge(a, b, c)


def merge_events(x: list[Event], y: list[Event]) -> list[Event]:
    """The state of a replica that merged ``x`` and ``y``: its event set."""
    seen: dict[bytes, Event] = {ev.id: ev for ev in [*x, *y]}
    return list(seen.values())


@pytest.mark.parametrize("remover_saw_add", [True, False])
def test_add_concurrent_with_remove_of_the_same_element_wins(remover_saw_add: bool) -> None:
    a, b, c = (Replica(s) for s in SEEDS[:3])
    a.ctx().orset("who").add("ann")
    a.flush()
    sync(b, a)
    if remover_saw_add:
        sync(c, a)
    # Concurrently: b removes ann (having seen a's add); c adds ann.
    b.ctx().orset("who").remove("ann")
    b.flush()
    c.ctx().orset("who").add("ann")
    c.flush()
    assert "ann" not in b.ctx().orset("who") and "ann" in c.ctx().orset("who")
    for x, y in itertools.permutations((a, b, c), 2):
        sync(x, y)
    for r in (a, b, c):
        assert r.ctx().orset("who").members() == ["ann"]
    # A remove that has seen every add removes the element everywhere.
    b.ctx().orset("who").remove("ann")
    b.flush()
    for r in (a, c):
        sync(r, b)
        assert r.ctx().orset("who").members() == []


def test_readd_by_the_remover_and_concurrent_removes() -> None:
    a, b = Replica(SEEDS[0]), Replica(SEEDS[1])
    a.ctx().orset("who").add("bob")
    a.flush()
    sync(b, a)
    a.ctx().orset("who").discard("bob")  # both remove concurrently
    a.flush()
    b.ctx().orset("who").discard("bob")
    b.flush()
    sync(a, b)
    sync(b, a)
    assert a.ctx().orset("who").members() == b.ctx().orset("who").members() == []
    # Repeated adds keep one entry per concurrent adder, not one per add.
    for _ in range(5):
        a.ctx().orset("who").add("bob")
        a.flush()
    entries = a.view._docs["room"].get_map("orset:who").get_deep_value()
    assert list(entries.values()) == ["bob"]


def test_typed_api_snapshot_and_errors() -> None:
    a = Replica(SEEDS[0])
    ctx = a.ctx()
    done, who = ctx.gset("done"), ctx.orset("who")
    done.add("shop-07")
    done.add("shop-07")
    done.add("shop-01")
    who.add("ann")
    who.add("bob")
    who.remove("ann")
    with pytest.raises(KeyError):
        who.remove("ann")
    who.discard("nobody")
    assert list(done) == ["shop-01", "shop-07"] and len(done) == 2 and "shop-07" in done
    assert list(who) == ["bob"] and "ann" not in who and 3 not in who
    for bad in (3, None, b"x", "x" * 5000):
        with pytest.raises(InvalidArgument):
            done.add(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            who.add(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        ctx.gset("Bad:Name")
    ctx.orset("empty").add("x")
    ctx.orset("empty").remove("x")
    a.flush()
    snap = a.view.snapshot()["room"]
    assert snap == {"gset": {"done": ["shop-01", "shop-07"]}, "orset": {"who": ["bob"]}}
    # A set and a list of the same name are different roots.
    ctx.list("done").append(1)
    assert ctx.gset("done").members() == ["shop-01", "shop-07"]
    replica = fresh(a.own)
    assert members(replica) == (["bob"], ["shop-01", "shop-07"])
    with pytest.raises(InvalidArgument):
        replica.context("room").orset("who").add("x")  # read-only replica


def test_rehydrated_writer_keeps_unique_tags() -> None:
    a = Replica(SEEDS[0])
    a.ctx().orset("who").add("ann")
    a.flush()
    restarted = ContextView(a.id.public)
    for ev in a.own:
        restarted.apply(ev)
    restarted.context("room").orset("who").add("bob")
    u = restarted.pending_update()
    assert u is not None
    ev = a.feed.append(u[0], u[1], 9_000)
    view = fresh([*a.own, ev])
    assert not view.rejected and members(view)[0] == ["ann", "bob"]


def test_foreign_set_operations_are_rejected() -> None:
    a, b = Replica(SEEDS[0]), Replica(SEEDS[1])
    a.ctx().orset("who").add("ann")
    a.ctx().gset("done").add("shop-01")
    a.flush()
    (ev_a,) = a.own
    replica = ContextView()
    before = replica.digest()
    forged = b.feed.append(KIND_UPDATE, ev_a.body, 5_000)  # b republishes a's set ops
    replica.apply(forged)
    assert replica.rejected == {"foreign_ops": 1} and replica.digest() == before
    # b removes ann after seeing a's add, then exports everything it holds.
    b.receive(ev_a)
    b.ctx().orset("who").remove("ann")
    b.view.pending_update()
    mixed = b.view._docs["room"].export(ExportMode.Updates(from_=VersionVector()))
    replica.apply(b.feed.append(KIND_UPDATE, {"c": "room", "u": mixed}, 6_000))
    assert replica.rejected == {"foreign_ops": 2} and replica.digest() == before
    replica.apply(ev_a)
    assert members(replica) == (["ann"], ["shop-01"])


def test_hand_written_entries_are_ignored_alike() -> None:
    a = Replica(SEEDS[0])
    doc = a.view._doc("room")
    doc.get_map("orset:who").insert("t1", 7)  # not a string element
    doc.get_map("orset:who").insert("t2", "ann")
    doc.get_map("gset:done").insert("x", "yes")  # not True
    doc.get_map("gset:done").insert("y", True)
    a.flush()
    replica = fresh(a.own)
    assert not replica.rejected
    assert members(replica) == members(a.view) == (["ann"], ["y"])
    assert replica.digest() == a.view.digest()
