"""Membership and Direct attached to real core nodes, driven as the runtime would."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.codec import pack
from hivemesh.core.direct import Direct, DirectAcked
from hivemesh.core.frames import encode_frame
from hivemesh.core.identity import Identity, address_of
from hivemesh.core.membership import Membership, MembershipConfig, MemberState
from hivemesh.core.node import Node
from hivemesh.core.store import MemoryStore

CFG = MembershipConfig.fast(100)


class Stack:
    """What the runtime builds per process: node + membership + direct."""

    def __init__(self, i: int) -> None:
        ident = Identity.from_seed(bytes([i]) * 32)
        self.node = Node(ident, MemoryStore(), random.Random(i), now_ms=0)
        self.members = Membership(
            ident.address, [f"127.0.0.1:{7000 + i}"], random.Random(f"m{i}"), CFG, 0, self.node.send
        )
        self.members.attach(self.node)
        up = lambda dst: [  # noqa: E731
            m.address for m in self.members.members() if m.state is MemberState.UP
        ]
        self.direct = Direct(self.node, random.Random(f"d{i}"), relays=up)

    def tick(self, now: int) -> None:
        if self.members.next_deadline() <= now:
            self.members.handle_timer(now)
        dl = self.direct.next_deadline()
        if dl is not None and dl <= now:
            self.direct.handle_timer(now)
        for ch in self.members.changes():  # the runtime's reaction to membership
            if ch.state is MemberState.UP:
                self.node.add_peer(ch.address)
            elif ch.state in (MemberState.DOWN, MemberState.LEFT):
                self.node.remove_peer(ch.address)


def run(stacks: list[Stack], start: int, end: int, dead: frozenset[str] = frozenset()) -> None:
    by = {s.node.address: s for s in stacks}
    for now in range(start, end, 5):
        for s in stacks:
            if s.node.address in dead:
                s.node.outbox()
                continue
            s.tick(now)
            for dst, frame in s.node.outbox():
                if dst in by and dst not in dead:
                    by[dst].node.receive(s.node.address, frame, now)


def test_runtime_shaped_wiring() -> None:
    stacks = [Stack(i) for i in range(1, 5)]
    seed = stacks[0]
    for s in stacks[1:]:
        s.members.join(seed.node.address, seed.members.endpoints, 0)
    run(stacks, 0, 3000)
    for s in stacks:
        assert len(s.node.peers) == 3, "membership drove add_peer"
    # Replication still works beside the extension handlers.
    ev = stacks[1].node.append("app.note", {"x": 1}, 3000)
    a, b = stacks[2], stacks[3]
    msg = a.direct.send(b.node.address, {"hello": "world"}, 3000)
    run(stacks, 3000, 4000)
    assert all(s.node.journal.head(ev.author).seq == 1 for s in stacks)
    [res] = a.direct.results()
    assert isinstance(res, DirectAcked) and res.msg_id == msg
    assert [m.data for m in b.direct.drain_inbox()] == [{"hello": "world"}]
    # A crash: detected, and the core node stops replicating with it.
    victim = stacks[3].node.address
    run(stacks, 4000, 4000 + CFG.detection_bound_ms(4), dead=frozenset({victim}))
    for s in stacks[:3]:
        assert s.members.member(victim).state is MemberState.DOWN  # type: ignore[union-attr]
        assert victim not in s.node.peers
    for s in stacks:
        assert sum(s.node.counters.values()) - s.node.counters["events_in"] == 0


ADDRS = [address_of(bytes([i]) * 32) for i in range(1, 4)]
any_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.sampled_from(ADDRS)
    | st.sampled_from(["h:1", "10.0.0.1:7000"]),
    lambda inner: st.lists(inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(
    ftype=st.sampled_from([30, 31, 32, 33, 34, 20, 21]),
    fields=st.lists(any_value, max_size=6),
    raw=st.binary(max_size=64),
)
def test_garbage_never_crashes(ftype: int, fields: list[object], raw: bytes) -> None:
    s = Stack(1)
    peer = ADDRS[1]
    s.node.receive(peer, raw, 0)
    s.node.receive(peer, encode_frame(ftype, *fields), 0)
    s.node.receive(peer, pack([1, ftype, *fields]), 1)
    s.tick(10_000)
    s.members.members()
