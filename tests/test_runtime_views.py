"""Runtime views over the journal: trust web and endpoints (pure, no I/O)."""

from __future__ import annotations

import itertools
import random

from hivemesh.core.event import Event, encode_event
from hivemesh.core.identity import Identity
from hivemesh.core.views.endpoints import KIND_HELLO, EndpointsView, hello_body
from hivemesh.core.views.trust import (
    KIND_TRUST_ADD,
    KIND_TRUST_REVOKE,
    VOUCH_POLICIES,
    TrustView,
)

IDS = [Identity.from_seed(bytes([i]) * 32) for i in range(1, 7)]
ME, A, B, C, D, E = (i.address for i in IDS)
_seq = itertools.count(1)


def ev(author: Identity, kind: str, body: object, hlc: int = 1) -> Event:
    return encode_event(author.public, next(_seq), b"\0" * 32, hlc, kind, body)


SA, SX = "a" * 32, "b" * 32  # two swarm ids


def add(author: Identity, target: str, swarm: str | None = SA) -> Event:
    body = {"address": target} if swarm is None else {"address": target, "swarm": swarm}
    return ev(author, KIND_TRUST_ADD, body)


def web_of(events: list[Event], order_seed: int | None = None) -> TrustView:
    v = TrustView()
    for e in (
        events if order_seed is None else random.Random(order_seed).sample(events, len(events))
    ):
        v.apply(e)
    return v


def test_web_of_trust_grows_within_a_swarm_and_revocations_win() -> None:
    events = [
        add(IDS[0], A),  # ME brings A into SA (ME invited A)
        add(IDS[1], B),  # A brings B
        add(IDS[2], C),  # B brings C
        add(IDS[5], D),  # E (not admitted) brings D
        ev(IDS[1], KIND_TRUST_REVOKE, {"address": C}),  # A revokes C
    ]
    for seed in (None, 1, 2, 3):
        web = web_of(events, seed).evaluate([A], [], ME, [SA])
        assert web.admitted == {A, B}  # C revoked by admitted A; D's voucher not admitted
        assert web.revoked == {C}
        assert web.swarms == {SA: {ME, A, B}}
    # a local revocation of A removes A and everything only A vouched for
    web = web_of(events).evaluate([A], [A], ME, [SA])
    assert web.admitted == frozenset() and A in web.revoked
    # a local trust wins over a member's revocation
    assert C in web_of(events).evaluate([A, C], [], ME, [SA]).admitted


def test_vouches_count_only_inside_swarms_we_are_in() -> None:
    """A is a bridge: in our swarm SA and in SX. Its vouches into SX (its
    inviter there, X1 = D) mean nothing to us; SX's members follow only SX."""
    events = [
        add(IDS[0], A, SA),
        add(IDS[1], ME, SA),  # A's vouch for its inviter, into SA
        add(IDS[1], B, SA),  # A invited B into SA
        add(IDS[1], D, SX),  # A joined SX through D
        add(IDS[4], A, SX),  # D admitted A into SX
        add(IDS[4], E, SX),  # ... and E
    ]
    web = web_of(events).evaluate([A], [], ME, [SA])
    assert web.admitted == {A, B}
    # D's view: in SX only, it admits A but not A's SA members (ME, B)
    d_web = web_of(events).evaluate([A], [], D, [SX])
    assert d_web.admitted == {A, E}
    assert d_web.swarms == {SX: {D, A, E}}
    # the bridge itself, in both, admits both, and keeps them apart
    a_web = web_of(events).evaluate([ME, D], [], A, [SA, SX])
    assert a_web.admitted == {ME, B, D, E}
    assert a_web.shares(B, ME) and a_web.shares(E, D)
    assert not a_web.shares(E, ME) and not a_web.shares(D, B)


def test_vouch_policies_bound_how_far_a_node_follows() -> None:
    chain = [add(IDS[0], A), add(IDS[1], B), add(IDS[2], C)]  # ME -> A -> B -> C
    v = web_of(chain)
    assert v.evaluate([A], [], ME, [SA], "web").admitted == {A, B, C}
    assert v.evaluate([A], [], ME, [SA], "direct").admitted == {A, B}
    assert v.evaluate([A], [], ME, [SA], "none").admitted == {A}
    assert set(VOUCH_POLICIES) == {"web", "direct", "none"}


def test_malformed_and_unscoped_trust_events_are_counted_not_applied() -> None:
    v = TrustView()
    v.apply(ev(IDS[1], KIND_TRUST_ADD, {"address": "hm-not-an-address", "swarm": SA}))
    v.apply(ev(IDS[1], KIND_TRUST_ADD, ["wrong shape"]))
    v.apply(add(IDS[1], B, "NOT-HEX"))
    v.apply(add(IDS[1], B, None))  # written before swarms: followed by nobody
    assert v.rejected == {"malformed": 3, "unscoped": 1}
    assert v.evaluate([A], [], ME, [SA]).admitted == {A}


def test_endpoints_latest_hello_wins_and_garbage_is_counted() -> None:
    v = EndpointsView()
    v.apply(ev(IDS[1], KIND_HELLO, hello_body(["10.0.0.1:1"]), hlc=5))
    v.apply(ev(IDS[1], KIND_HELLO, hello_body(["10.0.0.2:2"]), hlc=9))
    v.apply(ev(IDS[1], KIND_HELLO, hello_body(["10.0.0.3:3"]), hlc=7))  # older, late
    v.apply(ev(IDS[2], KIND_HELLO, {"listen": "not-a-list"}))
    v.apply(ev(IDS[2], KIND_HELLO, {"listen": ["x" * 1000]}))
    assert v.endpoints(A) == ["10.0.0.2:2"]
    assert v.endpoints(B) == []
    assert v.rejected["malformed"] == 2
    assert v.known() == {A: ["10.0.0.2:2"]}
