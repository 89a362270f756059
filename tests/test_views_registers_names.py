"""Max-register and names views: order-independence, semantics, garbage."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.event import Event
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.views.base import View
from hivemesh.core.views.names import KIND_CLAIM, KIND_RELEASE, NamesView
from hivemesh.core.views.registers import KIND_MAX, MaxRegisterView
from hivemesh.core.witness import KIND_WITNESS
from hivemesh.errors import InvalidArgument

IDS = [Identity.from_seed(bytes([i]) * 32) for i in range(1, 5)]


def feeds_from(script: list[tuple[int, str, Any, int]]) -> list[list[Event]]:
    """script: (author index, kind, body, clock step) -> one feed per author."""
    writers = [FeedWriter(i, Head(), HLC()) for i in IDS]
    now = [1_000] * len(IDS)
    feeds: list[list[Event]] = [[] for _ in IDS]
    for who, kind, body, step in script:
        now[who] += step
        feeds[who].append(writers[who].append(kind, body, now[who]))
    return [f for f in feeds if f]


def interleave(rng: random.Random, feeds: list[list[Event]]) -> list[Event]:
    """A random merge keeping each author's events in seq order."""
    pos = [0] * len(feeds)
    out: list[Event] = []
    while True:
        live = [i for i, f in enumerate(feeds) if pos[i] < len(f)]
        if not live:
            return out
        i = rng.choice(live)
        out.append(feeds[i][pos[i]])
        pos[i] += 1


def check_order_independent(make: Any, feeds: list[list[Event]], seed: int) -> None:
    rng = random.Random(seed)
    reference = make()
    for f in feeds:
        for ev in f:
            reference.apply(ev)
    for _ in range(3):
        order = interleave(rng, feeds)
        cut = rng.randint(0, len(order))
        v = make()
        for ev in order[:cut]:  # split: part now, the rest later
            v.apply(ev)
        v.digest()
        for ev in order[cut:]:
            v.apply(ev)
        assert v.snapshot() == reference.snapshot()
        assert v.digest() == reference.digest()
        assert v.rejected == reference.rejected


reg_script = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.just(KIND_MAX),
        st.fixed_dictionaries(
            {"k": st.sampled_from(["lease/a", "lease/b"]), "v": st.integers(0, 50)}
        ),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(script=reg_script, seed=st.integers(0, 2**32))
def test_max_register_order_independent(script: Any, seed: int) -> None:
    feeds = feeds_from(script)
    check_order_independent(MaxRegisterView, feeds, seed)
    view = MaxRegisterView()
    for f in feeds:
        for ev in f:
            view.apply(ev)
    for key in ("lease/a", "lease/b"):
        vals = [b["v"] for _, _, b, _ in script if b["k"] == key]
        assert view.value(key) == (max(vals) if vals else None)


def test_max_register_never_goes_backwards() -> None:
    # A later (higher HLC, larger key) write of a smaller token must not win.
    lo_key, hi_key = sorted(IDS, key=lambda i: i.public)[:2]
    w_lo, w_hi = FeedWriter(lo_key, Head(), HLC()), FeedWriter(hi_key, Head(), HLC())
    view = MaxRegisterView()
    view.apply(w_lo.append(*MaxRegisterView.encode("t", 7), 1_000))
    view.apply(w_hi.append(*MaxRegisterView.encode("t", 3), 9_000))
    assert view.value("t") == 7 and view.next_value("t") == 8
    assert view.holder("t") == lo_key.address
    assert view.next_value("fresh") == 1 and view.value("fresh") is None
    with pytest.raises(InvalidArgument):
        MaxRegisterView.encode("bad key", 1)
    with pytest.raises(InvalidArgument):
        MaxRegisterView.encode("k", -1)


names = st.sampled_from(["collector", "planner", "db-1"])
# "I held author k's feed up to seq s" (core.witness): it may reorder claims.
witness = st.builds(lambda k, s: {"c": [[IDS[k].public, s]]}, st.integers(0, 3), st.integers(1, 8))
name_script = st.lists(
    st.one_of(
        st.tuples(
            st.integers(0, 3),
            st.sampled_from([KIND_CLAIM, KIND_RELEASE]),
            st.fixed_dictionaries({"n": names}),
            st.integers(0, 2),
        ),
        st.tuples(st.integers(0, 3), st.just(KIND_WITNESS), witness, st.integers(0, 70_000)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(script=name_script, seed=st.integers(0, 2**32))
def test_names_order_independent(script: Any, seed: int) -> None:
    check_order_independent(NamesView, feeds_from(script), seed)


def test_names_first_claim_wins_and_release_hands_over() -> None:
    a, b = IDS[0], IDS[1]
    wa, wb = FeedWriter(a, Head(), HLC()), FeedWriter(b, Head(), HLC())
    view = NamesView()
    assert isinstance(view, View)
    view.apply(wb.append(*NamesView.claim("collector"), 2_000))
    view.apply(wa.append(*NamesView.claim("collector"), 1_000))  # earlier HLC, arrives later
    assert view.resolve("collector") == a.address
    assert view.names_of(a.address) == ["collector"] and view.names_of(b.address) == []
    view.apply(wa.append(*NamesView.claim("collector"), 3_000))  # re-claim keeps the old time
    assert [addr for _, addr in view.claimants("collector")] == [a.address, b.address]
    view.apply(wa.append(*NamesView.release("collector"), 4_000))
    assert view.resolve("collector") == b.address
    view.apply(wb.append(*NamesView.release("collector"), 5_000))
    assert view.resolve("collector") is None and view.snapshot() == {}
    assert view.resolve("never") is None
    with pytest.raises(InvalidArgument):
        NamesView.claim("Bad_Name")


def test_names_equal_hlc_ties_to_smaller_author() -> None:
    a, b = sorted(IDS[:2], key=lambda i: i.public)
    view = NamesView()
    view.apply(FeedWriter(b, Head(), HLC()).append(*NamesView.claim("x"), 1_000))
    view.apply(FeedWriter(a, Head(), HLC()).append(*NamesView.claim("x"), 1_000))
    assert view.resolve("x") == a.address


garbage = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(),
        st.text(max_size=70),
        st.binary(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["k", "v", "n", "x"]), inner, max_size=3),
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(body=garbage, kind=st.sampled_from([KIND_MAX, KIND_CLAIM, KIND_RELEASE]))
def test_garbage_never_crashes(body: Any, kind: str) -> None:
    ev = FeedWriter(IDS[0], Head(), HLC()).append(kind, body, 1_000)
    for view in (MaxRegisterView(), NamesView()):
        before = view.digest()
        view.apply(ev)
        if sum(view.rejected.values()):
            assert view.digest() == before and view.applied == 0


@pytest.mark.parametrize(
    ("kind", "body", "code"),
    [
        (KIND_MAX, {"k": "a", "v": -1}, "malformed"),
        (KIND_MAX, {"k": "a", "v": True}, "malformed"),
        (KIND_MAX, {"k": "a", "v": 2**63}, "malformed"),
        (KIND_MAX, {"k": "a b", "v": 1}, "invalid_name"),
        (KIND_MAX, {"k": "a", "v": 1, "x": 0}, "malformed"),
        (KIND_CLAIM, {"n": "UPPER"}, "invalid_name"),
        (KIND_CLAIM, {"n": "-lead"}, "invalid_name"),
        (KIND_CLAIM, {"n": "a" * 64}, "invalid_name"),
        (KIND_RELEASE, ["n", "x"], "malformed"),
    ],
)
def test_invalid_bodies_are_counted_by_code(kind: str, body: Any, code: str) -> None:
    ev = FeedWriter(IDS[0], Head(), HLC()).append(kind, body, 1_000)
    view: Any = MaxRegisterView() if kind == KIND_MAX else NamesView()
    view.apply(ev)
    assert view.rejected == {code: 1}
    assert view.snapshot() == {}
