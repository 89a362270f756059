"""First-writer-wins cannot be won by backdating: witnesses (core.witness)
and the names view's order, from the index up to core nodes on a list network."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.frames import FrameType, encode_frame
from hivemesh.core.hlc import HLC, MAX_DRIFT_MS, make_hlc
from hivemesh.core.identity import Identity
from hivemesh.core.node import Node
from hivemesh.core.store import MemoryStore
from hivemesh.core.views.names import NamesView

IDS = [Identity.from_seed(bytes([40 + i]) * 32) for i in range(4)]
T0 = 1_800_000_000_000
LATER = T0 + MAX_DRIFT_MS + 5_000  # the attack comes after the name was held for > the bound


def _witness_event(who: Identity, hlc: int, cover: list[list[Any]]) -> Any:
    w = FeedWriter(who, Head(), HLC(hlc - 1))
    return w.append("witness", {"c": cover}, 0)


# (witness author, covered author, covered seq, hlc)
points = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(1, 9), st.integers(1, 60)),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(points=points, seed=st.integers(0, 2**32))
def test_first_seen_is_the_minimum_over_covering_witnesses_in_any_order(
    points: list[tuple[int, int, int, int]], seed: int
) -> None:
    from hivemesh.core.witness import WitnessIndex

    events = [_witness_event(IDS[w], h, [[IDS[a].public, s]]) for w, a, s, h in points]
    random.Random(seed).shuffle(events)
    index = WitnessIndex()
    for ev in events:
        index.apply(ev)
    for a in range(4):
        for s in range(1, 11):
            hs = [h for w, aa, ss, h in points if aa == a and ss >= s and w != a]
            assert index.first_seen(IDS[a].public, s) == (min(hs) if hs else None)


def test_malformed_witnesses_are_counted_not_applied() -> None:
    from hivemesh.core.witness import WitnessIndex

    index = WitnessIndex()
    bad = ({"c": []}, {"c": [[b"x", 1]]}, {"c": [[IDS[1].public, 0]]}, [1], {"c": 1, "d": 2})
    for body in bad:
        index.apply(FeedWriter(IDS[0], Head(), HLC()).append("witness", body, 1))
    assert index.rejected == {"malformed": 5}
    assert index.snapshot() == {}


# -- core nodes on a list network ---------------------------------------------


def _node(who: Identity, names: NamesView) -> Node:
    n = Node(who, MemoryStore(), random.Random(who.public), now_ms=T0)
    n.add_view(names)
    return n


def _link(nodes: list[Node]) -> None:
    for a in nodes:
        for b in nodes:
            a.add_peer(b.address)


def _pump(nodes: list[Node], now: int) -> None:
    by_addr = {n.address: n for n in nodes}
    for _ in range(1_000):
        frames = [(n.address, p, f) for n in nodes for p, f in n.outbox()]
        if not frames:
            return
        for src, dst, f in frames:
            if dst in by_addr:
                by_addr[dst].receive(src, f, now)
    raise AssertionError("network did not go quiet")


def _backdated_claim(liar: Node, name: str, hlc: int) -> bytes:
    """The liar appends its own claim stamped ``hlc``: an EVENTS frame of it."""
    honest_clock = liar.writer.clock
    liar.writer.clock = HLC(hlc - 1)
    try:
        ev = liar.append(*NamesView.claim(name), 0)
    finally:
        liar.writer.clock = honest_clock
    frames = [f for _p, f in liar.outbox()]
    assert ev.hlc == hlc and frames
    return frames[0]


def test_a_backdated_claim_does_not_take_a_held_name_and_is_reported() -> None:
    views = [NamesView() for _ in range(3)]
    a, b, liar = (_node(who, v) for who, v in zip(IDS, views, strict=False))
    _link([a, b, liar])
    a.append(*NamesView.claim("planner"), T0)
    _pump([a, b, liar], T0 + 5)
    assert {v.resolve("planner") for v in views} == {a.address}

    frame = _backdated_claim(liar, "planner", 1)
    b.receive(liar.address, frame, LATER)  # b alone has it: it witnessed it in that step
    assert views[1].resolve("planner") == a.address
    a.receive(liar.address, frame, LATER)
    _pump([a, b, liar], LATER)
    for v in views:
        assert v.resolve("planner") == a.address
        (t,) = v.takeovers()
        assert (t["name"], t["claimant"], t["owner"]) == ("planner", liar.address, a.address)
        assert t["claimed_hlc"] == 1
        assert t["ordered_hlc"] >= make_hlc(LATER - MAX_DRIFT_MS)
    assert len({v.digest() for v in views}) == 1
    assert (a.counters["witnessed"], b.counters["witnessed"]) == (1, 2)  # a: the liar; b: both


def test_a_backdated_claim_on_a_free_name_or_in_a_one_node_swarm_still_works() -> None:
    views = [NamesView() for _ in range(2)]
    a, liar = (_node(who, v) for who, v in zip(IDS, views, strict=False))
    solo = NamesView()
    alone = _node(IDS[2], solo)
    alone.append(*NamesView.claim("metrics-collector"), T0)  # nobody to witness it
    assert solo.resolve("metrics-collector") == alone.address
    _link([a, liar])
    frame = _backdated_claim(liar, "free", 1)
    a.receive(liar.address, frame, LATER)
    assert views[0].resolve("free") == liar.address  # nobody else claimed it
    assert views[0].takeovers() == []


def test_honest_claims_keep_their_own_time_and_late_witnesses_do_not_reorder() -> None:
    """Two honest claims a few ms apart: the earlier wins everywhere, even on a
    node that joins much later and witnesses both then."""
    views = [NamesView() for _ in range(4)]
    a, b, c, late = (_node(who, v) for who, v in zip(IDS, views, strict=True))
    _link([a, b, c])
    b.append(*NamesView.claim("db-1"), T0 + 3)  # written first, stamped later
    a.append(*NamesView.claim("db-1"), T0)
    _pump([a, b, c], T0 + 10)
    assert {v.resolve("db-1") for v in views[:3]} == {a.address}
    _link([a, b, c, late])
    late.sync_with(a.address)
    _pump([a, b, c, late], T0 + 10 * MAX_DRIFT_MS)
    assert {v.resolve("db-1") for v in views} == {a.address}
    assert all(v.takeovers() == [] for v in views)
    assert len({v.digest() for v in views}) == 1


def test_an_attested_claim_is_verified_before_it_is_applied() -> None:
    """A batch straight from its author is normally applied before its
    signature is checked; a claim must not be (it would be witnessed)."""
    from hivemesh.core.node import NodeConfig

    names = NamesView()
    cfg = NodeConfig(defer_direct_verify=True)
    n = Node(IDS[0], MemoryStore(), random.Random(1), now_ms=T0, config=cfg)
    n.add_view(names)
    n.add_peer(IDS[1].address)
    w = FeedWriter(IDS[1], Head(), HLC())
    ev = w.append(*NamesView.claim("planner"), T0)
    frame = encode_frame(FrameType.EVENTS, IDS[1].public, [ev.raw], b"\x02" * 64, 0)
    n.receive(IDS[1].address, frame, T0)
    assert names.resolve("planner") is None
    assert n.counters["bad_signature"] == 1
    assert n.outbox() == []  # and nothing witnessed


def test_a_backdated_claim_intent_does_not_overturn_a_decided_claim() -> None:
    from hivemesh.core.claims import ClaimsView

    views = [ClaimsView() for _ in range(3)]  # window: the 500 ms settle window
    a, b, liar = (_node(who, NamesView()) for who in IDS[:3])
    for n, v in zip((a, b, liar), views, strict=True):
        n.add_view(v)
    _link([a, b, liar])
    a.append("claim.intent", {"r": "task-7"}, T0)
    _pump([a, b, liar], T0 + 5)
    assert views[0].decided("task-7", T0 + 600, 500) == a.identity.public
    honest_clock = liar.writer.clock
    liar.writer.clock = HLC(0)  # stamped hlc=1, written ten seconds later
    liar.append("claim.intent", {"r": "task-7"}, 0)
    liar.writer.clock = honest_clock
    _pump([a, b, liar], T0 + 10_000)
    for v in views:
        assert v.decided("task-7", T0 + 10_000, 500) == a.identity.public
        ((resource, claim, winner),) = v.takeovers()
        assert (resource, claim.author, winner.author) == (
            "task-7",
            liar.identity.public,
            a.identity.public,
        )


def test_a_backdated_lease_voter_set_is_not_adopted_by_late_joiners() -> None:
    from hivemesh.runtime.leases import KIND_VOTERS, VotersView

    honest, liar = FeedWriter(IDS[0], Head(), HLC()), FeedWriter(IDS[2], Head(), HLC(0))
    view = VotersView()
    mine = honest.append(KIND_VOTERS, {"v": [IDS[0].address, IDS[1].address]}, T0)
    view.apply(_witness_event(IDS[1], make_hlc(T0 + 3), [[mine.author, mine.seq]]))
    theirs = liar.append(KIND_VOTERS, {"v": [IDS[2].address]}, 0)  # hlc 1
    late = make_hlc(T0 + MAX_DRIFT_MS + 5_000)
    for ev in (theirs, mine, _witness_event(IDS[1], late, [[theirs.author, theirs.seq]])):
        view.apply(ev)
    assert view.earliest == sorted([IDS[0].address, IDS[1].address])


def test_a_witness_our_store_cannot_take_is_counted_not_raised() -> None:
    from hivemesh.errors import StoreError

    class Full(MemoryStore):
        def append(self, author: bytes, events: Any, sig: bytes, **kw: Any) -> None:
            if author == IDS[0].public:
                raise StoreError("disk full")
            super().append(author, events, sig, **kw)

    n = Node(IDS[0], Full(), random.Random(1), now_ms=T0)
    names = NamesView()
    n.add_view(names)
    w = FeedWriter(IDS[1], Head(), HLC())
    ev = w.append(*NamesView.claim("planner"), T0)
    sealed = w.seal()
    assert sealed is not None
    n.receive(IDS[1].address, encode_frame(FrameType.EVENTS, ev.author, [ev.raw], sealed[1], 0), T0)
    assert n.counters["witness_failed"] == 1
    assert names.resolve("planner") == IDS[1].address
