"""Blob index view and the sans-IO blob fetcher over a fake network."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hivemesh.core.codec import MAX_FRAME_BYTES, pack, unpack
from hivemesh.core.event import Event
from hivemesh.core.feed import FeedWriter, Head
from hivemesh.core.hlc import HLC
from hivemesh.core.identity import Identity
from hivemesh.core.views.base import View
from hivemesh.core.views.blobs import (
    CHUNK_BYTES,
    KIND_PUT,
    TAG_GET,
    TAG_WANT,
    BlobFetcher,
    BlobIndex,
    blob_digest,
    parse_frame,
    serve,
)
from hivemesh.errors import DecodeError, InvalidArgument

IDS = [Identity.from_seed(bytes([i]) * 32) for i in range(1, 5)]
CHUNK = 1024

Server = Callable[[list[Any]], list[Any] | None]


def honest(store: dict[bytes, bytes], chunk: int = CHUNK) -> Server:
    return lambda frame: serve(frame, store.get, chunk)


def liar(store: dict[bytes, bytes], chunk: int = CHUNK) -> Server:
    """Claims every blob it is asked about, serves same-size garbage."""

    def answer(frame: list[Any]) -> list[Any] | None:
        real = next(iter(store.values()))
        fake = {frame[1]: bytes(b ^ 0x55 for b in real)}
        return serve(frame, fake.get, chunk)

    return answer


def silent(frame: list[Any]) -> list[Any] | None:
    return None


def run(
    fetcher: BlobFetcher, servers: dict[str, Server], now: int = 0, max_steps: int = 10_000
) -> int:
    """Pump frames through a lossless in-memory link until nothing is active."""
    for _ in range(max_steps):
        assert fetcher.inflight() <= fetcher.max_inflight
        out = fetcher.outbox()
        if not out:
            if not fetcher.active():
                return now
            deadline = fetcher.next_deadline()
            assert deadline is not None, "active fetch with no timer would hang"
            now = max(now, deadline)
            fetcher.handle_timer(now)
            continue
        for peer, frame in out:
            frame = unpack(pack(frame))  # must survive the wire
            targets = sorted(servers) if peer is None else [peer]
            for t in targets:
                reply = servers[t](frame) if t in servers else None
                if reply is not None:
                    assert len(pack(reply)) <= MAX_FRAME_BYTES
                    fetcher.receive(t, unpack(pack(reply)), now)
    raise AssertionError("fetch did not settle")


def test_fetch_from_announced_holder_in_chunks() -> None:
    data = random.Random(1).randbytes(10 * CHUNK + 17)
    h = blob_digest(data)
    f = BlobFetcher(random.Random(0), chunk_bytes=CHUNK, window=3, max_inflight=3)
    assert f.want(h, 0, sources=["hmA"])
    run(f, {"hmA": honest({h: data})})
    assert f.completed() == [(h, data)] and f.failed() == [] and not f.rejected


@pytest.mark.parametrize("size", [0, 1, CHUNK, CHUNK + 1])
def test_edge_sizes(size: int) -> None:
    data = b"z" * size
    h = blob_digest(data)
    f = BlobFetcher(random.Random(0), chunk_bytes=CHUNK)
    f.want(h, 0)  # no known source: broadcast want
    run(f, {"a": honest({}), "b": honest({h: data})})
    assert f.completed() == [(h, data)]


def test_default_chunking_of_a_multi_mib_blob() -> None:
    data = random.Random(2).randbytes(3 * CHUNK_BYTES + 5)
    h = blob_digest(data)
    f = BlobFetcher(random.Random(0))
    f.want(h, 0, sources=["a"])
    gets = [fr for _, fr in f.outbox()]
    assert [g[2] for g in gets] == [0]  # size unknown: only chunk 0 first
    f.receive("a", serve(gets[0], {h: data}.get), 1)
    assert sorted(fr[2] for _, fr in f.outbox()) == [1, 2, 3]
    run(f, {"a": honest({h: data}, CHUNK_BYTES)}, now=1)  # re-sends after the timeout
    assert f.completed() == [(h, data)]


def test_liar_is_detected_and_another_holder_used() -> None:
    data = random.Random(3).randbytes(4 * CHUNK)
    h = blob_digest(data)
    for seed in range(8):
        f = BlobFetcher(random.Random(seed), chunk_bytes=CHUNK)
        f.want(h, 0, sources=["bad", "silent", "good"])
        run(f, {"bad": liar({h: data}), "silent": silent, "good": honest({h: data})})
        assert f.completed() == [(h, data)]
        assert f.failed() == []


def test_gives_up_when_nobody_holds_it() -> None:
    h = blob_digest(b"missing")
    f = BlobFetcher(random.Random(0), chunk_bytes=CHUNK, search_ms=1_000)
    f.want(h, 0, sources=["a"])
    end = run(f, {"a": honest({}), "b": silent, "c": liar({h: b"x" * 7})})
    assert f.completed() == [] and f.failed() == [h]
    assert f.rejected["blob_mismatch"] == 1 and end >= 1_000


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 6 * CHUNK),
    kinds=st.lists(st.sampled_from(["honest", "liar", "silent", "empty"]), min_size=1, max_size=5),
    seed=st.integers(0, 2**32),
    window=st.integers(1, 4),
    inflight=st.integers(1, 6),
)
def test_never_accepts_wrong_bytes(
    size: int, kinds: list[str], seed: int, window: int, inflight: int
) -> None:
    data = random.Random(seed).randbytes(size)
    h = blob_digest(data)
    servers: dict[str, Server] = {}
    for i, k in enumerate(kinds):
        servers[f"p{i}"] = {
            "honest": honest({h: data}),
            "liar": liar({h: data + b"!"}),
            "silent": silent,
            "empty": honest({}),
        }[k]
    f = BlobFetcher(random.Random(seed), chunk_bytes=CHUNK, window=window, max_inflight=inflight)
    f.want(h, 0, sources=sorted(servers))
    run(f, servers)
    done = f.completed()
    if "honest" in kinds:
        assert done == [(h, data)]
    else:
        assert done == [] and f.failed() == [h]


def test_backpressure_and_inflight_bound() -> None:
    f = BlobFetcher(random.Random(0), chunk_bytes=CHUNK, max_wants=2, max_inflight=3)
    assert f.want(b"\x01" * 32, 0, sources=["a"])
    assert f.want(b"\x02" * 32, 0, sources=["a"])
    assert not f.want(b"\x03" * 32, 0, sources=["a"])
    assert f.want(b"\x01" * 32, 0, sources=["b"])  # existing want: fine
    assert f.inflight() <= 3
    f.cancel(b"\x01" * 32)
    assert f.active() == [b"\x02" * 32]
    with pytest.raises(InvalidArgument):
        f.want(b"short", 0)


frames = st.one_of(
    st.lists(
        st.one_of(
            st.sampled_from([10, 11, 12, 13, 14, 15, -1]),
            st.binary(min_size=0, max_size=40),
            st.integers(-5, 2**64 - 1),
            st.none(),
        ),
        max_size=6,
    ),
    st.integers(),
    st.text(max_size=5),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(frame=frames)
def test_garbage_frames_never_crash(frame: Any) -> None:
    data = b"q" * 3000
    h = blob_digest(data)
    f = BlobFetcher(random.Random(0), chunk_bytes=CHUNK)
    f.want(h, 0, sources=["a"])
    f.outbox()
    f.receive("a", frame, 1)
    if isinstance(frame, list) and len(frame) > 1 and isinstance(frame[1], bytes):
        frame = [frame[0], h, *frame[2:]]
        f.receive("a", frame, 2)
    with contextlib.suppress(DecodeError):
        serve(frame, {h: data}.get, CHUNK)
    # Still able to finish with an honest peer.
    f.add_source(h, "good", 3)
    run(f, {"a": silent, "good": honest({h: data})}, now=3)
    assert f.completed() == [(h, data)]


def test_parse_frame_rejects_bad_shapes() -> None:
    h = b"\x00" * 32
    assert parse_frame([TAG_WANT, h]) == (TAG_WANT, h)
    assert parse_frame([TAG_GET, h, 3]) == (TAG_GET, h, 3)
    for bad in ([], [TAG_WANT], [TAG_WANT, b"x"], [TAG_GET, h, -1], [11, h, 0, 1, 5], ["x", h]):
        with pytest.raises(DecodeError):
            parse_frame(bad)


# -- the index ------------------------------------------------------------------------


def _events(script: list[tuple[int, int, str | None, int]]) -> list[list[Event]]:
    writers = [FeedWriter(i, Head(), HLC()) for i in IDS]
    feeds: list[list[Event]] = [[] for _ in IDS]
    now = [1_000] * len(IDS)
    for who, blob, name, step in script:
        now[who] += step
        kind, body = BlobIndex.encode_put(bytes([blob]) * (blob + 1), "image/png", name)
        feeds[who].append(writers[who].append(kind, body, now[who]))
    return feeds


@settings(max_examples=100, deadline=None)
@given(
    script=st.lists(
        st.tuples(
            st.integers(0, 3),
            st.integers(0, 3),
            st.one_of(st.none(), st.sampled_from(["shot", "dom"])),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=20,
    ),
    seed=st.integers(0, 2**32),
)
def test_index_order_independent(script: Any, seed: int) -> None:
    feeds = _events(script)
    rng = random.Random(seed)
    ref = BlobIndex()
    for f in feeds:
        for ev in f:
            ref.apply(ev)
    pos = [0] * len(feeds)
    view = BlobIndex()
    while any(pos[i] < len(f) for i, f in enumerate(feeds)):
        i = rng.choice([i for i, f in enumerate(feeds) if pos[i] < len(f)])
        view.apply(feeds[i][pos[i]])
        pos[i] += 1
    assert view.snapshot() == ref.snapshot() and view.digest() == ref.digest()


def test_index_info_holders_names() -> None:
    a, b = FeedWriter(IDS[0], Head(), HLC()), FeedWriter(IDS[1], Head(), HLC())
    idx = BlobIndex()
    assert isinstance(idx, View)
    data = b"png bytes"
    kind, body = BlobIndex.encode_put(data, "image/png", "shot")
    assert kind == KIND_PUT and data not in pack(body)  # bytes never in the event
    idx.apply(a.append(kind, body, 1_000))
    idx.apply(b.append(kind, body, 2_000))
    info = idx.info(blob_digest(data))
    assert info is not None and info.size == len(data) and info.mime == "image/png"
    assert info.holders == tuple(sorted([IDS[0].address, IDS[1].address]))
    assert idx.by_name("shot") == blob_digest(data)
    other = BlobIndex.encode_put(b"newer", "image/png", "shot")[1]
    idx.apply(a.append(KIND_PUT, other, 3_000))
    assert idx.by_name("shot") == blob_digest(b"newer")
    assert idx.info(b"\x00" * 32) is None and idx.holders(b"\x00" * 32) == []
    with pytest.raises(InvalidArgument):
        BlobIndex.encode_put(b"x", "not a mime")


@settings(max_examples=200, deadline=None)
@given(
    body=st.one_of(
        st.dictionaries(
            st.sampled_from(["h", "n", "m", "name", "x"]),
            st.one_of(st.binary(max_size=33), st.integers(-1, 2**40), st.text(max_size=9)),
        ),
        st.lists(st.integers(0, 3)),
        st.none(),
    )
)
def test_index_garbage_never_crashes(body: Any) -> None:
    idx = BlobIndex()
    before = idx.digest()
    idx.apply(FeedWriter(IDS[0], Head(), HLC()).append(KIND_PUT, body, 1_000))
    if idx.rejected:
        assert idx.digest() == before


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), loss=st.sampled_from([0.1, 0.3, 0.5]))
def test_lossy_link_still_completes(seed: int, loss: float) -> None:
    data = random.Random(seed).randbytes(5 * CHUNK + 3)
    h = blob_digest(data)
    net = random.Random(f"{seed}/net")

    def lossy(inner: Server) -> Server:
        return lambda frame: None if net.random() < loss else inner(frame)

    f = BlobFetcher(random.Random(seed), chunk_bytes=CHUNK, max_strikes=1_000)
    f.want(h, 0, sources=["a", "b"])
    run(f, {"a": lossy(honest({h: data})), "b": lossy(honest({h: data}))})
    assert f.completed() == [(h, data)]


def test_size_poisoning_holder_cannot_block_an_honest_one() -> None:
    data = random.Random(9).randbytes(3 * CHUNK)
    h = blob_digest(data)
    f = BlobFetcher(random.Random(0), chunk_bytes=CHUNK, window=1, max_inflight=1)
    f.want(h, 0, sources=["poison"])
    ((peer, get0),) = f.outbox()
    assert peer == "poison" and get0 == [TAG_GET, h, 0]
    # Claims the blob is 5 chunks long, sends a plausible chunk 0, then goes silent.
    f.receive("poison", [11, h, 0, 5 * CHUNK, b"\x00" * CHUNK], 1)
    f.add_source(h, "good", 2)
    run(f, {"poison": silent, "good": honest({h: data})}, now=2)
    assert f.completed() == [(h, data)]


def test_mixed_holders_mismatch_restarts_instead_of_blaming_all() -> None:
    data = random.Random(10).randbytes(3 * CHUNK)
    h = blob_digest(data)
    f = BlobFetcher(random.Random(0), chunk_bytes=CHUNK, window=1, max_inflight=1)
    f.want(h, 0, sources=["liar"])
    f.outbox()
    # Right size, wrong bytes for chunk 0; then the liar goes silent.
    f.receive("liar", [11, h, 0, len(data), b"\xff" * CHUNK], 1)
    f.add_source(h, "good", 2)
    run(f, {"liar": silent, "good": honest({h: data})}, now=2)
    assert f.completed() == [(h, data)]
    assert f.rejected["blob_mismatch"] == 1


def test_downloads_are_bounded_and_queued() -> None:
    blobs = [random.Random(i).randbytes(2 * CHUNK) for i in range(6)]
    store = {blob_digest(b): b for b in blobs}
    f = BlobFetcher(random.Random(0), chunk_bytes=CHUNK, max_downloads=2)
    for h in store:
        assert f.want(h, 0, sources=["a"])
    asked = {fr[1] for _, fr in f.outbox()}
    assert len(asked) == 2  # two downloads at a time, four queued
    f2 = BlobFetcher(random.Random(0), chunk_bytes=CHUNK, max_downloads=2)
    for h in store:
        f2.want(h, 0, sources=["a"])
    run(f2, {"a": honest(store)})
    assert sorted(f2.completed()) == sorted(store.items())


def test_oversize_blob_claims_are_rejected() -> None:
    h = blob_digest(b"x")
    f = BlobFetcher(random.Random(0), chunk_bytes=CHUNK)
    f.want(h, 0, sources=["a"])
    f.outbox()
    f.receive("a", [11, h, 0, 64 * 1024 * 1024 + 1, b"x"], 1)
    assert f.rejected == {"oversize": 1}
    f.add_source(h, "b", 2)
    run(f, {"a": silent, "b": honest({h: b"x"})}, now=2)
    assert f.completed() == [(h, b"x")]
