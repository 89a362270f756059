"""The batch fast path (core.event.decode_chain) agrees with the precise path.

:func:`hivemesh.core.feed.verify_batch` first tries one fused loop (decode,
same author, contiguous, chained); when anything is off it falls back to
decoding event by event, which raises the exact error. These tests run
both on valid and damaged batches and require the same outcome: the same
events, or the same error class and message.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh import errors
from hivemesh.core import feed as feed_mod
from hivemesh.core.codec import pack
from hivemesh.core.event import Event, decode_chain
from hivemesh.core.feed import FeedWriter, Head, verify_batch
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity

ALICE = Identity.from_seed(b"a" * 32)
BOB = Identity.from_seed(b"b" * 32)


def _batch(n: int, who: Identity = ALICE, big: int = 0) -> tuple[list[Event], bytes]:
    w = FeedWriter(who, Head(), HLC())
    for i in range(n):
        w.append("app.note", {"i": i, "pad": "x" * big}, 1000 + i)
    sealed = w.seal()
    assert sealed is not None
    return sealed


def _outcome(
    monkeypatch: pytest.MonkeyPatch, fast: bool, raws: list[Any], sig: bytes, **kw: Any
) -> Any:
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(feed_mod, "decode_chain", lambda *a, **k: None)
        try:
            events = verify_batch(ALICE.public, raws, sig, **kw)
        except errors.HivemeshError as exc:
            return (type(exc), str(exc))
        return [(e.id, e.seq, e.hlc, e.kind, e.body) for e in events]


def _same(monkeypatch: pytest.MonkeyPatch, raws: list[Any], sig: bytes, **kw: Any) -> Any:
    kw.setdefault("head", Head())
    fast = _outcome(monkeypatch, True, raws, sig, **kw)
    slow = _outcome(monkeypatch, False, raws, sig, **kw)
    assert fast == slow
    return fast


def test_valid_batch_takes_the_fast_path_and_matches() -> None:
    events, _sig = _batch(50)
    got = decode_chain(ALICE.public, [e.raw for e in events])
    assert got is not None
    assert [e.id for e in got] == [e.id for e in events]
    assert [(e.seq, e.prev, e.hlc, e.kind, e.body) for e in got] == [
        (e.seq, e.prev, e.hlc, e.kind, e.body) for e in events
    ]


def test_valid_batch_same_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    events, sig = _batch(20)
    raws = [e.raw for e in events]
    out = _same(monkeypatch, raws, sig)
    assert isinstance(out, list) and len(out) == 20
    # overlapping with what we hold, and wholly held (replay)
    head = Head(events[9].seq, events[9].id)
    assert len(_same(monkeypatch, raws, sig, head=head, known=[e.id for e in events[:10]])) == 10
    head = Head(events[-1].seq, events[-1].id)
    assert _same(monkeypatch, raws, sig, head=head)[0] is errors.ReplayError


def test_damaged_batches_same_error(monkeypatch: pytest.MonkeyPatch) -> None:
    events, sig = _batch(12)
    raws = [e.raw for e in events]
    other, _ = _batch(12, BOB)
    bad_sig = bytes(64)
    cases: list[tuple[list[Any], bytes, dict[str, Any]]] = [
        (raws, bad_sig, {}),  # signature
        (raws[:5] + raws[6:], sig, {}),  # a dropped event
        ([*raws[:5], raws[6], raws[5], *raws[7:]], sig, {}),  # reordered
        ([*raws[:5], other[5].raw, *raws[6:]], sig, {}),  # another author's event
        (raws[3:], sig, {}),  # a gap before the batch
        (raws, sig, {"max_hlc": events[5].hlc - 1}),  # clock bound
        ([*raws[:4], b"\x93\x01\x02\x03", *raws[5:]], sig, {}),  # not an event
        ([*raws[:4], bytearray(raws[4]), *raws[5:]], sig, {}),  # not bytes
        ([*raws[:4], raws[4] + b"\x00", *raws[5:]], sig, {}),  # trailing byte
    ]
    # each mutation on the first event (checked field by field) and on a
    # later one (checked through the chain: prev, seq)
    for at in (0, 4):
        v, a, s, p, h, k, b = msgpack.unpackb(raws[at])
        for mutated in (
            [2, a, s, p, h, k, b],  # version
            [v, a, s, p[:31], h, k, b],  # short prev
            [v, a, s, p + b"\x00", h, k, b],  # long prev
            [v, a, True, p, h, k, b],  # bool seq
            [v, a, float(s), p, h, k, b],  # float seq
            [v, a, 0, p, h, k, b],  # seq 0
            [v, a.hex(), s, p, h, k, b],  # author as a string
            [v, BOB.public, s, p, h, k, b],  # another author
            [v, a, s, p, float(h), k, b],  # float hlc
            [v, a, s, p, -1, k, b],  # negative hlc
            [v, a, s, p, h, "", b],  # empty kind
            [v, a, s, p, h, "k" * 65, b],  # long kind
            [v, a, s, p, h, k.encode(), b],  # kind as bytes
            [v, a, s, p, h, k],  # six fields
        ):
            cases.append(([*raws[:at], pack(mutated), *raws[at + 1 :]], sig, {}))
    for case_raws, case_sig, kw in cases:
        out = _same(monkeypatch, case_raws, case_sig, **kw)
        assert not isinstance(out, list), out


def test_large_events_take_the_precise_path(monkeypatch: pytest.MonkeyPatch) -> None:
    events, sig = _batch(3, big=70_000)
    raws = [e.raw for e in events]
    assert decode_chain(ALICE.public, raws) is None
    assert len(_same(monkeypatch, raws, sig)) == 3


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10**9), st.integers(1, 8))
def test_random_byte_damage_same_outcome(seed: int, flips: int) -> None:
    rng = random.Random(seed)
    events, sig = _batch(6)
    raws = [bytearray(e.raw) for e in events]
    for _ in range(flips):
        r = raws[rng.randrange(len(raws))]
        r[rng.randrange(len(r))] ^= 1 << rng.randrange(8)
    damaged = [bytes(r) for r in raws]
    with pytest.MonkeyPatch.context() as mp:
        out = _same(mp, damaged, sig)
    assert isinstance(out, tuple)  # any change of a signed byte is refused
