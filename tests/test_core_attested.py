"""Attested runs: batches straight from their author are applied at once and
their head signatures verified later, one per run (hivemesh.core.journal)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from hivemesh import errors
from hivemesh.core.codec import MAX_BATCH_EVENTS
from hivemesh.core.event import Event
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.journal import Journal
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.store import MemoryStore

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)
MALLORY = Identity.from_seed(b"m" * 32)


class Seen:
    """A view that records what it was given."""

    kinds = frozenset({"*"})

    def __init__(self) -> None:
        self.events: list[Event] = []

    def apply(self, event: Event) -> None:
        self.events.append(event)


def batches(n: int, per: int = 1, who: Identity = ALICE) -> list[tuple[list[bytes], bytes]]:
    """``n`` events of ``who`` sealed every ``per`` events: ``(raws, sig)`` each."""
    w = FeedWriter(who, Head(), HLC())
    out = []
    for i in range(n):
        w.append("app.note", {"i": i}, 1000 + i)
        if w.unsealed >= per or i == n - 1:
            sealed = w.seal()
            assert sealed is not None
            out.append(([e.raw for e in sealed[0]], sealed[1]))
    return out


def journal() -> tuple[Journal, MemoryStore, Seen]:
    store = MemoryStore()
    j = Journal(store)
    seen = Seen()
    j.add_view(seen)
    return j, store, seen


def test_attested_batches_apply_at_once_and_store_one_verified_run() -> None:
    j, store, seen = journal()
    bs = batches(5)
    for raws, sig in bs:
        j.ingest(ALICE.public, raws, sig, attested=True)
    assert len(seen.events) == 5 and j.head(ALICE.public).seq == 5
    assert j.unsettled == 5
    assert store.heads() == {}  # nothing unverified is stored
    assert j.settle() == []
    assert j.unsettled == 0
    assert store.heads()[ALICE.public][0] == 5
    assert store.signed_seqs(ALICE.public) == [5]  # one signature covers the run
    assert store.signature(ALICE.public, 5) == bs[-1][1]
    got = j.read_chunk(ALICE.public, 1, 5)
    assert got is not None and len(got[0]) == 5


def test_a_bad_run_signature_drops_the_run_and_refuses_the_author() -> None:
    j, store, seen = journal()
    good = batches(3)
    for raws, sig in good[:2]:
        j.ingest(ALICE.public, raws, sig, attested=True)
    assert j.settle() == []
    raws, _sig = good[2]
    forged = MALLORY.sign(b"not alice's head")
    j.ingest(ALICE.public, raws, forged, attested=True)
    assert len(seen.events) == 3  # views saw it (the channel vouched for the sender)
    assert j.settle() == [ALICE.public]
    assert j.head(ALICE.public).seq == 2  # back to the verified head
    assert store.heads()[ALICE.public][0] == 2
    assert j.counters["bad_signature"] == 1
    assert j.counters["attested_events_dropped"] == 1
    assert ALICE.public in j.faulty
    with pytest.raises(errors.BadSignature):
        j.ingest(ALICE.public, raws, good[2][1])  # refused until restart


def test_a_bad_first_run_leaves_no_head() -> None:
    j, store, _ = journal()
    raws, _sig = batches(1)[0]
    j.ingest(ALICE.public, raws, MALLORY.sign(b"x"), attested=True)
    assert j.settle() == [ALICE.public]
    assert ALICE.public not in j.version_vector()
    assert store.heads() == {}


def test_a_verified_batch_settles_the_run_it_extends_first() -> None:
    j, store, _ = journal()
    bs = batches(3)
    j.ingest(ALICE.public, *bs[0], attested=True)
    j.ingest(ALICE.public, *bs[1], attested=True)
    j.ingest(ALICE.public, *bs[2])  # relayed: verified now, after the run is settled
    assert j.unsettled == 0
    assert store.signed_seqs(ALICE.public) == [2, 3]


def test_a_verified_batch_after_a_bad_run_is_refused() -> None:
    j, _store, _ = journal()
    bs = batches(2)
    j.ingest(ALICE.public, bs[0][0], MALLORY.sign(b"x"), attested=True)
    with pytest.raises(errors.BadSignature):
        j.ingest(ALICE.public, *bs[1])
    assert j.head(ALICE.public).seq == 0


def test_replays_inside_an_unsettled_run_are_recognised() -> None:
    j, store, _ = journal()
    bs = batches(3)
    for raws, sig in bs:
        j.ingest(ALICE.public, raws, sig, attested=True)
    with pytest.raises(errors.ReplayError):
        j.ingest(ALICE.public, *bs[1], attested=True)
    assert j.unsettled == 3 and store.heads() == {}


def test_a_run_never_outgrows_one_served_chunk() -> None:
    j, store, _ = journal()
    bs = batches(MAX_BATCH_EVENTS + 10, per=10)
    for raws, sig in bs:
        j.ingest(ALICE.public, raws, sig, attested=True)
    j.settle()
    signed = store.signed_seqs(ALICE.public)
    gaps = [b - a for a, b in zip([0, *signed], signed, strict=False)]
    assert max(gaps) <= MAX_BATCH_EVENTS
    start = 1
    while start <= MAX_BATCH_EVENTS + 10:  # every range is servable
        chunk = j.read_chunk(ALICE.public, start, MAX_BATCH_EVENTS + 10)
        assert chunk is not None
        start += len(chunk[0])


def test_reading_a_feed_settles_it_first() -> None:
    j, store, _ = journal()
    for raws, sig in batches(2):
        j.ingest(ALICE.public, raws, sig, attested=True)
    assert j.read_chunk(ALICE.public, 1, 2) is not None
    assert j.unsettled == 0 and store.heads()[ALICE.public][0] == 2


# -- the node --------------------------------------------------------------------


def node(who: Identity, **cfg: Any) -> Node:
    n = Node(
        who,
        MemoryStore(),
        random.Random(1),
        now_ms=0,
        config=NodeConfig(defer_direct_verify=True, **cfg),
    )
    return n


def events_frame(raws: list[bytes], sig: bytes, author: Identity = ALICE) -> bytes:
    return encode_frame(FrameType.EVENTS, author.public, raws, sig, 0)


def test_node_attests_only_batches_from_their_author() -> None:
    b = node(BOB)
    b.add_peer(ALICE.address)
    b.add_peer(MALLORY.address)
    bs = batches(2)
    b.receive(ALICE.address, events_frame(*bs[0]), 10)
    assert b.journal.unsettled == 1  # straight from alice: checked later
    raws, _ = bs[1]
    b.receive(MALLORY.address, events_frame(raws, MALLORY.sign(b"x")), 11)
    assert b.counters["bad_signature"] == 1  # relayed: checked now, refused
    assert b.journal.head(ALICE.public).seq == 1
    assert b.settle() == []


def test_node_without_the_option_verifies_everything_now() -> None:
    b = Node(BOB, MemoryStore(), random.Random(1), now_ms=0)
    b.add_peer(ALICE.address)
    raws, _ = batches(1)[0]
    b.receive(ALICE.address, events_frame(raws, MALLORY.sign(b"x")), 10)
    assert b.counters["bad_signature"] == 1
    assert b.journal.head(ALICE.public).seq == 0


def test_node_settles_on_its_timer_and_reports_faulty_authors() -> None:
    b = node(BOB, settle_delay_ms=20)
    b.add_peer(ALICE.address)
    raws, _ = batches(1)[0]
    b.receive(ALICE.address, events_frame(raws, MALLORY.sign(b"x")), 100)
    assert b.next_deadline() <= 120
    b.handle_timer(119)
    assert b.journal.unsettled == 1
    b.handle_timer(120)
    assert b.journal.unsettled == 0
    assert b.counters["bad_signature"] == 1
    b.receive(ALICE.address, events_frame(*batches(1)[0]), 130)
    assert b.journal.head(ALICE.public).seq == 0  # refused from now on


def test_settle_returns_the_addresses_of_faulty_authors() -> None:
    b = node(BOB, settle_delay_ms=None)
    b.add_peer(ALICE.address)
    raws, _ = batches(1)[0]
    b.receive(ALICE.address, events_frame(raws, MALLORY.sign(b"x")), 100)
    assert b.next_deadline() >= 500  # no settle timer: the caller settles
    assert b.settle() == [ALICE.address]


def test_a_store_failure_while_settling_keeps_the_run_for_the_next_try() -> None:
    class Flaky(MemoryStore):
        fail = True

        def append(self, author: bytes, events: Any, sig: bytes, *, durable: bool = True) -> None:
            if self.fail:
                raise errors.StoreError("disk full")
            super().append(author, events, sig, durable=durable)

    store = Flaky()
    j = Journal(store)
    for raws, sig in batches(2):
        j.ingest(ALICE.public, raws, sig, attested=True)
    with pytest.raises(errors.StoreError):
        j.settle()
    assert j.unsettled == 2 and j.head(ALICE.public).seq == 2
    store.fail = False
    assert j.settle() == []
    assert store.heads()[ALICE.public][0] == 2


def test_malformed_events_after_a_run_are_a_typed_error() -> None:
    j, _store, _ = journal()
    raws, sig = batches(1)[0]
    j.ingest(ALICE.public, raws, sig, attested=True)
    with pytest.raises(errors.DecodeError):
        j.ingest(ALICE.public, [1, 2], sig, attested=True)  # type: ignore[list-item]
    with pytest.raises(errors.DecodeError):
        j.ingest(ALICE.public, [b"x", 3], sig)  # type: ignore[list-item]
    assert j.unsettled == 1
