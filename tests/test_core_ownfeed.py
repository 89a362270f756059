"""A node never forks its own feed: the mark and the write gate, on core
nodes pushed through a list-as-network (h11 style). The real daemons are in
``test_e2e_ownfeed.py``; the simulator's scenarios in ``test_sim.py``."""

from __future__ import annotations

import random
from collections.abc import Callable
from copy import deepcopy

import pytest

from hivemesh.core.event import Event, decode_event
from hivemesh.core.frames import FrameType, decode_frame, encode_frame
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.ownfeed import FeedState, Mark, MemoryMarkStore
from hivemesh.core.store import MemoryStore
from hivemesh.errors import FeedDiverged, FeedRecovering, StoreError

A, B = 1, 2


class Disk:
    """What survives a node's crash: its store and its mark."""

    def __init__(self, i: int) -> None:
        self.identity = Identity.from_seed(bytes([i]) * 32)
        self.store = MemoryStore()
        self.marks = MemoryMarkStore(Mark())  # a fresh key starts at mark 0
        self.boots = 0

    def boot(self, trusted: Callable[[bytes], bool] | None = None) -> Node:
        self.boots += 1
        return Node(
            self.identity,
            self.store,
            random.Random(self.boots),
            now_ms=0,
            config=NodeConfig(),
            trusted=trusted,
            marks=self.marks,
        )


def pump(nodes: list[Node], now: int = 1000) -> None:
    by_addr = {n.address: n for n in nodes}
    for _ in range(1000):
        moved = False
        for n in nodes:
            for peer, frame in n.outbox():
                if peer in by_addr:
                    by_addr[peer].receive(n.address, frame, now)
                    moved = True
        if not moved:
            return
    raise AssertionError("network did not go quiet")


def link(*nodes: Node) -> None:
    for a in nodes:
        for b in nodes:
            a.add_peer(b.address)


def write(n: Node, count: int, tag: str = "w") -> list[Event]:
    return [n.append("app.note", {tag: i}, 1000 + i) for i in range(count)]


def sync(a: Node, b: Node) -> None:
    a.sync_with(b.address)
    b.sync_with(a.address)
    pump([a, b])


def test_a_node_whose_store_was_deleted_recovers_its_feed_before_it_writes() -> None:
    da, db = Disk(A), Disk(B)
    a, b = da.boot(), db.boot()
    link(a, b)
    write(a, 50)
    pump([a, b])
    assert b.journal.head(a.identity.public).seq == 50
    da.store = MemoryStore()  # deleted; the mark beside the key survives
    a = da.boot()
    assert a.feed_gate.state is FeedState.RECOVERING
    with pytest.raises(FeedRecovering, match=r"store holds #0, but #50 was written"):
        a.append("app.note", {"x": 1}, 2000)
    link(a, b)
    pump([a, b])  # a asked b at once (add_peer while recovering)
    assert a.feed_gate.state is FeedState.WRITABLE
    assert a.journal.head(a.identity.public).seq == 50
    assert a.append("app.note", {"after": 1}, 2000).seq == 51
    pump([a, b])
    assert b.journal.head(a.identity.public).seq == 51
    assert b.counters["fork"] == 0
    assert a.counters["own_events_recovered"] == 50


def test_a_trust_policy_that_omits_the_node_itself_still_lets_it_recover() -> None:
    """The daemon's invite-mode policy admits peers, never the node itself."""
    da, db = Disk(A), Disk(B)
    a, b = da.boot(), db.boot()
    link(a, b)
    write(a, 3)
    pump([a, b])
    da.store = MemoryStore()
    a = da.boot(trusted=lambda author: author == db.identity.public)
    link(a, b)
    pump([a, b])
    assert a.feed_gate.writable and a.journal.head(a.identity.public).seq == 3


def test_without_the_mark_a_restored_node_forks_and_its_peer_drops_it() -> None:
    """What happens on main (no mark): the node writes #1 again; the peer
    counts a fork and never takes its new events."""
    da, db = Disk(A), Disk(B)
    a, b = da.boot(), db.boot()
    link(a, b)
    write(a, 5)
    pump([a, b])
    da.store, da.marks = MemoryStore(), MemoryMarkStore(None)
    a = Node(da.identity, da.store, random.Random(9), now_ms=0)  # no marks: trusts the store
    a.add_peer(b.address)
    a.append("app.note", {"lost": True}, 2000)
    pump([a, b])
    assert b.counters["fork"] == 1
    assert b.journal.head(a.identity.public).seq == 5


def test_a_store_restored_from_an_older_copy_without_peers_refuses_writes_until_told() -> None:
    da = Disk(A)
    a = da.boot()
    write(a, 10)
    backup = deepcopy(da.store)
    write(a, 20)
    da.store = backup  # restored, no peer reachable
    a = da.boot()
    with pytest.raises(FeedRecovering) as exc:
        a.append("app.note", {}, 3000)
    assert "#11..#30" in str(exc.value) and "hivemesh feed accept-loss" in str(exc.value)
    assert exc.value.code == "feed_recovering"
    a.append_later([("member.up", {"a": 1})], 3000)  # kept, not lost
    assert a.deferred == 1
    lost = a.accept_feed_loss(3000)
    assert lost == {"held": 10, "lost_from": 11, "lost_upto": 30}
    assert a.deferred == 0 and a.journal.head(a.identity.public).seq == 11
    assert a.append("app.note", {}, 3000).seq == 12
    status = a.feed_gate.status()
    assert status["state"] == "writable" and status["accepted_loss"] == {"from": 11, "upto": 30}
    assert da.marks.mark is not None and da.marks.mark.seq == 12


def test_a_peer_with_the_lost_events_after_an_accepted_loss_is_expected_not_a_fault() -> None:
    da, db = Disk(A), Disk(B)
    a, b = da.boot(), db.boot()
    link(a, b)
    write(a, 10)
    pump([a, b])
    da.store = MemoryStore()  # lost while b, holding #1..#10, is away
    a = da.boot()
    a.accept_feed_loss(2000)  # the operator gives #1..#10 up
    write(a, 3, "new")
    link(a, b)
    for _ in range(3):
        sync(a, b)
    assert a.feed_gate.writable
    assert a.counters["own_feed_conflict_accepted"] == 1
    assert a.counters["own_feed_conflict"] == 0
    a.append("app.note", {"new": 3}, 3000)  # pushed to b ...
    pump([a, b])
    assert b.counters["fork"] == 1  # ... the documented cost: b refuses the new history
    assert a.feed_gate.writable


def restored_whole() -> tuple[Disk, Node]:
    """a wrote #1..#10 (b holds them all); a's whole data dir -- store and
    mark -- is then restored from a copy taken at #5. Returns a's disk and b."""
    da, db = Disk(A), Disk(B)
    a, b = da.boot(), db.boot()
    link(a, b)
    write(a, 5)
    pump([a, b])
    store_copy, mark_copy = deepcopy(da.store), deepcopy(da.marks)
    write(a, 5)
    pump([a, b])
    da.store, da.marks = store_copy, mark_copy
    return da, b


def test_a_data_dir_restored_whole_recovers_when_a_peer_reports_more() -> None:
    da, b = restored_whole()
    a = da.boot()
    assert a.feed_gate.writable  # nothing says otherwise yet
    link(a, b)
    b.sync_with(a.address)  # b's HAVE: it holds #10 of a's feed
    for _peer, frame in b.outbox():
        a.receive(b.address, frame, 2000)
    assert a.feed_gate.state is FeedState.RECOVERING
    with pytest.raises(FeedRecovering, match=r"reports #10 of it"):
        a.append("app.note", {}, 2000)
    pump([a, b])
    assert a.feed_gate.writable and a.journal.head(a.identity.public).seq == 10
    assert a.append("app.note", {}, 2000).seq == 11


def test_a_fork_found_after_the_fact_stops_writes_until_the_operator_decides() -> None:
    da, b = restored_whole()
    a = da.boot()
    write(a, 2, "forked")  # #6' and #7' before any peer said a word
    link(a, b)
    sync(a, b)
    assert a.feed_gate.state is FeedState.DIVERGED
    assert a.counters["own_feed_conflict"] == 1
    with pytest.raises(FeedDiverged, match="different history"):
        a.append("app.note", {}, 3000)
    sync(a, b)  # asked again: counted once, and the forked #6', #7' are not served
    assert a.counters["own_feed_conflict"] == 1
    a.receive(b.address, encode_frame(FrameType.WANT, [[a.identity.public, 1, 10]]), 3000)
    assert a.outbox() == []
    a.accept_feed_loss(3000)
    assert a.append("app.note", {}, 3000).seq == 8
    sync(a, b)
    assert a.feed_gate.writable


def test_a_store_of_another_lineage_is_caught_at_start() -> None:
    da = Disk(A)
    a = da.boot()
    write(a, 4, "one")
    other = Disk(A)  # the same key, another history (e.g. a forked copy)
    write(other.boot(), 6, "two")
    da.store = other.store
    a = da.boot()
    assert a.feed_gate.state is FeedState.DIVERGED
    with pytest.raises(FeedDiverged, match="store holds a different event at #4"):
        a.append("app.note", {}, 3000)


def test_without_a_mark_a_node_waits_for_a_peer_before_it_writes() -> None:
    da, db = Disk(A), Disk(B)
    a, b = da.boot(), db.boot()
    link(a, b)
    write(a, 3)
    pump([a, b])
    da.store, da.marks = MemoryStore(), MemoryMarkStore(None)  # key alone survived
    a = da.boot()
    with pytest.raises(FeedRecovering, match="own feed unknown"):
        a.append("app.note", {}, 2000)
    link(a, b)
    pump([a, b])
    assert a.feed_gate.writable and a.journal.head(a.identity.public).seq == 3


def test_a_peer_that_never_held_the_feed_is_enough_to_learn_it_was_empty() -> None:
    da, db = Disk(A), Disk(B)
    da.marks = MemoryMarkStore(None)
    a, b = da.boot(), db.boot()
    link(a, b)
    b.sync_with(a.address)
    pump([a, b])
    assert a.feed_gate.writable


class FailingMarks(MemoryMarkStore):
    def __init__(self) -> None:
        super().__init__(Mark())
        self.fail = False

    def save(self, mark: Mark) -> None:
        if self.fail:
            raise StoreError("mark: disk full (test)")
        super().save(mark)


def test_no_own_event_above_the_mark_leaves_the_node() -> None:
    da, db = Disk(A), Disk(B)
    marks = da.marks = FailingMarks()
    a, b = da.boot(), db.boot()
    link(a, b)
    write(a, 2)
    pump([a, b])
    marks.fail = True
    with pytest.raises(StoreError):
        a.append("app.note", {"unsent": 1}, 2000)
    assert a.journal.head(a.identity.public).seq == 3  # stored, not acknowledged
    a.receive(b.address, encode_frame(FrameType.WANT, [[a.identity.public, 1, 10]]), 2000)
    served = [decode_frame(f)[1] for _p, f in a.outbox()]
    assert [decode_event(raw).seq for fields in served for raw in fields[1]] == [1, 2]
    pump([a, b])
    assert b.journal.head(a.identity.public).seq == 2  # #3 is above the mark
    marks.fail = False
    a.append("app.note", {"next": 1}, 2000)
    sync(a, b)
    assert b.journal.head(a.identity.public).seq == 4


def test_a_peer_that_only_claims_keeps_the_node_recovering_visibly() -> None:
    da = Disk(A)
    a = da.boot()
    write(a, 2)
    a.receive("hmliar", encode_frame(FrameType.HAVE, {a.identity.public: 1000}, False), 2000)
    st = a.feed_gate.status()
    assert st["state"] == "recovering" and st["target"] == 1000
    assert "hmliar" in st["reason"]
    a.accept_feed_loss(2000)
    assert a.feed_gate.writable
