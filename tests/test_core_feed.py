"""Feeds and journal ingest: every kind of bad input is typed, counted, never stored."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh import errors
from hivemesh.core.codec import MAX_FRAME_BYTES, pack, unpack
from hivemesh.core.event import GENESIS, Event, decode_event, encode_event
from hivemesh.core.feed import FeedWriter, Head, head_message, verify_batch
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity, address_of, public_key_of
from hivemesh.core.journal import Journal
from hivemesh.core.node import Node
from hivemesh.core.store import MemoryStore

ALICE = Identity.from_seed(b"a" * 32)
MALLORY = Identity.from_seed(b"m" * 32)


def feed(n: int, who: Identity = ALICE, seal_every: int = 0) -> list[tuple[list[Event], bytes]]:
    """n events of ``who`` as sealed batches ``(events, signature)``."""
    w = FeedWriter(who, Head(), HLC())
    batches: list[tuple[list[Event], bytes]] = []
    for i in range(n):
        w.append("app.note", {"i": i}, 1000 + i)
        if seal_every and w.unsealed >= seal_every:
            batches.append(w.seal())
    tail = w.seal()
    if tail:
        batches.append(tail)
    return batches


def one_batch(n: int, who: Identity = ALICE) -> tuple[list[bytes], bytes]:
    batches = feed(n, who)
    events, sig = batches[0]
    return [e.raw for e in events], sig


def test_address_roundtrip_and_checksum() -> None:
    addr = ALICE.address
    assert addr.startswith("hm") and len(addr) == 58
    assert public_key_of(addr) == ALICE.public
    assert address_of(ALICE.public) == addr
    bad = addr[:-1] + ("a" if addr[-1] != "a" else "b")
    with pytest.raises(errors.InvalidAddress):
        public_key_of(bad)
    with pytest.raises(errors.InvalidAddress):
        public_key_of("nope")


def test_hlc_rules() -> None:
    c = HLC()
    a = c.tick(100)
    b = c.tick(100)
    assert b == a + 1
    r = c.observe(b + 1000, 100)
    assert r == b + 1001
    assert c.tick(50) > r  # wall clock went backwards: still monotonic


def test_verify_batch_ok_and_overlap() -> None:
    raws, sig = one_batch(10)
    events = verify_batch(ALICE.public, raws, sig, Head())
    assert [e.seq for e in events] == list(range(1, 11))
    # overlapping: we hold 1..4; the batch 1..10 yields 5..10
    h = Head(4, events[3].id)
    assert [e.seq for e in verify_batch(ALICE.public, raws, sig, h)] == list(range(5, 11))


def _journal(trusted: bool = False) -> Journal:
    return Journal(MemoryStore(), trusted=(ALICE.public.__eq__ if trusted else None))


def test_ingest_rejects_bad_signature() -> None:
    raws, _ = one_batch(3)
    last = decode_event(raws[-1])
    forged_sig = MALLORY.sign(head_message(ALICE.public, last.seq, last.id))
    j = _journal()
    with pytest.raises(errors.BadSignature):
        j.ingest(ALICE.public, raws, forged_sig)
    assert j.total_events == 0


def test_ingest_rejects_broken_chain() -> None:
    raws, _ = one_batch(3)
    evs = [decode_event(r) for r in raws]
    # Re-link event 3 to the wrong predecessor and sign it properly: the chain breaks.
    bad3 = encode_event(ALICE.public, 3, GENESIS, evs[2].hlc, "app.note", {"i": 2})
    sig = ALICE.sign(head_message(ALICE.public, 3, bad3.id))
    with pytest.raises(errors.BrokenChain):
        _journal().ingest(ALICE.public, [raws[0], raws[1], bad3.raw], sig)


def test_ingest_gap_replay_fork_untrusted() -> None:
    batches = feed(6, seal_every=3)
    (b1, s1), (b2, s2) = batches
    j = _journal()
    with pytest.raises(errors.GapError):
        j.ingest(ALICE.public, [e.raw for e in b2], s2)
    j.ingest(ALICE.public, [e.raw for e in b1], s1)
    with pytest.raises(errors.ReplayError):
        j.ingest(ALICE.public, [e.raw for e in b1], s1)
    # Fork: Alice signs a different event 3.
    other = FeedWriter(ALICE, Head(2, b1[1].id), HLC())
    other.append("app.note", {"fork": True}, 5)
    fev, fsig = other.seal()  # type: ignore[misc]
    with pytest.raises(errors.ForkError):
        j.ingest(ALICE.public, [e.raw for e in fev], fsig)
    assert j.head(ALICE.public).seq == 3
    raws, sig = one_batch(2, MALLORY)
    with pytest.raises(errors.UntrustedAuthor):
        _journal(trusted=True).ingest(MALLORY.public, raws, sig)


def test_oversize_and_malformed_frames_are_counted() -> None:
    node = Node(ALICE, MemoryStore(), random.Random(1), now_ms=0)
    node.receive("hmx", b"\x00" * (MAX_FRAME_BYTES + 1), 0)
    node.receive("hmx", b"\xff\xff", 0)
    node.receive("hmx", pack([2, 1]), 0)
    node.receive("hmx", encode_frame(FrameType.EVENTS, b"a" * 32, [b"\x01"], b"s" * 64, 0), 0)
    assert node.counters["oversize"] == 1
    assert node.counters["malformed"] == 2
    assert node.counters["bad_version"] == 1
    assert node.journal.total_events == 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_garbage_never_crashes_decoders(data: bytes) -> None:
    for fn in (unpack, decode_event):
        with contextlib.suppress(errors.RemoteProtocolError):
            fn(data)
    node = Node(ALICE, MemoryStore(), random.Random(1), now_ms=0)
    node.receive("hmx", data, 0)
    assert node.journal.total_events == 0


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary(),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=20,
    )
)
def test_event_codec_roundtrip(body: object) -> None:
    ev = encode_event(ALICE.public, 1, GENESIS, 7, "k", body)
    back = decode_event(ev.raw)
    assert back.body == body and back.id == ev.id


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 4))
def test_any_delivery_order_gives_the_same_journal(rnd: random.Random, authors: int) -> None:
    """Batches from several authors delivered in any order, duplicated and
    split across two sessions, end in the same journal (gaps are refused,
    then retried, as anti-entropy would)."""
    ids = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(authors)]
    batches = []
    for who in ids:
        got = feed(rnd.randrange(1, 9), who, seal_every=rnd.randrange(1, 4))
        batches.extend((who.public, [e.raw for e in evs], sig) for evs, sig in got)
    expected = {who.public for who in ids}
    deliveries = batches + rnd.sample(batches, k=min(3, len(batches)))
    rnd.shuffle(deliveries)
    j = _journal()
    pending = list(deliveries)
    for _ in range(len(pending) ** 2 + 1):
        if not pending:
            break
        item = pending.pop(0)
        try:
            j.ingest(*item)
        except errors.GapError:
            pending.append(item)
        except errors.ReplayError:
            pass
    assert set(j.heads) == expected
    ref = _journal()
    for item in batches:
        ref.ingest(*item)
    assert j.version_vector() == ref.version_vector()
    assert {a: h.hash for a, h in j.heads.items()} == {a: h.hash for a, h in ref.heads.items()}
