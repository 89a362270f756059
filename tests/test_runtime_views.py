"""Runtime views over the journal: trust web and endpoints (pure, no I/O)."""

from __future__ import annotations

import itertools
import random

from hivemesh.core.event import Event, encode_event
from hivemesh.core.identity import Identity
from hivemesh.runtime.endpoints import KIND_HELLO, EndpointsView, hello_body
from hivemesh.runtime.trustview import KIND_TRUST_ADD, KIND_TRUST_REVOKE, TrustView

IDS = [Identity.from_seed(bytes([i]) * 32) for i in range(1, 7)]
ME, A, B, C, D, E = (i.address for i in IDS)
_seq = itertools.count(1)


def ev(author: Identity, kind: str, body: object, hlc: int = 1) -> Event:
    return encode_event(author.public, next(_seq), b"\0" * 32, hlc, kind, body)


def test_web_of_trust_grows_from_local_trust_and_revocations_win() -> None:
    v = TrustView()
    events = [
        ev(IDS[1], KIND_TRUST_ADD, {"address": B}),  # A vouches B
        ev(IDS[2], KIND_TRUST_ADD, {"address": C}),  # B vouches C
        ev(IDS[4], KIND_TRUST_ADD, {"address": D}),  # E (not admitted) vouches D
        ev(IDS[1], KIND_TRUST_REVOKE, {"address": C}),  # A revokes C
    ]
    for order in (events, list(reversed(events)), random.Random(3).sample(events, 4)):
        v = TrustView()
        for e in order:
            v.apply(e)
        admitted, revoked = v.evaluate([A], [], ME)
        assert admitted == {A, B}  # C revoked by admitted A; D's voucher not admitted
        assert revoked == {C}
    # a local revocation of A removes A and everything only A vouched for
    admitted, revoked = v.evaluate([A], [A], ME)
    assert admitted == frozenset() and A in revoked


def test_malformed_trust_events_are_counted_not_applied() -> None:
    v = TrustView()
    v.apply(ev(IDS[1], KIND_TRUST_ADD, {"address": "hm-not-an-address"}))
    v.apply(ev(IDS[1], KIND_TRUST_ADD, ["wrong shape"]))
    assert v.rejected["malformed"] == 2
    assert v.evaluate([A], [], ME)[0] == {A}


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
