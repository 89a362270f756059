"""The clock bound: a trusted peer's far-future timestamps are deferred, never
applied early, and never move anyone's clock past the bound (core.deferral)."""

from __future__ import annotations

import random

import pytest

from hivemesh.core.event import Event, decode_event
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.hlc import HLC, MAX_DRIFT_MS, hlc_ms, make_hlc
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.store import MemoryStore
from hivemesh.sim.views import EventSetDigest

HONEST = Identity.from_seed(b"h" * 32)
RELAY = Identity.from_seed(b"r" * 32)
MALLORY = Identity.from_seed(b"m" * 32)
NOW = 1_800_000_000_000
MAX_HLC = (1 << 63) - 1


class Feed:
    """Mallory's feed, each event stamped with any HLC she likes."""

    def __init__(self, who: Identity = MALLORY) -> None:
        self.writer = FeedWriter(who, Head(), HLC())

    def batch(self, *hlcs: int) -> tuple[list[bytes], bytes]:
        """Events stamped ``hlcs`` under one signature: ``(raws, sig)``."""
        for i, h in enumerate(hlcs):
            self.writer.clock.last = h - 1
            self.writer.append("app.note", {"i": i}, 0)
        sealed = self.writer.seal()
        assert sealed is not None
        return [e.raw for e in sealed[0]], sealed[1]


def frame(batch: tuple[list[bytes], bytes], who: Identity = MALLORY) -> bytes:
    return encode_frame(FrameType.EVENTS, who.public, batch[0], batch[1], 0)


def node(who: Identity = HONEST, now: int = NOW, **cfg: int) -> tuple[Node, EventSetDigest]:
    """A node, and a view that counts the events applied to it."""
    n = Node(who, MemoryStore(), random.Random(1), now_ms=now, config=NodeConfig(**cfg))
    seen = EventSetDigest()
    n.add_view(seen)
    return n, seen


def at(ms: int) -> int:
    return make_hlc(ms)


def test_a_batch_beyond_the_bound_waits_and_is_applied_at_its_release_time() -> None:
    n, seen = node()
    feed = Feed()
    ahead_ms = NOW + MAX_DRIFT_MS + 5_000
    n.receive(MALLORY.address, frame(feed.batch(at(NOW))), NOW)
    n.receive(MALLORY.address, frame(feed.batch(at(NOW + 1), at(ahead_ms))), NOW)
    n.receive(MALLORY.address, frame(feed.batch(at(NOW + 2))), NOW)  # waits behind it
    assert n.journal.head(MALLORY.public).seq == 1
    assert seen.count == 1
    assert n.journal.store.read_range(MALLORY.public, 2, 3) == []
    assert n.counters["clock_ahead"] == 1
    assert hlc_ms(n.clock.last) <= NOW + MAX_DRIFT_MS
    report = n.deferrals.snapshot()[MALLORY.address]
    assert report["waiting_from_seq"] == 3
    assert report["release_ms"] == ahead_ms - MAX_DRIFT_MS
    assert n.next_deadline() <= ahead_ms - MAX_DRIFT_MS

    n.handle_timer(ahead_ms - MAX_DRIFT_MS - 1)  # not yet
    assert n.journal.head(MALLORY.public).seq == 1
    n.handle_timer(ahead_ms - MAX_DRIFT_MS)
    assert n.journal.head(MALLORY.public).seq == 3
    assert seen.count == 3
    assert n.deferrals.held == {}


def test_the_largest_hlc_never_becomes_plausible_and_the_receiver_keeps_writing() -> None:
    n, _seen = node()
    n.add_peer(RELAY.address)
    feed = Feed()
    n.receive(MALLORY.address, frame(feed.batch(at(NOW))), NOW)
    n.receive(MALLORY.address, frame(feed.batch(MAX_HLC)), NOW)
    assert n.journal.head(MALLORY.public).seq == 1
    ev = n.append("app.note", {"still": "writing"}, NOW + 1)
    assert hlc_ms(ev.hlc) == NOW + 1
    n.outbox()
    # a peer that holds more of Mallory's feed is not asked for it
    later = NOW + 5_000  # past the push grace
    n.receive(RELAY.address, encode_frame(FrameType.HAVE, {MALLORY.public: 5}, True), later)
    assert not [f for _p, f in n.outbox() if f[2] == FrameType.WANT]
    assert n.counters["pull_deferred"] == 1


def test_a_relay_is_asked_only_for_what_lies_before_the_deferred_event() -> None:
    """Mallory signed her feed twice: a relay holds #1..#2 signed at #2 while
    we got #1..#3 (#3 far ahead) under one signature. Pulls stop at #2, from a
    peer that can serve it; one that sent the deferred batch is not asked again."""
    n, seen = node()
    n.add_peer(RELAY.address)
    relay, _ = node(RELAY)
    feed = Feed()
    raws, _sig = feed.batch(at(NOW), at(NOW + 1))
    raws12, sig12 = list(raws), _sig
    raws3, sig3 = feed.batch(MAX_HLC)
    relay.receive(MALLORY.address, frame((raws12, sig12)), NOW)
    n.receive(MALLORY.address, frame((raws12 + raws3, sig3)), NOW)
    assert n.journal.head(MALLORY.public).seq == 0
    later = NOW + 5_000  # past the push grace
    n.receive(RELAY.address, encode_frame(FrameType.HAVE, {MALLORY.public: 2}, True), later)
    wants = [f for p, f in n.outbox() if p == RELAY.address and f[2] == FrameType.WANT]
    assert len(wants) == 1
    relay.receive(HONEST.address, wants[0], later)
    for _p, f in relay.outbox():
        n.receive(RELAY.address, f, later)
    assert n.journal.head(MALLORY.public).seq == 2
    assert seen.count == 2

    # Had the relay held only the batch with #3, it would answer past the cap...
    n2, _ = node()
    n2.add_peer(RELAY.address)
    n2.receive(MALLORY.address, frame((raws12 + raws3, sig3)), NOW)
    n2.receive(RELAY.address, encode_frame(FrameType.HAVE, {MALLORY.public: 3}, True), later)
    assert [f for _p, f in n2.outbox() if f[2] == FrameType.WANT]
    n2.receive(RELAY.address, frame((raws12 + raws3, sig3)), later)
    # ...and is then not asked again every anti-entropy round.
    n2.receive(RELAY.address, encode_frame(FrameType.HAVE, {MALLORY.public: 3}, True), later + 1)
    assert not [f for _p, f in n2.outbox() if f[2] == FrameType.WANT]
    assert n2.journal.head(MALLORY.public).seq == 0


def test_a_deferred_batch_whose_author_lost_our_trust_meanwhile_is_refused_at_release() -> None:
    trusted = {MALLORY.public}
    n = Node(HONEST, MemoryStore(), random.Random(1), now_ms=NOW, trusted=trusted.__contains__)
    ahead_ms = NOW + MAX_DRIFT_MS + 1_000
    n.receive(MALLORY.address, frame(Feed().batch(at(ahead_ms))), NOW)
    assert n.counters["clock_ahead"] == 1
    trusted.clear()  # revoked
    n.handle_timer(ahead_ms - MAX_DRIFT_MS)  # counted, not raised
    assert n.counters["untrusted_author"] == 1
    assert n.journal.head(MALLORY.public).seq == 0 and n.deferrals.held == {}


def test_held_bytes_are_bounded_and_a_dropped_batch_is_pulled_after_its_release() -> None:
    n, _seen = node(max_deferred_bytes=10)
    n.add_peer(RELAY.address)
    feed = Feed()
    ahead_ms = NOW + MAX_DRIFT_MS + 1_000
    batch = feed.batch(at(ahead_ms))
    n.receive(MALLORY.address, frame(batch), NOW)
    assert n.deferrals.counters["deferred_dropped"] == 1
    assert n.deferrals.nbytes == 0
    assert n.deferrals.snapshot()[MALLORY.address]["held_events"] == 0
    n.handle_timer(ahead_ms - MAX_DRIFT_MS)
    n.outbox()
    n.receive(RELAY.address, encode_frame(FrameType.HAVE, {MALLORY.public: 1}, True), NOW + 1_000)
    assert [f for _p, f in n.outbox() if f[2] == FrameType.WANT]


def test_a_far_future_batch_with_a_bad_signature_is_refused_not_held() -> None:
    n, _seen = node(defer_direct_verify=True)
    n.add_peer(MALLORY.address)
    raws, _sig = Feed().batch(MAX_HLC)
    n.receive(MALLORY.address, frame((raws, b"\x01" * 64)), NOW)  # attested: sig not yet checked
    assert n.counters["bad_signature"] == 1
    assert n.deferrals.held == {}


def test_ingest_says_when_a_batch_becomes_plausible() -> None:
    from hivemesh.core.hlc import horizon
    from hivemesh.errors import ClockAhead

    n, _seen = node()
    raws, sig = Feed().batch(at(NOW), at(NOW + MAX_DRIFT_MS + 7))
    with pytest.raises(ClockAhead) as info:
        n.journal.ingest(MALLORY.public, raws, sig, horizon=horizon(NOW))
    assert (info.value.seq, info.value.release_ms) == (2, NOW + 7)
    assert n.journal.ingest(MALLORY.public, raws, sig, horizon=horizon(NOW + 7))


def _store_holding(hlcs: list[int], own: list[int] | None = None) -> MemoryStore:
    """A store written by an older version that accepted ``hlcs`` from Mallory
    (and, ``own``, wrote our own events at those stamps)."""
    store = MemoryStore()
    raws, sig = Feed().batch(*hlcs)
    store.append(MALLORY.public, [decode_event(r) for r in raws], sig)
    if own:
        mine, my_sig = Feed(HONEST).batch(*own)
        store.append(HONEST.public, [decode_event(r) for r in mine], my_sig)
    return store


def _replay(store: MemoryStore) -> list[Event]:
    return [decode_event(raw) for _a, raws, _s in store.scan() for raw in raws]


@pytest.mark.parametrize("far", [MAX_HLC, make_hlc(NOW + 3_600_000)])
def test_a_node_that_stores_a_far_future_event_still_starts_and_writes(far: int) -> None:
    store = _store_holding([at(NOW - 5), far])
    n = Node(HONEST, store, random.Random(1), now_ms=NOW)
    assert n.rehydrate(_replay(store)) == 2
    assert hlc_ms(n.clock.last) <= NOW + MAX_DRIFT_MS
    ev = n.append("app.note", {"after": "restart"}, NOW)
    assert ev.seq == 1 and hlc_ms(ev.hlc) <= NOW + MAX_DRIFT_MS


def test_a_node_whose_own_feed_was_stamped_far_ahead_still_writes() -> None:
    """An older version that rehydrated such an event went on stamping its own
    events past it; the clock restored from our own feed is clamped too."""
    store = _store_holding([at(NOW - 5)], own=[MAX_HLC - 1])
    n = Node(HONEST, store, random.Random(1), now_ms=NOW)
    n.rehydrate(_replay(store))
    ev = n.append("app.note", {"after": "restart"}, NOW)
    assert ev.seq == 2 and hlc_ms(ev.hlc) <= NOW + MAX_DRIFT_MS
