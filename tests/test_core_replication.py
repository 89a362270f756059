"""Two and three core nodes pushed through a list-as-network (h11 style)."""

from __future__ import annotations

import random

import pytest

from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node, NodeConfig
from hivemesh.core.store import MemoryStore


def make(i: int, now: int = 0, **cfg: int) -> Node:
    ident = Identity.from_seed(bytes([i]) * 32)
    return Node(ident, MemoryStore(), random.Random(i), now_ms=now, config=NodeConfig(**cfg))


def pump(nodes: list[Node], now: int, *, drop: set[str] | None = None) -> int:
    """Deliver outboxes until quiet; returns frames delivered."""
    by_addr = {n.address: n for n in nodes}
    delivered = 0
    for _ in range(10_000):
        moved = False
        for n in nodes:
            for peer, frame in n.outbox():
                if peer in by_addr and not (drop and (peer in drop or n.address in drop)):
                    by_addr[peer].receive(n.address, frame, now)
                    delivered += 1
                    moved = True
        if not moved:
            return delivered
    raise AssertionError("network did not go quiet")


def link(nodes: list[Node]) -> None:
    for a in nodes:
        for b in nodes:
            a.add_peer(b.address)


def test_push_reaches_all_peers() -> None:
    nodes = [make(i) for i in range(1, 4)]
    link(nodes)
    ev = nodes[0].append("app.note", {"text": "hi"}, 10)
    pump(nodes, 11)
    for n in nodes:
        assert n.journal.head(ev.author).seq == 1


def test_late_joiner_catches_up_by_anti_entropy() -> None:
    a, b = make(1), make(2)
    link([a, b])
    for i in range(700):
        a.append("app.note", {"i": i}, 10 + i)
    a.outbox()  # lost: b was not there yet
    c = make(3)
    link([a, b, c])
    c.sync_with(a.address)
    pump([a, b, c], 1000)
    assert c.journal.version_vector() == a.journal.version_vector()
    assert c.journal.total_events == 700


def test_partition_heals() -> None:
    nodes = [make(i) for i in range(1, 5)]
    link(nodes)
    left, right = nodes[:2], nodes[2:]
    for i in range(50):
        left[i % 2].append("app.l", i, i)
        right[i % 2].append("app.r", i, i)
    pump(nodes, 100, drop={n.address for n in right})  # cut
    for n in nodes:
        n.outbox()
    # heal: everyone syncs with everyone else once
    for a in nodes:
        for b in nodes:
            if a is not b:
                a.sync_with(b.address)
    pump(nodes, 200)
    vvs = [n.journal.version_vector() for n in nodes]
    assert all(v == vvs[0] for v in vvs)
    assert sum(vvs[0].values()) == 100


def test_gap_triggers_pull() -> None:
    a, b = make(1), make(2)
    link([a, b])
    a.append("x", 1, 1)
    a.outbox()  # lost
    a.append("x", 2, 2)
    pump([a, b], 3)
    assert b.journal.head(a.identity.public).seq == 2
    assert b.counters["gap"] == 1


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",
        b"\x93\x01\x01",
        encode_frame(FrameType.EVENTS, b"x" * 32, [b"junk"], b"s" * 64, 0),
        encode_frame(FrameType.EVENTS, b"x", [], b"", 0),
        encode_frame(FrameType.HAVE, {"a": 1}, True),
        encode_frame(FrameType.WANT, [[b"a" * 32, 0, 5]]),
        encode_frame(99),
    ],
)
def test_garbage_is_counted_not_raised(frame: bytes) -> None:
    a = make(1)
    a.receive("hmpeer", frame, 0)
    assert sum(a.counters.values()) >= 1


def test_feed_growing_by_push_is_not_pulled_again() -> None:
    """A HAVE that runs ahead of a feed we are receiving by push asks for
    nothing within push_grace_ms (the rest is queued behind the push);
    after the grace it is pulled as usual."""
    a, b = make(1), make(2)
    link([a, b])
    a.append("app.note", {"i": 0}, 10)
    pump([a, b], 11)  # b took #1 by push
    a.append("app.note", {"i": 1}, 12)
    queued = a.outbox()  # #2 is "in flight"
    assert len(queued) == 1
    b.receive(a.address, encode_frame(FrameType.HAVE, a.journal.version_vector(), False), 20)
    assert b.outbox() == []  # no WANT for what the push is delivering
    assert b.counters["pull_skipped_pushing"] == 1
    grace = b.config.push_grace_ms
    b.receive(
        a.address, encode_frame(FrameType.HAVE, a.journal.version_vector(), False), 12 + grace
    )
    ((peer, want),) = b.outbox()
    assert peer == a.address
    a.receive(b.address, want, 12 + grace)
    pump([a, b], 12 + grace)
    assert b.journal.head(a.identity.public).seq == 2


def test_a_log_backlog_holds_pulls_until_the_grace_after_it() -> None:
    """While a broker's log hands us a backlog (log_backlog), a HAVE that
    runs ahead of us asks for nothing (the log brings it); push_grace_ms
    after the last backlog entry, anti-entropy pulls as usual."""
    a, b = make(1, push=False), make(2, push=False)  # broker mode: the log pushes
    link([a, b])
    for i in range(3):
        a.append("app.note", {"i": i}, 10 + i)
    a.outbox()
    b.log_backlog(20)
    have = encode_frame(FrameType.HAVE, a.journal.version_vector(), False)
    b.receive(a.address, have, 25)
    assert b.outbox() == []
    assert b.counters["pull_skipped_log_backlog"] == 1
    grace = b.config.push_grace_ms
    b.receive(a.address, have, 20 + grace - 1)
    assert b.outbox() == []
    b.receive(a.address, have, 20 + grace)
    ((peer, want),) = b.outbox()
    assert peer == a.address
    a.receive(b.address, want, 20 + grace)
    pump([a, b], 20 + grace)
    assert b.journal.head(a.identity.public).seq == 3


def test_a_shares_policy_keeps_a_feed_from_a_peer_in_every_path() -> None:
    """b is a member of two swarms: a's and c's. c must never see a's feed
    through b: not pushed, not advertised in HAVE, not served on WANT."""
    a, b, c = make(1), make(2), make(3)
    a_pub = a.identity.public
    b.shares = lambda peer, author: not (peer == c.address and author == a_pub)
    link([a, b])
    link([b, c])
    a.append("app.note", {"secret": 1}, 10)
    pump([a, b, c], 11)
    assert b.journal.head(a_pub).seq == 1
    b.append("app.note", {"public": 1}, 12)  # b's own feed still reaches c
    b.sync_with(c.address)
    c.sync_with(b.address)
    pump([a, b, c], 13)
    assert c.journal.head(b.identity.public).seq == 1
    assert c.journal.head(a_pub).seq == 0
    # a peer that asks anyway gets nothing, and it is counted
    c.send(b.address, encode_frame(FrameType.WANT, [[a_pub, 1, 1]]))
    pump([a, b, c], 14)
    assert c.journal.head(a_pub).seq == 0 and b.counters["want_not_shared"] == 1
    # nor forwarded, in a large swarm's epidemic push (a's batch carries hops)
    a.config = b.config = NodeConfig(push_all_below=1)
    a.append("app.note", {"secret": 2}, 15)
    pump([a, b, c], 16)
    assert b.journal.head(a_pub).seq == 2 and c.journal.head(a_pub).seq == 0
    assert c.counters["gap"] == 0  # not even offered (a gap would ask b, in vain)
